"""Flux: ``# flux:`` batch directives, ``flux run`` launch, flux batch/jobs/cancel."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from hpcdl.schedulers import lint
from hpcdl.schedulers.base import JobState, Scheduler, run_command
from hpcdl.schedulers.errors import JobSpecError, SchedulerError
from hpcdl.schedulers.job import JobSpec
from hpcdl.schedulers.site import SiteConfig

_STATES = {
    "DEPEND": "PENDING",
    "PRIORITY": "PENDING",
    "SCHED": "PENDING",
    "RUN": "RUNNING",
    "CLEANUP": "RUNNING",
}
_RESULTS = {"COMPLETED": "COMPLETED", "FAILED": "FAILED", "CANCELED": "CANCELLED", "TIMEOUT": "TIMEOUT"}


def flux_duration(seconds: int) -> str:
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


class Flux(Scheduler):
    name = "flux"
    local_rank_variable = "${FLUX_TASK_LOCAL_ID:?not started by flux run}"
    array_variable = "FLUX_JOB_CC"

    @classmethod
    def detect(cls) -> bool:
        return shutil.which("flux") is not None

    def check_supported(self, job: JobSpec) -> None:
        if job.array and (job.array.step > 1 or job.array.max_concurrent):
            raise JobSpecError("Flux arrays (--cc) take index lists and ranges only, without :STEP or %LIMIT")
        if job.requeue:
            raise JobSpecError("Flux cannot requeue a job; resubmit it from the checkpoint instead")
        if job.qos:
            raise JobSpecError("Flux has no QoS; use --partition for the queue")

    def directives(self, job: JobSpec, site: SiteConfig) -> list[str]:
        lines = [
            f"-N {job.nodes}",
            "--exclusive",
            f"-t {flux_duration(job.walltime_seconds)}",
            f"--job-name={job.job_name}",
        ]
        if job.partition:
            lines.append(f"-q {job.partition}")
        if job.account:
            lines.append(f"-B {job.account}")
        if job.constraint:
            lines.append(f"--requires={job.constraint}")
        output = self.resolved_output(job)
        if output:
            lines.append(f"--output={self.output_path(output, job)}")
        if job.error:
            lines.append(f"--error={self.output_path(job.error, job)}")
        if job.sweep:
            lines.append(f"--cc=0-{len(job.sweep) - 1}")
        elif job.array:
            text = (
                f"{job.array.first}-{job.array.last}"
                if job.array.is_range
                else ",".join(map(str, job.array.indices))
            )
            lines.append(f"--cc={text}")
        if job.signal:
            lines.append(f"--signal=SIG{job.signal.name}@{job.signal.seconds}s")
        return [*lines, *site.extra_directives]

    def default_output(self, job: JobSpec) -> Optional[str]:
        return "{name}-{job_id}.out"  # every --cc copy is its own job with its own id

    def output_path(self, pattern: str, job: JobSpec) -> str:
        if "{array_index}" in pattern:
            raise JobSpecError(
                "Flux output paths cannot hold {array_index}; {job_id} already differs per copy"
            )
        return pattern.replace("{name}", job.job_name).replace("{job_id}", "{{id}}")

    def launcher(self, job: JobSpec) -> list[str]:
        argv = [
            "flux",
            "run",
            "-N",
            str(job.nodes),
            "-n",
            str(job.total_ranks),
            "-c",
            str(job.resolved_cpus_per_rank),
        ]
        per_rank, sharing = job.gpu_slice if job.gpus_per_node else (0, 1)
        if per_rank and sharing == 1:
            argv += ["-g", str(per_rank)]
        return argv

    def signal_parts(self, job: JobSpec) -> tuple[Optional[int], Optional[str]]:
        return None, None  # flux signals the batch script itself (--signal)

    def validate(self, script: str, site: SiteConfig) -> list[str]:
        return lint.check_flux(script)

    def submit(self, script: Path, workdir: Path) -> str:
        out = run_command(["flux", "batch", str(script)], "submit the job to Flux", cwd=workdir).strip()
        if not out or len(out.split()) != 1:
            raise SchedulerError(f"flux batch answered {out!r}, which is not one job id")
        return out

    def status(self, job_id: str) -> list[JobState]:
        out = run_command(
            ["flux", "jobs", "--no-header", "--format={id.f58}|{state}|{result}", job_id],
            f"ask Flux about {job_id}",
        )
        states = []
        for line in out.splitlines():
            fields = line.strip().split("|")
            if len(fields) == 3:
                state = (
                    _RESULTS.get(fields[2], "UNKNOWN")
                    if fields[1] == "INACTIVE"
                    else _STATES.get(fields[1], "UNKNOWN")
                )
                states.append(JobState(fields[0], state, f"{fields[1]} {fields[2]}".strip()))
        if not states:
            raise SchedulerError(f"Flux does not list job {job_id}")
        return states

    def cancel(self, job_id: str) -> None:
        run_command(["flux", "cancel", job_id], f"cancel Flux job {job_id}")
