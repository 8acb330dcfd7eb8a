"""Who this rank is and where the job meets, read from whichever launcher started the process.

Rank and size come from the first launcher whose variables are present: ``hpcdl run`` (HPCDL_*), Horovod
(HOROVOD_*), OpenMPI, MPICH/Hydra and Intel MPI (PMI_*), Slurm ``srun``, Cray ALPS ``aprun``, PALS, LSF
``jsrun``, Flux and torchrun. A process started by none of them is a job of one. Local and cross ranks
are computed by the runtime from the host identity (HPCDL_HOSTNAME, else the hostname), so they are
right whatever the launcher.

Where the ranks meet: ``HPCDL_RENDEZVOUS_ADDR``/``_PORT`` (set by ``hpcdl run``, whose server is already
listening; with ``HPCDL_RENDEZVOUS_SERVE=1`` rank 0 serves at exactly that port itself), else
``MASTER_ADDR``/``MASTER_PORT`` (rank 0 hosts the rendezvous), else under Slurm the first host of the step
(rank 0 hosts), else under Open MPI's ``mpirun`` or MPICH's ``mpiexec`` MPI itself (``bootstrap=mpi``, over
the launcher's own MPI library, found at run time: see ``mpi_library``). Addresses may be names; each rank
resolves them on its own host.

Where rank 0 hosts the rendezvous without a port of its own (the MASTER_ADDR and Slurm cases), no rank can
know in advance which port is free on rank 0's host, so none is chosen ahead of binding: rank 0 binds the
first free port of a short sequence every rank derives alike (the 16 after ``MASTER_PORT``, which itself
stays free for torch.distributed, whose store listens there under torchrun; under Slurm, 16 consecutive
ports picked by the job and step id below the kernel's ephemeral range), and the other ranks walk the same
sequence until they find it. A port held by someone else fails the authenticated handshake (or names
another job), and the rank moves on.

The job secret is ``HPCDL_SECRET``: every rank proves it holds it before it may join, so it must be
random and known only to the job. ``hpcdl run`` and the scripts of ``hpcdl submit`` make one. Ranks that
meet over TCP without it refuse to start, saying how to set one (the same random value on every rank, e.g.
``export HPCDL_SECRET=$(python3 -c "import secrets; print(secrets.token_hex(32))")`` before srun or
torchrun): anything the ranks could derive alike from their environment (job id, addresses, user id) is
known to the other users of the cluster too. Under ``bootstrap=mpi`` rank 0 makes a random secret and
sends it over MPI, a channel only the job's processes share, so none is needed there.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from hpcdl import jobenv, platforms
from hpcdl.common.exceptions import HpcdlConfigError
from hpcdl.errors import LaunchError
from hpcdl.platforms.base import WALK_LENGTH


def launcher_mpi(launcher: str) -> str:
    """The MPI family ("Open MPI", "MPICH") whose library the ranks of `launcher` use, or ""."""
    return next((t.mpi_family for t in platforms.task_variables() if t.launcher == launcher), "")


def mpi_launcher(family: str) -> str:
    """The launcher (as discover() names it) that starts ranks of an MPI family."""
    found = (t.launcher for t in platforms.task_variables() if family and t.mpi_family == family)
    return next(found, "its own launcher")


@dataclass(frozen=True)
class RankInfo:
    rank: int
    size: int
    host: str  # host identity: ranks with the same value share memory
    launcher: str  # which launcher's variables were used ("none" for a single process)
    local_rank: Optional[int] = None  # as the launcher reports it (the runtime recomputes it)


@dataclass(frozen=True)
class Meeting:
    """How the ranks meet: a TCP rendezvous (served by rank 0 when ``serve``) or MPI."""

    bootstrap: str  # "tcp" or "mpi"
    addr: str = ""
    ports: tuple[int, ...] = ()  # where the rendezvous listens; several: rank 0 binds the first free one
    serve: bool = False
    secret: str = ""
    job: str = ""  # tells this job's ranks from another's that walk the same ports with the same secret
    origin: str = ""  # the variables that named the rendezvous, for messages


def ports_after(base: int) -> tuple[int, ...]:
    """The ports after ``base`` (MASTER_PORT), wrapping within 1024-65535."""
    span = 65536 - 1024
    return tuple(1024 + (base + i - 1024) % span for i in range(1, WALK_LENGTH + 1))


def _int(env: Mapping[str, str], var: str) -> int:
    raw = env[var]
    try:
        return int(raw)
    except ValueError:
        raise HpcdlConfigError(f"{var}={raw!r} is not an integer; check how the job was launched") from None


def discover(env: Mapping[str, str] | None = None) -> RankInfo:
    """This process's rank, the job size and the host identity."""
    env = os.environ if env is None else env
    host = jobenv.host_identity(env) or socket.gethostname()
    for task in platforms.task_variables():
        launcher, rank_var, size_var, local_var = task.launcher, task.rank, task.size, task.local_rank
        if rank_var not in env:
            continue
        if size_var not in env:
            raise HpcdlConfigError(
                f"{rank_var} is set ({launcher}) but {size_var} is not, so the job size is unknown; set "
                f"{jobenv.RANK} and {jobenv.SIZE}, or launch with 'hpcdl run -np N'"
            )
        rank, size = _int(env, rank_var), _int(env, size_var)
        if size < 1 or not 0 <= rank < size:
            raise HpcdlConfigError(f"{rank_var}={rank} and {size_var}={size} do not describe a rank of a job")
        local = _int(env, local_var) if local_var and local_var in env else None
        return RankInfo(rank, size, host, launcher, local)
    return RankInfo(0, 1, host, "none", 0)


