"""Slurm: the variables ``srun`` gives its tasks, the allocation a job leaves in its environment, ``srun``
as the step launcher, and where a step's ranks meet without being told. Its batch scripts and commands
(``sbatch``, ``squeue``, ``scancel``) are :mod:`hpcdl.schedulers.slurm`."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Optional

from hpcdl.errors import LaunchError
from hpcdl.platforms.base import (
    WALK_LENGTH,
    Found,
    NativeLauncher,
    Placed,
    Platform,
    TaskIdentity,
    TaskVariables,
)
from hpcdl.platforms.hostlist import expand_hostlist, first_host

RANK = "SLURM_PROCID"
SIZE = "SLURM_NTASKS"
LOCAL_RANK = "SLURM_LOCALID"
HOST = "SLURMD_NODENAME"
JOB_ID = "SLURM_JOB_ID"
STEP_ID = "SLURM_STEP_ID"
ARRAY_INDEX = "SLURM_ARRAY_TASK_ID"
CPUS_PER_TASK = "SLURM_CPUS_PER_TASK"
JOB_NODELISTS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")  # the second: Slurm before 20.02
STEP_NODELIST = "SLURM_STEP_NODELIST"
COUNTS = ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE")  # per-node counts, the first that is set

_EPHEMERAL_START = 32768  # Linux's default net.ipv4.ip_local_port_range starts here


def expand_counts(text: str) -> list[int]:
    """Expand Slurm's per-node counts: ``2(x3),1`` -> 2 2 2 1."""
    counts = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match:
            raise LaunchError(f"cannot read per-node count '{item}' in '{text}' (expected e.g. 2(x3),1)")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def allocation(environ: Mapping[str, str]) -> Optional[Found]:
    """The job's nodes and the tasks (else CPUs) per node, or None outside a Slurm job."""
    variable = JOB_NODELISTS[0] if JOB_NODELISTS[0] in environ else JOB_NODELISTS[1]
    if not environ.get(variable):
        return None
    names = expand_hostlist(environ[variable])
    counts = None
    for count_variable in COUNTS:
        if environ.get(count_variable):
            counts = expand_counts(environ[count_variable])
            if len(counts) != len(names):
                raise LaunchError(
                    f"{count_variable}={environ[count_variable]} gives {len(counts)} counts for the "
                    f"{len(names)} nodes of {variable}={environ[variable]}; pass -H or --hostfile instead"
                )
            break
    return Found(f"{variable}={environ[variable]}", names, counts)


def step_ports(job_id: str, step_id: str) -> tuple[int, ...]:
    """Consecutive ports in 20000-32767 picked by the job and step: below the ephemeral range, so that no
    outgoing connection of the node holds one, and apart for the steps of one job."""
    seed = int(hashlib.sha256(f"{job_id}.{step_id}".encode()).hexdigest()[:8], 16)
    span = _EPHEMERAL_START - 20000
    return tuple(20000 + (seed + i) % span for i in range(WALK_LENGTH))


def meeting_point(env: Mapping[str, str]) -> Optional[tuple[str, tuple[int, ...], str]]:
    """Where the ranks of an srun step meet untold: its first node, on ports picked by job and step."""
    nodelist = env.get(STEP_NODELIST) or env.get(JOB_NODELISTS[0])
    if not (nodelist and env.get(JOB_ID)):
        return None
    try:
        host = first_host(nodelist)
    except LaunchError:
        raise LaunchError(f"cannot read {STEP_NODELIST}/{JOB_NODELISTS[0]}={nodelist!r}") from None
    return host, step_ports(env[JOB_ID], env.get(STEP_ID, "")), "the Slurm step's first node"


class Srun(NativeLauncher):
    """Slurm. One step with the exact placement (``--distribution=arbitrary``: the node list names the host of
    each task in rank order, so SLURM_PROCID equals the rank), ``--kill-on-bad-exit`` (a failing rank ends the
    step), stdin copied to every task, this environment exported, ``--overlap`` when already inside a step
    (else it would wait for that step's resources), and the allocation's ``--cpus-per-task`` (srun 22.05 no
    longer reads SLURM_CPUS_PER_TASK)."""

    name = "srun"
    program = "srun"
    identity = TaskIdentity(HOST, LOCAL_RANK, RANK)
    broadcasts_stdin = True

    def _common(self) -> list[str]:
        # --export=ALL: a job submitted with --export=NONE leaves SLURM_EXPORT_ENV=NONE for its steps, whose
        # tasks would then lack the job's secret, rendezvous and PATH.
        argv = ["--kill-on-bad-exit=1", "--input=all", "--export=ALL"]
        if self.environ.get(CPUS_PER_TASK):
            argv.append(f"--cpus-per-task={self.environ[CPUS_PER_TASK]}")
        if self.environ.get(STEP_ID) is not None:
            argv.append("--overlap")
        return argv

    def step_argv(self, placed: Sequence[Placed]) -> list[str]:
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

    def expresses(self, placed: Sequence[Placed]) -> bool:
        return True  # arbitrary distribution expresses any placement


PLATFORM = Platform(
    name="slurm",
    title="Slurm",
    tasks=(TaskVariables("Slurm srun", RANK, SIZE, LOCAL_RANK, None, precedence=70),),
    job_id_variables=(JOB_ID,),
    job_tag_variables=(JOB_ID, STEP_ID),
    allocation=allocation,
    launchers=(Srun,),
    native_launcher=lambda: "srun",
    meeting_point=meeting_point,
    scheduler="hpcdl.schedulers.slurm:Slurm",
    submit_program="sbatch",
    detect_priority=10,  # before PBS and Cobalt: Slurm's PBS wrappers also install a qsub
)
