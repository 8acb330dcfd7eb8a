"""Cobalt with Cray ALPS (e.g. ALCF Theta): the variable ``aprun`` gives its ranks, the nodes of a job
(node file, or Cray node ids), and ``aprun`` as the step launcher. Its batch scripts and commands
(``qsub``, ``qstat``, ``qdel``) are :mod:`hpcdl.schedulers.cobalt`."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from typing import Optional

from hpcdl.errors import LaunchError
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
from hpcdl.platforms.hostlist import expand_range
from hpcdl.platforms.mpi import PMI_SIZE

RANK = "ALPS_APP_PE"  # ALPS gives no local rank: aprun places ranks block-wise, -N per node
JOB_ID = "COBALT_JOBID"
NODEFILE = "COBALT_NODEFILE"
PARTNAME = "COBALT_PARTNAME"  # Cray XC node ids: "3826-3829,3831"


def allocation(environ: Mapping[str, str]) -> Optional[Found]:
    """The job's nodes, or None outside a Cobalt job."""
    if environ.get(NODEFILE):
        return Found(f"{NODEFILE}={environ[NODEFILE]}", read_nodefile(NODEFILE, environ))
    if environ.get(PARTNAME):
        # Cray XC node ids (Theta: "3826-3829,3831") name hosts nid03826 ...
        numbers = expand_range(environ[PARTNAME].replace(" ", ""), environ[PARTNAME])
        return Found(f"{PARTNAME}={environ[PARTNAME]}", [f"nid{int(number):05d}" for number in numbers])
    return None


class Aprun(NativeLauncher):
    """Cray ALPS (Cobalt on Cray XC, e.g. ALCF Theta): ``aprun -n N -N S -L nidlist``. ALPS runs one
    application per node at a time, so it has no one-task form beside a running job."""

    name = "aprun"
    program = "aprun"
    identity = TaskIdentity(None, None, RANK)
    from_service_node = True

    def step_argv(self, placed: Sequence[Placed]) -> list[str]:
        ranks, per_host = ranks_and_shape(placed)
        nids = []
        for host in placed:
            number = host.name[3:] if host.name.startswith("nid") else host.name
            if not number.isdigit():
                raise LaunchError(f"--launcher aprun: host '{host.name}' is not a Cray node id (nidNNNNN)")
            nids.append(str(int(number)))
        return ["aprun", "-n", str(ranks), "-N", str(per_host), "-L", ",".join(nids), *self.extra_args]


PLATFORM = Platform(
    name="cobalt",
    title="Cobalt",
    tasks=(TaskVariables("Cray aprun", RANK, PMI_SIZE, None, None, precedence=80),),
    job_id_variables=(JOB_ID,),
    allocation=allocation,
    launchers=(Aprun,),
    native_launcher=lambda: "aprun" if shutil.which("aprun") else "ssh",
    scheduler="hpcdl.schedulers.cobalt:Cobalt",
    submit_program="qsub from Cobalt",
    detect_priority=40,
)
