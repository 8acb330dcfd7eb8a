"""Flux: the variables ``flux run`` gives its tasks, the resources of an allocation (``flux resource
list``), and ``flux run`` as the step launcher. Its batch scripts and commands (``flux batch``, ``flux
jobs``, ``flux cancel``) are :mod:`hpcdl.schedulers.flux`."""

from __future__ import annotations

import subprocess
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
)
from hpcdl.platforms.hostlist import expand_hostlist

RANK = "FLUX_TASK_RANK"
SIZE = "FLUX_JOB_SIZE"
LOCAL_RANK = "FLUX_TASK_LOCAL_ID"
JOB_ID = "FLUX_JOB_ID"
ARRAY_INDEX = "FLUX_JOB_CC"
URI = "FLUX_URI"  # set inside a Flux instance
RESOURCE_TIMEOUT_SECONDS = 30.0


def parse_resources(text: str) -> Found:
    """Parse ``flux resource list -no '{nnodes} {ncores} {ngpus} {nodelist}'``: a host gets one slot
    per GPU, or per core where it has no GPU."""
    names: list[str] = []
    counts: list[int] = []
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 4 or not all(f.isdigit() for f in fields[:3]):
            raise LaunchError(f"cannot read flux resource line '{line}'")
        nnodes, ncores, ngpus = (int(f) for f in fields[:3])
        hosts = expand_hostlist(fields[3])
        per_node = max(1, (ngpus or ncores) // max(nnodes, 1))
        names += hosts
        counts += [per_node] * len(hosts)
    return Found("flux resource list", names, counts)


def allocation(environ: Mapping[str, str]) -> Optional[Found]:
    """The nodes up in this Flux job, or None outside one."""
    if not environ.get(JOB_ID):
        return None
    argv = ["flux", "resource", "list", "-s", "up", "-no", "{nnodes} {ncores} {ngpus} {nodelist}"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=RESOURCE_TIMEOUT_SECONDS, check=False
        )
    except FileNotFoundError:
        raise LaunchError(f"{JOB_ID} is set but 'flux' is not on PATH; pass -H or --hostfile") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(
            f"'flux resource list' did not answer within {RESOURCE_TIMEOUT_SECONDS:g} s"
        ) from None
    if done.returncode != 0:
        raise LaunchError(f"'flux resource list' failed ({done.returncode}): {done.stderr.strip()}")
    found = parse_resources(done.stdout)
    if not found.names:
        raise LaunchError("'flux resource list' shows no nodes up in this allocation")
    return found


class FluxRun(NativeLauncher):
    """Flux: ``flux run`` with the hosts as a constraint (``--requires=hosts:``), tasks block-mapped by the
    job shell, stdin copied to every task (``--input`` with the idset of all task ranks)."""

    name = "flux"
    program = "flux"
    identity = TaskIdentity(None, LOCAL_RANK, RANK)
    broadcasts_stdin = True

    def step_argv(self, placed: Sequence[Placed]) -> list[str]:
        ranks, per_host = ranks_and_shape(placed)
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

    def expresses(self, placed: Sequence[Placed]) -> bool:
        # Without --tasks-per-node the job shell spreads tasks as evenly as it can: 3 on 2 nodes is 2 + 1.
        ranks, nodes = sum(h.slots for h in placed), len(placed)
        even = [ranks // nodes + (1 if index < ranks % nodes else 0) for index in range(nodes)]
        return [h.slots for h in placed] == even


PLATFORM = Platform(
    name="flux",
    title="Flux",
    tasks=(TaskVariables("Flux", RANK, SIZE, LOCAL_RANK, None, precedence=90),),
    job_id_variables=(JOB_ID,),
    allocation=allocation,
    launchers=(FluxRun,),
    native_launcher=lambda: "flux",
    scheduler="hpcdl.schedulers.flux:Flux",
    submit_program="flux",
    detect_priority=50,  # last, unless inside an instance (FLUX_URI): see hpcdl.schedulers.flux
)
