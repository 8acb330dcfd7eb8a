"""What a platform module declares: how its launchers tell a task who it is, how its allocation is read,
the launcher that starts a step of ranks in it, and which scheduler backend renders and submits its jobs.

Standard library only (and :mod:`hpcdl.errors`): discovery reads these on every rank at ``init``.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional, Protocol

from hpcdl.errors import LaunchError

WALK_LENGTH = 16  # ports in a sequence rank 0 of a rendezvous binds the first free one of


@dataclass(frozen=True)
class TaskVariables:
    """How one launcher tells a process it started who it is. ``precedence``: discovery reads launchers in
    rising precedence, so that a launcher whose tasks may run inside another's (mpirun inside a Slurm job)
    is read before it."""

    launcher: str  # as discovery names it, e.g. "Slurm srun"
    rank: str
    size: str
    local_rank: Optional[str] = None
    local_size: Optional[str] = None
    precedence: int = 50
    mpi_family: str = ""  # the MPI ("Open MPI", "MPICH") whose library its ranks can meet through


@dataclass(frozen=True)
class Found:
    """An allocation as its scheduler leaves it in the job's environment: host names in order, and how many
    ranks each may run where the scheduler says it (None: it does not)."""

    source: str  # the variable or command the hosts came from
    names: list[str]
    counts: Optional[list[int]] = None


class Placed(Protocol):
    """A host and the ranks placed on it (``hpcdl.runner.hosts.HostSlots``)."""

    @property
    def name(self) -> str: ...

    @property
    def slots(self) -> int: ...


def block_shape(placed: Sequence[Placed]) -> Optional[int]:
    """Ranks per host when a block launcher (``-N``/``--ppn`` per host) reproduces `placed`: every host
    full but possibly the last; None otherwise."""
    per_host = placed[0].slots
    if all(h.slots == per_host for h in placed[:-1]) and placed[-1].slots <= per_host:
        return per_host
    return None


def ranks_and_shape(placed: Sequence[Placed]) -> tuple[int, Optional[int]]:
    """The number of ranks, and how many per host a block launcher needs (see block_shape)."""
    return sum(h.slots for h in placed), block_shape(placed)


@dataclass(frozen=True)
class TaskIdentity:
    """How a task of a step finds its place: the variable naming its host (None: its host name) and the
    one giving its index among the tasks of that host (None: global rank modulo ranks per host)."""

    host_variable: Optional[str]
    local_variable: Optional[str]
    rank_variable: str


class NativeLauncher(ABC):
    """A scheduler's own launcher: the argv that starts a step of the job's ranks, and where it can, the argv
    that starts one task on a given host."""

    name: ClassVar[str]
    program: ClassVar[str]
    identity: ClassVar[TaskIdentity]
    # The launcher copies its stdin to every task: the agents then take signals and notice the launcher's
    # end through it, as the rank agent does over ssh.
    broadcasts_stdin: ClassVar[bool] = False
    # It runs the tasks from a service node that is not one of the compute hosts (aprun, jsrun).
    from_service_node: ClassVar[bool] = False

    def __init__(self, environ: Mapping[str, str], extra_args: tuple[str, ...] = ()) -> None:
        self.environ = environ
        self.extra_args = list(extra_args)

    @abstractmethod
    def step_argv(self, placed: Sequence[Placed]) -> Optional[list[str]]:
        """The launcher's argv for one step running the ranks as `placed` (the task command follows), or None
        where it starts one task per call only."""

    def worker_argv(self, host: str) -> Optional[list[str]]:
        """The argv that starts one task on `host` (the command follows), None if it cannot."""
        return None

    def expresses(self, placed: Sequence[Placed]) -> bool:
        """Whether a step of this launcher reproduces `placed` (default: the same number of ranks on every
        host, the last one possibly fewer, as ``--ppn``-style options place them)."""
        return block_shape(placed) is not None

    def check_placement(self, placed: Sequence[Placed]) -> None:
        """Refuse placements this launcher cannot reproduce."""
        if not self.expresses(placed):
            listing = ",".join(f"{h.name}:{h.slots}" for h in placed)
            raise LaunchError(
                f"--launcher {self.name} cannot place the ranks as {listing} (it puts the same number on "
                "every host, the last one possibly fewer); choose -np to fill the hosts evenly, set "
                "--slots-per-host, or use --launcher ssh"
            )

    def describe(self) -> str:
        return self.program


def on_path(*programs: str) -> str:
    """The first of `programs` on PATH, or 'ssh' when none is."""
    return next((name for name in programs if shutil.which(name)), "ssh")


def read_nodefile(variable: str, environ: Mapping[str, str]) -> list[str]:
    """The host names of a node file (one line per slot) named by `variable`."""
    path = Path(environ[variable])
    try:
        lines = path.read_text().split()
    except OSError as exc:
        raise LaunchError(f"{variable}={path} cannot be read: {exc.strerror}") from None
    if not lines:
        raise LaunchError(f"{variable}={path} lists no hosts")
    return lines


@dataclass(frozen=True)
class Platform:
    """Everything hpcdl knows about one platform, declared by its module in :mod:`hpcdl.platforms`.

    ``name`` is the scheduler's name everywhere (``--scheduler``, site files, ``templates/batch/NAME.sh.j2``)
    and ``title`` its name in messages. A platform without ``scheduler`` is a launcher only (mpirun,
    torchrun)."""

    name: str
    title: str
    tasks: tuple[TaskVariables, ...] = ()
    job_id_variables: tuple[str, ...] = ()  # naming the job a rank belongs to (a batch job's: its id)
    # Further variables telling one job (step) from another, for ranks that meet on ports derived alike.
    job_tag_variables: tuple[str, ...] = ()
    allocation: Optional[Callable[[Mapping[str, str]], Optional[Found]]] = None
    launchers: tuple[type[NativeLauncher], ...] = ()
    # The native launcher's name inside this platform's allocation ('ssh' where none is on PATH).
    native_launcher: Callable[[], str] = lambda: "ssh"
    # Where ranks of a launcher of this platform meet without being told (addr, ports, origin), or None.
    meeting_point: Optional[Callable[[Mapping[str, str]], Optional[tuple[str, tuple[int, ...], str]]]] = None
    scheduler: str = ""  # "module:Class" of its hpcdl.schedulers backend
    submit_program: str = ""  # what scheduler detection looks for, in messages
    detect_priority: int = 50  # scheduler detection tries lower first
