"""PBS Pro / OpenPBS with HPE Cray PALS: the variables PALS' ``mpiexec`` gives its ranks, the node file of a
job, and PALS ``mpiexec`` as the step launcher. Its batch scripts and commands (``qsub``, ``qstat``,
``qdel``) are :mod:`hpcdl.schedulers.pbs`."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Optional

from hpcdl.platforms.base import (
    Found,
    NativeLauncher,
    Placed,
    Platform,
    TaskIdentity,
    TaskVariables,
    ranks_and_shape,
    read_nodefile,
)
from hpcdl.platforms.mpi import PMI_LOCAL_RANK, PMI_RANK, PMI_SIZE, version_output

RANK = "PALS_RANKID"
LOCAL_RANK = "PALS_LOCAL_RANKID"
JOB_ID = "PBS_JOBID"
ARRAY_INDEX = "PBS_ARRAY_INDEX"
NODEFILE = "PBS_NODEFILE"
WORKDIR = "PBS_O_WORKDIR"  # where qsub ran; PBS starts the script in the home directory


def allocation(environ: Mapping[str, str]) -> Optional[Found]:
    """The job's hosts from its node file (one line per slot: mpiprocs), or None outside a PBS job."""
    if not environ.get(NODEFILE):
        return None
    return Found(f"{NODEFILE}={environ[NODEFILE]}", read_nodefile(NODEFILE, environ))


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


def native_launcher() -> str:
    return "mpiexec" if shutil.which("mpiexec") and is_pals_mpiexec() else "ssh"


class PalsMpiexec(NativeLauncher):
    """HPE Cray PALS (PBS on Cray EX, e.g. ALCF Polaris): ``mpiexec -n N --ppn S --hosts h1,h2``."""

    name = "mpiexec"
    program = "mpiexec"
    identity = TaskIdentity(None, LOCAL_RANK, RANK)

    def step_argv(self, placed: Sequence[Placed]) -> list[str]:
        ranks, per_host = ranks_and_shape(placed)
        hosts = ",".join(h.name for h in placed)
        return ["mpiexec", "-n", str(ranks), "--ppn", str(per_host), "--hosts", hosts, *self.extra_args]

    def worker_argv(self, host: str) -> list[str]:
        return ["mpiexec", "-n", "1", "--ppn", "1", "--hosts", host, *self.extra_args]


# A batch script's rank: PALS' variables, else those of a PMI mpiexec.
SCRIPT_RANK = f"${{{RANK}:-${{{PMI_RANK}:?not started by mpiexec}}}}"
SCRIPT_LOCAL_RANK = f"${{{LOCAL_RANK}:-${{{PMI_LOCAL_RANK}:?not started by mpiexec}}}}"

PLATFORM = Platform(
    name="pbs",
    title="PBS",
    tasks=(TaskVariables("PALS", RANK, PMI_SIZE, LOCAL_RANK, None, precedence=40),),
    job_id_variables=(JOB_ID,),
    allocation=allocation,
    launchers=(PalsMpiexec,),
    native_launcher=native_launcher,
    scheduler="hpcdl.schedulers.pbs:Pbs",
    submit_program="qsub from PBS",
    detect_priority=30,
)
