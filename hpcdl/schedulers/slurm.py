"""Slurm: ``#SBATCH`` directives, ``srun`` launch, sbatch/squeue/scontrol/scancel."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Optional

from hpcdl.platforms import slurm as facts
from hpcdl.schedulers import lint
from hpcdl.schedulers.base import JobState, Scheduler, run_command
from hpcdl.schedulers.errors import JobUnknownError, SchedulerError
from hpcdl.schedulers.job import JobSpec, SignalSpec, format_clock
from hpcdl.schedulers.site import SiteConfig

_STATES = {
    "PENDING": "PENDING",
    "CONFIGURING": "PENDING",
    "REQUEUED": "PENDING",
    "REQUEUE_HOLD": "HELD",
    "REQUEUE_FED": "PENDING",
    "RESV_DEL_HOLD": "HELD",
    "RUNNING": "RUNNING",
    "COMPLETING": "RUNNING",
    "STAGE_OUT": "RUNNING",
    "SIGNALING": "RUNNING",
    "RESIZING": "RUNNING",
    "COMPLETED": "COMPLETED",
    "FAILED": "FAILED",
    "NODE_FAIL": "FAILED",
    "BOOT_FAIL": "FAILED",
    "OUT_OF_MEMORY": "FAILED",
    "DEADLINE": "TIMEOUT",
    "TIMEOUT": "TIMEOUT",
    "PREEMPTED": "CANCELLED",
    "CANCELLED": "CANCELLED",
    "REVOKED": "CANCELLED",
    "SPECIAL_EXIT": "FAILED",
    "SUSPENDED": "SUSPENDED",
    "STOPPED": "SUSPENDED",
}


# ---- Slurm (a real sbatch --test-only also checks these in the integration tests) ---------------

_SLURM_VALUE = {
    "--job-name",
    "--nodes",
    "--ntasks",
    "--ntasks-per-node",
    "--cpus-per-task",
    "--gpus-per-node",
    "--gpus",
    "--gpus-per-task",
    "--cpus-per-gpu",
    "--mem-per-gpu",
    "--gres",
    "--time",
    "--account",
    "--partition",
    "--qos",
    "--constraint",
    "--output",
    "--error",
    "--array",
    "--signal",
    "--open-mode",
    "--mem",
    "--mem-per-cpu",
    "--reservation",
    "--mail-type",
    "--mail-user",
    "--chdir",
    "--export",
    "--dependency",
    "--licenses",
    "--gpu-bind",
    "--distribution",
    "--exclude",
    "--nodelist",
    "--time-min",
    "--begin",
    "--comment",
    "--hint",
    "--switches",
    "--cluster",
    "--clusters",
    "--threads-per-core",
    "--tmp",
    "--wckey",
    "--network",
    "--nice",
}
_SLURM_FLAGS = {"--requeue", "--no-requeue", "--exclusive", "--overcommit", "--oversubscribe", "--hold"}
_SLURM_TIME = re.compile(
    r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2})$"
)
_SLURM_SIGNAL = re.compile(r"^(?:[RB]{1,2}:)?(?:SIG)?[A-Z0-9]+(?:@\d+)?$")
_SLURM_ARRAY = re.compile(r"^(\d+(-\d+(:\d+)?)?)(,\d+(-\d+(:\d+)?)?)*(%\d+)?$")


def check_script(script: str) -> list[str]:
    found, problems = lint.directives(script, "#SBATCH")
    for line, name, value in lint.options(found, _SLURM_VALUE, _SLURM_FLAGS, problems, "sbatch"):
        if name == "--time" and not _SLURM_TIME.match(value or ""):
            problems.append(
                f"line {line}: --time={value} is not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH:MM:SS)"
            )
        if name == "--signal" and not _SLURM_SIGNAL.match(value or ""):
            problems.append(f"line {line}: --signal={value} is not [B:]SIG[@SECONDS]")
        if name == "--array" and not _SLURM_ARRAY.match(value or ""):
            problems.append(f"line {line}: --array={value} is not a Slurm index list (0-9, 1,3,5, 0-9:2%4)")
        if (
            name in ("--nodes", "--ntasks-per-node", "--cpus-per-task", "--gpus-per-node")
            and lint.int_or_none(value) is None
        ):
            problems.append(f"line {line}: {name}={value} must be a whole number")
    return problems


def slurm_time(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    return f"{days}-{format_clock(rest)}" if days else format_clock(rest)


def _unanswered(job_id: str, exc: SchedulerError) -> SchedulerError:
    return SchedulerError(
        f"{exc}; job {job_id} may still be queued or running: ask again once Slurm's controller answers"
    )


class Slurm(Scheduler):
    name = facts.PLATFORM.name
    rank_variable = f"${{{facts.RANK}:?not started by srun}}"
    local_rank_variable = f"${{{facts.LOCAL_RANK}:?not started by srun}}"
    array_variable = facts.ARRAY_INDEX
    job_id_variable = facts.JOB_ID
    # Slurm sends --signal up to 60 s earlier than asked (its event resolution): more lead than elsewhere.
    checkpoint_signal = SignalSpec("USR2", 180)

    @classmethod
    def detect(cls) -> bool:
        return shutil.which("sbatch") is not None

    def directives(self, job: JobSpec, site: SiteConfig) -> list[str]:
        lines = [
            f"--job-name={job.job_name}",
            f"--nodes={job.nodes}",
            f"--ntasks-per-node={job.resolved_ranks_per_node}",
            f"--cpus-per-task={job.resolved_cpus_per_rank}",
        ]
        if job.gpus_per_node:
            lines.append(f"--gpus-per-node={job.gpus_per_node}")
        lines.append(f"--time={slurm_time(job.walltime_seconds)}")
        for option, value in (
            ("account", job.account),
            ("partition", job.partition),
            ("qos", job.qos),
            ("constraint", job.constraint),
        ):
            if value:
                lines.append(f"--{option}={value}")
        output = self.resolved_output(job)
        if output:
            lines.append(f"--output={self.output_path(output, job)}")
        if job.error:
            lines.append(f"--error={self.output_path(job.error, job)}")
        if job.array or job.sweep:
            lines.append(f"--array={self._array(job)}")
        if job.signal:
            lines.append(f"--signal=B:{job.signal.name}@{job.signal.seconds}")
        if job.requeue:
            lines += ["--requeue", "--open-mode=append"]
        lines += site.extra_directives
        return lines

    def _array(self, job: JobSpec) -> str:
        if job.sweep:
            return f"0-{len(job.sweep) - 1}"
        assert job.array is not None
        spec = job.array
        text = (
            f"{spec.first}-{spec.last}" + (f":{spec.step}" if spec.step > 1 else "")
            if spec.is_range
            else ",".join(str(i) for i in spec.indices)
        )
        return text + (f"%{spec.max_concurrent}" if spec.max_concurrent else "")

    def output_path(self, pattern: str, job: JobSpec) -> str:
        job_id = "%A" if (job.array or job.sweep) else "%j"
        return pattern.replace("{name}", "%x").replace("{job_id}", job_id).replace("{array_index}", "%a")

    def launcher(self, job: JobSpec) -> list[str]:
        return [
            "srun",
            f"--nodes={job.nodes}",
            f"--ntasks={job.total_ranks}",
            f"--ntasks-per-node={job.resolved_ranks_per_node}",
            f"--cpus-per-task={job.resolved_cpus_per_rank}",
            "--kill-on-bad-exit=1",
        ]

    def signal_parts(self, job: JobSpec) -> tuple[Optional[int], Optional[str]]:
        # Slurm itself signals the batch shell (--signal=B:...); the script forwards it to srun.
        return None, f'scontrol requeue "${self.job_id_variable}"' if job.requeue else None

    def validate(self, script: str, site: SiteConfig) -> list[str]:
        return check_script(script)

    def submit(self, script: Path, workdir: Path) -> str:
        out = run_command(["sbatch", "--parsable", str(script)], "submit the job to Slurm", cwd=workdir)
        job_id = out.strip().split(";")[0]
        if not re.fullmatch(r"\d+", job_id):
            raise SchedulerError(f"sbatch answered {out.strip()!r}, which holds no job id")
        return job_id

    def check_submission(self, script: Path, workdir: Path) -> None:
        run_command(["sbatch", "--test-only", str(script)], "have Slurm check the job", cwd=workdir)

    def status(self, job_id: str) -> list[JobState]:
        try:
            out = run_command(
                ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i|%T"], f"ask Slurm about {job_id}"
            )
        except SchedulerError as exc:
            if "Invalid job id" not in str(exc):  # the controller did not answer: nothing is known
                raise _unanswered(job_id, exc) from None
            out = ""
        states = []
        for line in out.splitlines():
            task, _, native = line.strip().partition("|")
            states.append(JobState(task, _STATES.get(native, "UNKNOWN"), native))
        if states:
            return states
        return self._accounting_status(job_id)

    def _accounting_status(self, job_id: str) -> list[JobState]:
        try:
            out = run_command(
                ["sacct", "-n", "-X", "-P", "-j", job_id, "--format=JobID,State"],
                f"ask Slurm's accounting about {job_id}",
            )
        except SchedulerError as exc:
            if "accounting storage is disabled" not in str(exc):
                raise _unanswered(job_id, exc) from None
            out = ""
        states = []
        for line in out.splitlines():
            task, _, native = line.strip().partition("|")
            native = native.split()[0] if native else ""
            states.append(JobState(task, _STATES.get(native, "UNKNOWN"), native))
        if not states:
            raise JobUnknownError(
                f"Slurm does not know job {job_id}: it never existed, or it ended more than MinJobAge ago "
                "and this cluster keeps no accounting (sacct)"
            )
        return states

    def cancel(self, job_id: str) -> None:
        run_command(["scancel", job_id], f"cancel Slurm job {job_id}")

    def log_files(self, job_id: str) -> list[Path]:
        """StdOut/StdErr of a job Slurm still remembers (empty when it has forgotten it)."""
        try:
            out = run_command(["scontrol", "-o", "show", "job", job_id], f"ask Slurm about {job_id}")
        except SchedulerError:
            return []
        paths: list[Path] = []
        for match in re.finditer(r"\bStd(?:Out|Err)=(\S+)", out):
            path = Path(match.group(1))
            if path not in paths:
                paths.append(path)
        return paths
