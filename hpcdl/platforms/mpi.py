"""The launchers that are no scheduler: ``hpcdl run`` itself (the variables of :mod:`hpcdl.jobenv`),
Open MPI's ``mpirun``, MPICH/Hydra's and Intel MPI's ``mpiexec`` (PMI), Horovod's ``horovodrun`` and
``torchrun``; the variables each gives its ranks, and how an MPI's launcher names itself."""

from __future__ import annotations

import subprocess

from hpcdl import jobenv
from hpcdl.platforms.base import Platform, TaskVariables

OPEN_MPI = "Open MPI"
MPICH = "MPICH"
VERSION_TIMEOUT_SECONDS = 20.0

# Variables torchrun and torch.distributed's launchers give every rank; a rank of another launcher gets
# them from hpcdl's batch scripts and the rank agent.
TORCH_RANK = "RANK"
TORCH_SIZE = "WORLD_SIZE"
TORCH_LOCAL_RANK = "LOCAL_RANK"
TORCH_LOCAL_SIZE = "LOCAL_WORLD_SIZE"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
PMIX_NAMESPACE = "PMIX_NAMESPACE"  # an mpirun's job (Open MPI, and Slurm's PMIx plugin)
PMI_RANK = "PMI_RANK"
PMI_SIZE = "PMI_SIZE"
PMI_LOCAL_RANK = "PMI_LOCAL_RANK"


def version_output(program: str) -> str:
    """What ``PROGRAM --version`` prints (stdout, then stderr); OSError or TimeoutExpired if it cannot."""
    done = subprocess.run(
        [program, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_SECONDS, check=False
    )
    return done.stdout + done.stderr


PLATFORM = Platform(
    name="mpi",
    title="MPI",
    tasks=(
        TaskVariables(
            "hpcdl run", jobenv.RANK, jobenv.SIZE, jobenv.LOCAL_RANK, jobenv.LOCAL_SIZE, precedence=0
        ),
        TaskVariables(
            "horovodrun", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
            precedence=10,
        ),
        TaskVariables(
            "OpenMPI mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE", precedence=20, mpi_family=OPEN_MPI,
        ),
        TaskVariables(
            "MPICH/PMI mpiexec", PMI_RANK, PMI_SIZE, "MPI_LOCALRANKID", "MPI_LOCALNRANKS", precedence=50,
            mpi_family=MPICH,
        ),
        TaskVariables(
            "torchrun", TORCH_RANK, TORCH_SIZE, TORCH_LOCAL_RANK, TORCH_LOCAL_SIZE, precedence=100
        ),
    ),
    job_id_variables=(PMIX_NAMESPACE, TORCHELASTIC_RUN_ID),
    job_tag_variables=(TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT),
)  # fmt: skip
