"""Flux: ``# flux:`` batch directives, ``flux run`` launch, flux batch/jobs/cancel."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Optional

from hpcdl.platforms import flux as facts
from hpcdl.schedulers import lint
from hpcdl.schedulers.base import JobState, Scheduler, run_command
from hpcdl.schedulers.errors import JobSpecError, JobUnknownError, SchedulerError
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


# ---- Flux ----------------------------------------------------------------------------------------------

_FLUX_VALUE = {
    "-N",
    "--nodes",
    "-n",
    "--ntasks",
    "-c",
    "--cores-per-task",
    "-g",
    "--gpus-per-task",
    "-t",
    "--time-limit",
    "-q",
    "--queue",
    "-B",
    "--bank",
    "--job-name",
    "--output",
    "--error",
    "--cc",
    "--bcc",
    "--signal",
    "-S",
    "--setattr",
    "--requires",
    "--urgency",
    "--dependency",
    "--env",
    "--conf",
    "-o",
    "--setopt",
}
_FLUX_FLAGS = {"--exclusive", "-x"}
_FLUX_DURATION = re.compile(r"^\d+(\.\d+)?[smhd]?$")
_FLUX_IDSET = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_FLUX_SIGNAL = re.compile(r"^(SIG)?[A-Z0-9]+(@\d+(\.\d+)?[smhd]?)?$")
_FLUX_RUN_VALUE = {
    "-N",
    "--nodes",
    "-n",
    "--ntasks",
    "-c",
    "--cores-per-task",
    "-g",
    "--gpus-per-task",
    "--tasks-per-node",
    "--taskmap",
    "-o",
    "--setopt",
    "--label-io",
}
_FLUX_RUN_FLAGS = {"-x", "--exclusive", "-l"}


def check_script(script: str) -> list[str]:
    found, problems = lint.directives(script, "# flux:")
    nodes: Optional[int] = None
    for line, name, value in lint.options(found, _FLUX_VALUE, _FLUX_FLAGS, problems, "flux batch"):
        value = value or ""
        if name in ("-N", "--nodes"):
            nodes = lint.int_or_none(value)
            if not nodes:
                problems.append(f"line {line}: -N {value} must be a positive node count")
        elif name in ("-t", "--time-limit") and not _FLUX_DURATION.match(value):
            problems.append(f"line {line}: -t {value} is not a Flux duration (e.g. 90s, 30m, 2h, 1d)")
        elif name in ("--cc", "--bcc") and not _FLUX_IDSET.match(value):
            problems.append(f"line {line}: {name}={value} is not a Flux idset (e.g. 0-9 or 1,3,5)")
        elif name == "--signal" and not _FLUX_SIGNAL.match(value):
            problems.append(f"line {line}: --signal={value} is not SIG[@DURATION]")
    if nodes is None:
        problems.append("no '# flux: -N NODES': flux batch needs the node count of the instance")
    for argv in lint.launch_lines(script, "flux"):
        if len(argv) < 2 or argv[1] != "run":
            continue
        values, unknown = lint.flag_values(argv[1:], _FLUX_RUN_VALUE, _FLUX_RUN_FLAGS)
        problems += [f"flux run: unknown option {u!r}" for u in unknown]
        run_nodes = lint.int_or_none(values.get("-N", values.get("--nodes")))
        tasks = lint.int_or_none(values.get("-n", values.get("--ntasks")))
        if nodes is not None and run_nodes is not None and run_nodes > nodes:
            problems.append(f"flux run -N {run_nodes} asks for more nodes than the batch job has ({nodes})")
        if run_nodes is not None and tasks is not None and tasks < run_nodes:
            problems.append(f"flux run -n {tasks} is fewer tasks than nodes (-N {run_nodes})")
    return problems


def flux_duration(seconds: int) -> str:
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def parse_flux_batch_answer(text: str) -> str:
    """The job id ``flux batch`` prints (an F58 id such as ``ƒ2B1tWRbq``)."""
    answer = text.strip()
    if not answer or len(answer.split()) != 1:
        raise SchedulerError(f"flux batch answered {answer!r}, which is not one job id")
    return answer


def parse_flux_jobs(job_id: str, text: str) -> list[JobState]:
    """States from ``flux jobs --no-header --format={id.f58}|{state}|{result}``."""
    states = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 3:
            ident, state, result = fields
            common = _RESULTS.get(result, "UNKNOWN") if state == "INACTIVE" else _STATES.get(state, "UNKNOWN")
            states.append(JobState(ident, common, f"{state} {result}".strip()))
    if not states:
        raise JobUnknownError(f"Flux does not list job {job_id}")
    return states


class Flux(Scheduler):
    name = facts.PLATFORM.name
    rank_variable = f"${{{facts.RANK}:?not started by flux run}}"
    local_rank_variable = f"${{{facts.LOCAL_RANK}:?not started by flux run}}"
    array_variable = facts.ARRAY_INDEX
    job_id_variable = facts.JOB_ID
    can_requeue = False

    @classmethod
    def detect(cls) -> bool:
        return shutil.which("flux") is not None

    @classmethod
    def claims(cls) -> bool:
        return bool(os.environ.get(facts.URI)) and cls.detect()

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
        return check_script(script)

    def submit(self, script: Path, workdir: Path) -> str:
        return parse_flux_batch_answer(
            run_command(["flux", "batch", str(script)], "submit the job to Flux", cwd=workdir)
        )

    def status(self, job_id: str) -> list[JobState]:
        argv = ["flux", "jobs", "--no-header", "--format={id.f58}|{state}|{result}", job_id]
        try:
            out = run_command(argv, f"ask Flux about {job_id}")
        except SchedulerError as exc:
            if "unknown" in str(exc).lower():  # Flux answered that it knows no such job
                raise JobUnknownError(str(exc)) from None
            raise
        return parse_flux_jobs(job_id, out)

    def cancel(self, job_id: str) -> None:
        run_command(["flux", "cancel", job_id], f"cancel Flux job {job_id}")