def job_id(env: Mapping[str, str] | None = None) -> str:
    """The launcher's or scheduler's id of this job ('' when none of them names one)."""
    env = os.environ if env is None else env
    # The most specific first: the batch job's, then an mpirun's (PMIx namespace), then torchrun's run id.
    return next((env[name] for name in platforms.job_id_variables() if env.get(name)), "")


def _job_tag(env: Mapping[str, str], *parts: str) -> str:
    """What every rank of this job (and no other job) shares: the rendezvous and the launcher's job ids."""
    ids = [env.get(name, "") for name in platforms.job_tag_variables()]
    return hashlib.sha256("|".join([*parts, *ids]).encode()).hexdigest()[:16]


def _no_secret(info: RankInfo, origin: str) -> str:
    return (
        f"{jobenv.SECRET} is not set (rank {info.rank} of {info.size}, {info.launcher} launch, rendezvous "
        f"from {origin}). Ranks that meet over TCP prove to each other that they hold the job's secret, "
        "which must be random: anything they could derive alike from the job (its id, addresses, your user "
        "id) the other users of the cluster can derive too. Launch with 'hpcdl run' or a script from 'hpcdl "
        "submit' (both make one), or export the same random value to every rank before starting them: "
        f"export {jobenv.SECRET}=$(python3 -c 'import secrets; print(secrets.token_hex(32))')"
    )


def _meeting_point(launcher: str, env: Mapping[str, str]) -> Optional[tuple[str, tuple[int, ...], str]]:
    """Where the ranks of `launcher` meet without being told (a Slurm step: its first node), or None."""
    for platform in platforms.platforms():
        if platform.meeting_point and any(task.launcher == launcher for task in platform.tasks):
            try:
                return platform.meeting_point(env)
            except LaunchError as exc:
                raise HpcdlConfigError(str(exc)) from None
    return None


def meeting(info: RankInfo, env: Mapping[str, str] | None = None, mpi_vendor: str = "") -> Meeting:
    """Where and how the ranks of this job meet, and the secret they prove."""
    env = os.environ if env is None else env
    secret = env.get(jobenv.SECRET, "")
    if info.size == 1:
        return Meeting("tcp", secret=secret)

    def tcp(addr: str, ports: tuple[int, ...], serve: bool, origin: str) -> Meeting:
        # Not the size: a rank started with another size should reach the rendezvous and be told.
        job = _job_tag(env, addr, str(ports[0])) if len(ports) > 1 else ""
        if not secret:
            raise HpcdlConfigError(_no_secret(info, origin))
        return Meeting("tcp", addr, ports, serve, secret, job=job, origin=origin)

    if env.get(jobenv.RENDEZVOUS_ADDR):
        if not env.get(jobenv.RENDEZVOUS_PORT):
            raise HpcdlConfigError(f"{jobenv.RENDEZVOUS_ADDR} is set but {jobenv.RENDEZVOUS_PORT} is not")
        port = _int(env, jobenv.RENDEZVOUS_PORT)
        origin = f"{jobenv.RENDEZVOUS_ADDR}/{jobenv.RENDEZVOUS_PORT}"
        return tcp(env[jobenv.RENDEZVOUS_ADDR], (port,), jobenv.serves(env), origin)
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        ports = ports_after(_int(env, "MASTER_PORT"))
        return tcp(env["MASTER_ADDR"], ports, True, "MASTER_ADDR/MASTER_PORT")
    untold = _meeting_point(info.launcher, env)
    if untold is not None:
        addr, ports, origin = untold
        return tcp(addr, ports, True, origin)
    if mpi_vendor and launcher_mpi(info.launcher) == mpi_vendor:  # launched by an MPI hpcdl can use
        return Meeting("mpi", secret=secret)
    hint = ""
    if launcher_mpi(info.launcher):
        hint = (
            f" (hpcdl can use {mpi_vendor or 'no MPI'} here, so it cannot meet through {info.launcher}'s "
            "MPI; 'hpcdl check-build --verbose' says why)"
        )
    raise HpcdlConfigError(
        f"rank {info.rank} of {info.size} ({info.launcher}) does not know where to meet the other "
        f"ranks{hint}. "
        "Launch with 'hpcdl run -np N', or set MASTER_ADDR and MASTER_PORT (rank 0's host and a port) "
        f"for every rank, or set {jobenv.RENDEZVOUS_ADDR}/{jobenv.RENDEZVOUS_PORT} to a running rendezvous "
        "server."
    )
