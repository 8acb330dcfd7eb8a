"""PBS Pro / OpenPBS: ``#PBS`` directives with a ``select`` statement, Cray PALS ``mpiexec`` launch."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from hpcdl.schedulers import lint
from hpcdl.schedulers.base import JobState, Scheduler, run_command
from hpcdl.schedulers.errors import JobSpecError, JobUnknownError, SchedulerError
from hpcdl.schedulers.job import JobSpec, format_clock
from hpcdl.schedulers.probe import qsub_flavour
from hpcdl.schedulers.site import SiteConfig

_STATES = {
    "Q": "PENDING",
    "W": "PENDING",
    "T": "PENDING",
    "R": "RUNNING",
    "E": "RUNNING",
    "B": "RUNNING",
    "H": "HELD",
    "S": "SUSPENDED",
    "U": "SUSPENDED",
    "F": "COMPLETED",
    "X": "COMPLETED",
    "M": "PENDING",
}


def parse_qsub_answer(text: str) -> str:
    """The job id PBS's qsub prints (``1234.server``, arrays ``1234[].server``)."""
    answer = text.strip()
    if not re.fullmatch(r"\d+(\[\])?(\.\S+)?", answer):
        raise SchedulerError(f"qsub answered {answer!r}, which holds no PBS job id")
    return answer


def parse_qstat_full(job_id: str, text: str) -> list[JobState]:
    """States from ``qstat -x -f`` (one ``Job Id:`` block per job or subjob)."""
    states = []
    for match in re.finditer(r"^Job Id:\s*(\S+).*?^\s*job_state = (\w)", text, re.MULTILINE | re.DOTALL):
        states.append(JobState(match.group(1), _STATES.get(match.group(2), "UNKNOWN"), match.group(2)))
    if not states:
        raise SchedulerError(f"qstat printed no job_state for {job_id}:\n{text.strip()}")
    return states


class Pbs(Scheduler):
    name = "pbs"
    rank_variable = "${PALS_RANKID:-${PMI_RANK:?not started by mpiexec}}"
    local_rank_variable = "${PALS_LOCAL_RANKID:-${PMI_LOCAL_RANK:?not started by mpiexec}}"
    job_id_variable = "PBS_JOBID"
    array_variable = "PBS_ARRAY_INDEX"

    @classmethod
    def detect(cls) -> bool:
        return qsub_flavour() == "pbs"

    def check_supported(self, job: JobSpec) -> None:
        if job.array and (not job.array.is_range or len(job.array.indices) < 2):
            raise JobSpecError("PBS arrays must be a range START-END[:STEP] with END > START (-J)")

    def default_output(self, job: JobSpec) -> Optional[str]:
        return None  # PBS writes NAME.oSEQ in the submission directory

    def directives(self, job: JobSpec, site: SiteConfig) -> list[str]:
        chunk = [f"{job.nodes}", f"ncpus={job.resolved_ranks_per_node * job.resolved_cpus_per_rank}"]
        if job.gpus_per_node:
            chunk.append(f"ngpus={job.gpus_per_node}")
        chunk += [f"mpiprocs={job.resolved_ranks_per_node}", f"ompthreads={job.resolved_cpus_per_rank}"]
        chunk += site.pbs_chunk_resources
        lines = [
            f"-N {job.job_name}",
            f"-l select={':'.join(chunk)}",
            "-l place=scatter",
            f"-l walltime={format_clock(job.walltime_seconds)}",
        ]
        if job.partition:
            lines.append(f"-q {job.partition}")
        if job.account:
            lines.append(f"-A {job.account}")
        if job.qos or job.constraint:
            raise JobSpecError(
                "PBS has no QoS or constraint directive; put site resources in pbs_chunk_resources"
            )
        lines.append("-j oe" if not job.error else f"-e {self.output_path(job.error, job)}")
        if job.output:
            lines.append(f"-o {self.output_path(job.output, job)}")
        if job.array:
            step = f":{job.array.step}" if job.array.step > 1 else ""
            limit = f"%{job.array.max_concurrent}" if job.array.max_concurrent else ""
            lines.append(f"-J {job.array.first}-{job.array.last}{step}{limit}")
        elif job.sweep:
            if len(job.sweep) < 2:
                raise JobSpecError("a PBS array needs at least two sweep points")
            lines.append(f"-J 0-{len(job.sweep) - 1}")
        lines.append(f"-r {'y' if job.requeue else 'n'}")
        return [*lines, *site.extra_directives]

    def output_path(self, pattern: str, job: JobSpec) -> str:
        if "{" in pattern:
            raise JobSpecError(
                f"PBS cannot put the job id or name into {pattern!r}; give a fixed path, "
                "or leave --stdout out to get PBS's NAME.oJOBID"
            )
        return pattern

    def workdir_command(self) -> Optional[str]:
        return 'cd "${PBS_O_WORKDIR:-.}" || exit 1'

    def launcher(self, job: JobSpec) -> list[str]:
        return [
            "mpiexec",
            "-n",
            str(job.total_ranks),
            "--ppn",
            str(job.resolved_ranks_per_node),
            "--depth",
            str(job.resolved_cpus_per_rank),
            "--cpu-bind",
            "depth",
            "--env",
            f"OMP_NUM_THREADS={job.resolved_cpus_per_rank}",
        ]

    def signal_parts(self, job: JobSpec) -> tuple[Optional[int], Optional[str]]:
        assert job.signal is not None
        requeue = f'qrerun "${self.job_id_variable}"' if job.requeue else None
        return job.walltime_seconds - job.signal.seconds, requeue

    def validate(self, script: str, site: SiteConfig) -> list[str]:
        names = {item.partition("=")[0] for item in site.pbs_chunk_resources}
        names |= {d.split()[1].partition("=")[0] for d in site.extra_directives if d.startswith("-l ")}
        return lint.check_pbs(script, names, site.cpus_per_node)

    def submit(self, script: Path, workdir: Path) -> str:
        return parse_qsub_answer(run_command(["qsub", str(script)], "submit the job to PBS", cwd=workdir))

    def status(self, job_id: str) -> list[JobState]:
        try:
            out = run_command(["qstat", "-x", "-f", job_id], f"ask PBS about {job_id}")
        except SchedulerError as exc:
            if "Unknown Job Id" in str(exc):  # PBS answered: it has forgotten the job
                raise JobUnknownError(str(exc)) from None
            raise
        return parse_qstat_full(job_id, out)

    def cancel(self, job_id: str) -> None:
        run_command(["qdel", job_id], f"cancel PBS job {job_id}")

    def log_globs(self, job: JobSpec) -> list[str]:
        if job.output or job.error:
            return [p for p in (job.output, job.error) if p]
        suffix = ".*" if (job.array or job.sweep) else ""
        return [f"{job.job_name}.o{{job_number}}{suffix}"]
