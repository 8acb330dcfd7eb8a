"""Which program starts the ranks: ``hpcdl run --launcher``
(ssh, srun, flux, mpiexec, aprun, jsrun, blaunch, local, auto).

Inside a batch allocation the ranks start with the allocation's own launcher, so that they run inside the
job (its cgroup, CPU and GPU binding, accounting; killed with it) and no ssh to compute nodes is needed:
``srun`` (Slurm), ``flux run`` (Flux), the Cray PALS ``mpiexec`` (PBS), ``aprun`` (Cobalt / ALPS), ``jsrun``
or ``blaunch`` (LSF). A *step* launcher starts all ranks as one parallel step, each task running
``hpcdl.runner.step_agent``, which finds its rank from the host it landed on and its index there. Where a
launcher can also start one task on a named host (srun, flux, PALS mpiexec, blaunch), elastic workers use
that form, one worker at a time, each behind the rank agent. ``ssh`` stays for plain host lists and as an
explicit choice; ``local`` runs every rank here.

The command lines follow each tool's documentation: srun(1) (Slurm 22.05), flux-run(1), HPE PALS
``mpiexec``, aprun(1), jsrun(1) and blaunch(1) of IBM Spectrum LSF.
"""

from __future__ import annotations

import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from hpcdl.runner.allocation import Allocation
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import HostSlots, RankSlot
from hpcdl.runner.mpi import version_output

LAUNCHER_CHOICES = ("auto", "local", "ssh", "srun", "flux", "mpiexec", "aprun", "jsrun", "blaunch")


def placement(slots: list[RankSlot]) -> list[HostSlots]:
    """Hosts in rank order with how many ranks each runs (ranks of a host are consecutive)."""
    counts: dict[str, int] = {}
    for slot in slots:
        counts[slot.host] = counts.get(slot.host, 0) + 1
    return [HostSlots(host, count) for host, count in counts.items()]


def _ranks(placed: list[HostSlots]) -> tuple[int, int | None]:
    """The number of ranks, and how many per host a block launcher needs (see _block_shape)."""
    return sum(h.slots for h in placed), _block_shape(placed)


def _block_shape(placed: list[HostSlots]) -> int | None:
    """Ranks per host when a block launcher (``-N``/``--ppn`` per host) reproduces `placed`: every host
    full but possibly the last; None otherwise."""
    per_host = placed[0].slots
    if all(h.slots == per_host for h in placed[:-1]) and placed[-1].slots <= per_host:
        return per_host
    return None


@dataclass(frozen=True)
class TaskIdentity:
    """How a task of a step finds its place: the variable naming its host (None: its host name) and the
    one giving its index among the tasks of that host (None: global rank modulo ranks per host)."""

    host_variable: str | None
    local_variable: str | None
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

    def __init__(self, environ: Mapping[str, str], extra_args: tuple[str, ...] = ()) -> None:
        self.environ = environ
        self.extra_args = list(extra_args)

    @abstractmethod
    def step_argv(self, placed: list[HostSlots]) -> list[str] | None:
        """The launcher's argv for one step running the ranks as `placed` (the task command follows), or None
        where it starts one task per call only."""

    def worker_argv(self, host: str) -> list[str] | None:
        """The argv that starts one task on `host` (the command follows), None if it cannot."""
        return None

    def expresses(self, placed: list[HostSlots]) -> bool:
        """Whether a step of this launcher reproduces `placed` (default: the same number of ranks on every
        host, the last one possibly fewer, as ``--ppn``-style options place them)."""
        return _block_shape(placed) is not None

    def check_placement(self, placed: list[HostSlots]) -> None:
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


