"""IBM Spectrum LSF: the variables ``jsrun`` gives its ranks, the hosts of a job (LSB_MCPU_HOSTS,
LSB_HOSTS), and ``jsrun`` (with CSM) or ``blaunch`` as the launcher. Its batch scripts and commands
(``bsub``, ``bjobs``, ``bkill``) are :mod:`hpcdl.schedulers.lsf`."""

from __future__ import annotations

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
    on_path,
    ranks_and_shape,
)

RANK = "JSM_NAMESPACE_RANK"
SIZE = "JSM_NAMESPACE_SIZE"
LOCAL_RANK = "JSM_NAMESPACE_LOCAL_RANK"
LOCAL_SIZE = "JSM_NAMESPACE_LOCAL_SIZE"
JOB_ID = "LSB_JOBID"
ARRAY_INDEX = "LSB_JOBINDEX"
MCPU_HOSTS = "LSB_MCPU_HOSTS"  # "host count host count ..."
HOSTS = "LSB_HOSTS"  # one word per slot


def allocation(environ: Mapping[str, str]) -> Optional[Found]:
    """The job's hosts and slots, or None outside an LSF job."""
    if environ.get(MCPU_HOSTS):
        words = environ[MCPU_HOSTS].split()
        if len(words) % 2 or not all(count.isdigit() for count in words[1::2]):
            raise LaunchError(f"{MCPU_HOSTS}='{environ[MCPU_HOSTS]}' is not 'host count host count ...'")
        return Found(MCPU_HOSTS, words[0::2], [int(count) for count in words[1::2]])
    if environ.get(HOSTS):
        return Found(HOSTS, environ[HOSTS].split())
    return None


class Jsrun(NativeLauncher):
    """IBM LSF with CSM (e.g. OLCF Summit): one resource set per rank, ``--rs_per_host`` of them per host.
    jsrun places resource sets on the job's compute hosts itself; it takes no host list."""

    name = "jsrun"
    program = "jsrun"
    identity = TaskIdentity(None, LOCAL_RANK, RANK)
    from_service_node = True

    def step_argv(self, placed: Sequence[Placed]) -> list[str]:
        ranks, per_host = ranks_and_shape(placed)
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

    def step_argv(self, placed: Sequence[Placed]) -> None:
        return None

    def expresses(self, placed: Sequence[Placed]) -> bool:
        return True  # one blaunch per rank goes anywhere

    def worker_argv(self, host: str) -> list[str]:
        return ["blaunch", "-no-shell", host, *self.extra_args]


PLATFORM = Platform(
    name="lsf",
    title="LSF",
    tasks=(TaskVariables("LSF jsrun", RANK, SIZE, LOCAL_RANK, LOCAL_SIZE, precedence=30),),
    job_id_variables=(JOB_ID,),
    allocation=allocation,
    launchers=(Jsrun, Blaunch),
    native_launcher=lambda: on_path("jsrun", "blaunch"),
    scheduler="hpcdl.schedulers.lsf:Lsf",
    submit_program="bsub",
    detect_priority=20,
)
