"""Cobalt (ALCF Theta): ``#COBALT`` directives, ALPS ``aprun -n -N -d -cc depth`` launch."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from hpcdl.schedulers import lint
from hpcdl.schedulers.base import JobState, Scheduler, run_command
from hpcdl.schedulers.errors import JobSpecError, JobUnknownError, SchedulerError
from hpcdl.schedulers.job import JobSpec
from hpcdl.schedulers.probe import qsub_flavour
from hpcdl.schedulers.site import SiteConfig

_STATES = {
    "queued": "PENDING",
    "starting": "PENDING",
    "running": "RUNNING",
    "exiting": "RUNNING",
    "user_hold": "HELD",
    "admin_hold": "HELD",
    "dep_hold": "HELD",
    "killing": "CANCELLED",
    "done": "COMPLETED",
}


def parse_cobalt_qsub_answer(text: str) -> str:
    """Cobalt's qsub prints the numeric job id on a line of its own."""
    match = re.search(r"^\s*(\d+)\s*$", text, re.MULTILINE)
    if not match:
        raise SchedulerError(f"Cobalt's qsub answered {text.strip()!r}, which holds no job id")
    return match.group(1)


def parse_cobalt_qstat(job_id: str, text: str) -> list[JobState]:
    """The ``State : running`` line of ``qstat -l JOBID``; Cobalt lists only queued and running jobs."""
    match = re.search(r"^\s*State\s*:\s*(\S+)", text, re.MULTILINE)
    if not match:
        raise JobUnknownError(
            f"Cobalt does not list job {job_id}: it has ended (Cobalt forgets finished jobs); "
            f"read {job_id}.cobaltlog for its exit status"
        )
    return [JobState(job_id, _STATES.get(match.group(1), "UNKNOWN"), match.group(1))]


class Cobalt(Scheduler):
    name = "cobalt"
    rank_variable = "${ALPS_APP_PE:?not started by aprun}"
    array_variable = None  # Cobalt has no job arrays
    job_id_variable = "COBALT_JOBID"
    can_requeue = False

    def local_rank(self, job: JobSpec) -> str:
        # ALPS gives only the global rank; aprun places ranks block-wise, -N per node.
        return f"$(( ALPS_APP_PE % {job.resolved_ranks_per_node} ))"

    @classmethod
    def detect(cls) -> bool:
        return qsub_flavour() == "cobalt"

    def check_supported(self, job: JobSpec) -> None:
        if job.requeue:
            raise JobSpecError("Cobalt cannot requeue a job; resubmit it from the checkpoint instead")
        if job.qos or job.constraint:
            raise JobSpecError(
                "Cobalt has no QoS or constraint directive; use site extra_directives (--attrs)"
            )

    def default_output(self, job: JobSpec) -> Optional[str]:
        return None  # Cobalt writes JOBID.output, JOBID.error and JOBID.cobaltlog

    def directives(self, job: JobSpec, site: SiteConfig) -> list[str]:
        minutes = -(-job.walltime_seconds // 60)
        lines = [f"-n {job.nodes}", f"-t {minutes}"]
        if job.partition:
            lines.append(f"-q {job.partition}")
        if job.account:
            lines.append(f"-A {job.account}")
        if job.output:
            lines.append(f"-o {self.output_path(job.output, job)}")
        if job.error:
            lines.append(f"-e {self.output_path(job.error, job)}")
        return [*lines, *site.extra_directives]

    def output_path(self, pattern: str, job: JobSpec) -> str:
        if "{" in pattern:
            raise JobSpecError(f"Cobalt cannot put the job id or name into {pattern!r}; give a fixed path")
        return pattern

    def launcher(self, job: JobSpec) -> list[str]:
        return [
            "aprun",
            "-n",
            str(job.total_ranks),
            "-N",
            str(job.resolved_ranks_per_node),
            "-d",
            str(job.resolved_cpus_per_rank),
            "-cc",
            "depth",
            "-e",
            f"OMP_NUM_THREADS={job.resolved_cpus_per_rank}",
        ]

    def first_node_prefix(self) -> list[str]:
        # The script runs on a service (MOM) node, not on the job's compute nodes.
        return ["aprun", "-n", "1", "-N", "1"]

    def validate(self, script: str, site: SiteConfig) -> list[str]:
        return lint.check_cobalt(script, site.cpus_per_node)

    def submit(self, script: Path, workdir: Path) -> str:
        argv = ["qsub", "--mode", "script", str(script)]
        return parse_cobalt_qsub_answer(run_command(argv, "submit the job to Cobalt", cwd=workdir))

    def status(self, job_id: str) -> list[JobState]:
        return parse_cobalt_qstat(job_id, run_command(["qstat", "-l", job_id], f"ask Cobalt about {job_id}"))

    def cancel(self, job_id: str) -> None:
        run_command(["qdel", job_id], f"cancel Cobalt job {job_id}")

    def log_globs(self, job: JobSpec) -> list[str]:
        if job.output or job.error:
            return [p for p in (job.output, job.error) if p]
        return ["{job_id}.output", "{job_id}.error", "{job_id}.cobaltlog"]