class Srun(NativeLauncher):
    """Slurm. One step with the exact placement (``--distribution=arbitrary``: the node list names the host of
    each task in rank order, so SLURM_PROCID equals the rank), ``--kill-on-bad-exit`` (a failing rank ends the
    step), stdin copied to every task, this environment exported, ``--overlap`` when already inside a step
    (else it would wait for that step's resources), and the allocation's ``--cpus-per-task`` (srun 22.05 no
    longer reads SLURM_CPUS_PER_TASK)."""

    name = "srun"
    program = "srun"
    identity = TaskIdentity("SLURMD_NODENAME", "SLURM_LOCALID", "SLURM_PROCID")
    broadcasts_stdin = True

    def _common(self) -> list[str]:
        # --export=ALL: a job submitted with --export=NONE leaves SLURM_EXPORT_ENV=NONE for its steps, whose
        # tasks would then lack the job's secret, rendezvous and PATH.
        argv = ["--kill-on-bad-exit=1", "--input=all", "--export=ALL"]
        if self.environ.get("SLURM_CPUS_PER_TASK"):
            argv.append(f"--cpus-per-task={self.environ['SLURM_CPUS_PER_TASK']}")
        if self.environ.get("SLURM_STEP_ID") is not None:
            argv.append("--overlap")
        return argv

    def step_argv(self, placed: list[HostSlots]) -> list[str]:
        ranks = sum(h.slots for h in placed)
        per_rank = ",".join(h.name for h in placed for _ in range(h.slots))
        return [
            "srun",
            f"--nodes={len(placed)}",
            f"--ntasks={ranks}",
            "--distribution=arbitrary",
            f"--nodelist={per_rank}",
            *self._common(),
            *self.extra_args,
        ]

    def worker_argv(self, host: str) -> list[str]:
        # --overlap: workers come and go one step each; a new one must not wait for its predecessors' CPUs or
        # memory (steps of a job may otherwise hold all of a node's memory).
        argv = ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}", *self._common()]
        if "--overlap" not in argv:
            argv.append("--overlap")
        return [*argv, *self.extra_args]

    def expresses(self, placed: list[HostSlots]) -> bool:
        return True  # arbitrary distribution expresses any placement


class FluxRun(NativeLauncher):
    """Flux: ``flux run`` with the hosts as a constraint (``--requires=hosts:``), tasks block-mapped by the
    job shell, stdin copied to every task (``--input`` with the idset of all task ranks)."""

    name = "flux"
    program = "flux"
    identity = TaskIdentity(None, "FLUX_TASK_LOCAL_ID", "FLUX_TASK_RANK")
    broadcasts_stdin = True

    def step_argv(self, placed: list[HostSlots]) -> list[str]:
        ranks, per_host = _ranks(placed)
        argv = ["flux", "run", f"--nodes={len(placed)}"]
        if per_host is not None and per_host * len(placed) == ranks:
            argv.append(f"--tasks-per-node={per_host}")
        else:
            argv.append(f"--ntasks={ranks}")
        hosts = ",".join(h.name for h in placed)
        inputs = "0" if ranks == 1 else f"0-{ranks - 1}"
        return [*argv, f"--requires=hosts:{hosts}", f"--input={inputs}", *self.extra_args]

    def worker_argv(self, host: str) -> list[str]:
        return [
            "flux",
            "run",
            "--nodes=1",
            "--ntasks=1",
            f"--requires=hosts:{host}",
            "--input=0",
            *self.extra_args,
        ]

    def expresses(self, placed: list[HostSlots]) -> bool:
        # Without --tasks-per-node the job shell spreads tasks as evenly as it can: 3 on 2 nodes is 2 + 1.
        ranks, nodes = sum(h.slots for h in placed), len(placed)
        even = [ranks // nodes + (1 if index < ranks % nodes else 0) for index in range(nodes)]
        return [h.slots for h in placed] == even


class PalsMpiexec(NativeLauncher):
    """HPE Cray PALS (PBS on Cray EX, e.g. ALCF Polaris): ``mpiexec -n N --ppn S --hosts h1,h2``."""

    name = "mpiexec"
    program = "mpiexec"
    identity = TaskIdentity(None, "PALS_LOCAL_RANKID", "PALS_RANKID")

    def step_argv(self, placed: list[HostSlots]) -> list[str]:
        ranks, per_host = _ranks(placed)
        hosts = ",".join(h.name for h in placed)
        return ["mpiexec", "-n", str(ranks), "--ppn", str(per_host), "--hosts", hosts, *self.extra_args]

    def worker_argv(self, host: str) -> list[str]:
        return ["mpiexec", "-n", "1", "--ppn", "1", "--hosts", host, *self.extra_args]


class Aprun(NativeLauncher):
    """Cray ALPS (Cobalt on Cray XC, e.g. ALCF Theta): ``aprun -n N -N S -L nidlist``. ALPS runs one
    application per node at a time, so it has no one-task form beside a running job."""

    name = "aprun"
    program = "aprun"
    identity = TaskIdentity(None, None, "ALPS_APP_PE")

    def step_argv(self, placed: list[HostSlots]) -> list[str]:
        ranks, per_host = _ranks(placed)
        nids = []
        for host in placed:
            number = host.name[3:] if host.name.startswith("nid") else host.name
            if not number.isdigit():
                raise LaunchError(f"--launcher aprun: host '{host.name}' is not a Cray node id (nidNNNNN)")
            nids.append(str(int(number)))
        return ["aprun", "-n", str(ranks), "-N", str(per_host), "-L", ",".join(nids), *self.extra_args]


class Jsrun(NativeLauncher):
    """IBM LSF with CSM (e.g. OLCF Summit): one resource set per rank, ``--rs_per_host`` of them per host.
    jsrun places resource sets on the job's compute hosts itself; it takes no host list."""

    name = "jsrun"
    program = "jsrun"
    identity = TaskIdentity(None, "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_RANK")

    def step_argv(self, placed: list[HostSlots]) -> list[str]:
        ranks, per_host = _ranks(placed)
        return [
            "jsrun",
            "--nrs", str(ranks),
            "--rs_per_host", str(per_host),
            "--tasks_per_rs", "1",
            "--launch_distribution", "packed",
            *self.extra_args,
        ]  # fmt: skip


class Blaunch(NativeLauncher):
    """IBM LSF without CSM: ``blaunch -no-shell HOST COMMAND`` starts one task on a host of the job, much as
    ssh would, inside the job. It has no step form: every rank gets its own blaunch."""

    name = "blaunch"
    program = "blaunch"
    identity = TaskIdentity(None, None, "")

    def step_argv(self, placed: list[HostSlots]) -> None:
        return None

    def expresses(self, placed: list[HostSlots]) -> bool:
        return True  # one blaunch per rank goes anywhere

    def worker_argv(self, host: str) -> list[str]:
        return ["blaunch", "-no-shell", host, *self.extra_args]


NATIVE: dict[str, type[NativeLauncher]] = {
    cls.name: cls for cls in (Srun, FluxRun, PalsMpiexec, Aprun, Jsrun, Blaunch)
}


def is_pals_mpiexec(mpiexec: str = "mpiexec") -> bool:
    """Whether `mpiexec` is HPE Cray PALS' (``mpiexec --version`` says ``mpiexec version`` or names PALS,
    where Open MPI, MPICH/Hydra and Intel MPI name themselves)."""
    try:
        text = version_output(mpiexec)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if any(mark in text for mark in ("Open MPI", "OpenRTE", "HYDRA", "Intel(R) MPI", "MPICH")):
        return False
    return "PALS" in text or text.lstrip().lower().startswith("mpiexec version")


def _allocation_launcher(allocation: Allocation) -> str:
    """The native launcher of a scheduler, or 'ssh' where the allocation has none on PATH."""
    if allocation.scheduler == "Slurm":
        return "srun"
    if allocation.scheduler == "Flux":
        return "flux"
    if allocation.scheduler == "PBS":
        return "mpiexec" if shutil.which("mpiexec") and is_pals_mpiexec() else "ssh"
    if allocation.scheduler == "Cobalt":
        return "aprun" if shutil.which("aprun") else "ssh"
    if allocation.scheduler == "LSF":
        for name in ("jsrun", "blaunch"):
            if shutil.which(name):
                return name
        return "ssh"
    return "ssh"


def choose_launcher(
    requested: str, allocation: Allocation | None, hosts: list[HostSlots] | None, all_local: bool
) -> str:
    """The launcher's name for ``--launcher REQUESTED``: ``auto`` takes the allocation's own launcher when the
    job runs inside one (on its hosts: no -H, or -H naming hosts of the allocation), else ssh for other
    hosts and local when every rank runs here."""
    if requested not in LAUNCHER_CHOICES:
        raise LaunchError(f"--launcher {requested}: choose one of {', '.join(LAUNCHER_CHOICES)}")
    if requested != "auto":
        if requested in NATIVE and shutil.which(NATIVE[requested].program) is None:
            raise LaunchError(
                f"--launcher {requested}: '{NATIVE[requested].program}' is not on PATH here; load the "
                "scheduler's module, run inside the allocation, or choose another launcher"
            )
        return requested
    if allocation is not None:
        names = {h.name for h in allocation.hosts}
        if hosts is None or all(h.name in names for h in hosts):
            native = _allocation_launcher(allocation)
            if native != "ssh" and shutil.which(NATIVE[native].program) is None:
                raise LaunchError(
                    f"inside the {allocation.scheduler} allocation, but '{NATIVE[native].program}' is not on "
                    "PATH; load the scheduler's module or pass --launcher ssh"
                )
            if native != "ssh" or not all_local:
                return native
    return "local" if all_local else "ssh"


def make_native(name: str, environ: Mapping[str, str], extra_args: tuple[str, ...]) -> NativeLauncher:
    return NATIVE[name](environ, extra_args)
