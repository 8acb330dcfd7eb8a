"""LSF (Summit-style): ``#BSUB`` directives, ``jsrun`` resource sets, bsub/bjobs/bkill."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Optional

from hpcdl.platforms import lsf as facts
from hpcdl.schedulers import lint
from hpcdl.schedulers.base import JobState, Scheduler, run_command
from hpcdl.schedulers.errors import JobSpecError, JobUnknownError, SchedulerError
from hpcdl.schedulers.job import JobSpec
from hpcdl.schedulers.site import SiteConfig

_STATES = {
    "PEND": "PENDING",
    "WAIT": "PENDING",
    "RUN": "RUNNING",
    "DONE": "COMPLETED",
    "EXIT": "FAILED",
    "PSUSP": "HELD",
    "USUSP": "SUSPENDED",
    "SSUSP": "SUSPENDED",
    "ZOMBI": "FAILED",
    "UNKWN": "UNKNOWN",
}


# ---- LSF with jsrun (Summit-style) -------------------------------------------------------------------

_LSF_VALUE = {
    "-P",
    "-W",
    "-nnodes",
    "-n",
    "-J",
    "-o",
    "-e",
    "-q",
    "-alloc_flags",
    "-G",
    "-u",
    "-env",
    "-R",
    "-w",
    "-wa",
    "-wt",
    "-b",
    "-app",
    "-sla",
    "-U",
    "-cwd",
    "-outdir",
    "-M",
    "-m",
    "-L",
    "-We",
}
_LSF_FLAGS = {"-r", "-rn", "-B", "-N", "-x", "-I", "-K"}
_LSF_TIME = re.compile(r"^(\d+|\d+:[0-5]?\d)$")
_LSF_NAME = re.compile(r"^([^\[\]\s]+)(\[(\d+)(-(\d+)(:\d+)?)?(,(\d+)(-(\d+)(:\d+)?)?)*\])?(%\d+)?$")
_JSRUN_VALUE = {
    "-n",
    "--nrs",
    "-a",
    "--tasks_per_rs",
    "-c",
    "--cpu_per_rs",
    "-g",
    "--gpu_per_rs",
    "-r",
    "--rs_per_host",
    "-b",
    "--bind",
    "--smpiargs",
    "-d",
    "--launch_distribution",
    "-l",
    "--latency_priority",
    "-E",
    "--env",
    "--erf_input",
}
_JSRUN_FLAGS: set[str] = set()


def check_script(
    script: str, gpus_per_node: Optional[int] = None, cpus_per_node: Optional[int] = None
) -> list[str]:
    found, problems = lint.directives(script, "#BSUB")
    nodes: Optional[int] = None
    for line, name, value in lint.options(found, _LSF_VALUE, _LSF_FLAGS, problems, "bsub"):
        value = value or ""
        if name == "-nnodes":
            nodes = lint.int_or_none(value)
            if not nodes:
                problems.append(f"line {line}: -nnodes {value} must be a positive node count")
        elif name in ("-W", "-We") and not _LSF_TIME.match(value):
            problems.append(f"line {line}: {name} {value} must be [HOURS:]MINUTES")
        elif name == "-J":
            match = _LSF_NAME.match(value)
            if not match:
                problems.append(f"line {line}: -J {value!r} must be NAME or NAME[START-END[:STEP]][%LIMIT]")
            elif match.group(2) and re.search(r"[\[,]0(\D|$)", match.group(2)):
                problems.append(f"line {line}: -J {value}: LSF array indices start at 1")
        elif name == "-wt" and not _LSF_TIME.match(value):
            problems.append(f"line {line}: -wt {value} must be [HOURS:]MINUTES")
    if nodes is None:
        problems.append("no #BSUB -nnodes NODES: jsrun jobs need the node count")
    for argv in lint.launch_lines(script, "jsrun"):
        values, unknown = lint.flag_values(argv, _JSRUN_VALUE, _JSRUN_FLAGS)
        problems += [f"jsrun: unknown option {u!r}" for u in unknown]
        sets = lint.int_or_none(values.get("-n", values.get("--nrs")))
        per_host = lint.int_or_none(values.get("-r", values.get("--rs_per_host")))
        gpus = lint.int_or_none(values.get("-g", values.get("--gpu_per_rs"))) or 0
        cpus = lint.int_or_none(values.get("-c", values.get("--cpu_per_rs"))) or 1
        if sets is None or per_host is None:
            problems.append("jsrun needs -n RESOURCE_SETS and -r RESOURCE_SETS_PER_HOST")
            continue
        if nodes is not None and sets > nodes * per_host:
            problems.append(
                f"jsrun -n {sets} -r {per_host} needs {-(-sets // per_host)} nodes; the job has {nodes}"
            )
        if gpus_per_node is not None and gpus * per_host > gpus_per_node:
            problems.append(
                f"jsrun -g {gpus} -r {per_host} needs {gpus * per_host} GPUs per node; "
                f"nodes have {gpus_per_node}"
            )
        if cpus_per_node is not None and cpus * per_host > cpus_per_node:
            problems.append(
                f"jsrun -c {cpus} -r {per_host} needs {cpus * per_host} CPUs per node; "
                f"nodes have {cpus_per_node}"
            )
    return problems


def lsf_time(seconds: int) -> str:
    minutes = -(-seconds // 60)
    return f"{minutes // 60}:{minutes % 60:02d}"


def parse_bsub_answer(text: str) -> str:
    """The id in bsub's ``Job <1234> is submitted to queue <batch>.``"""
    match = re.search(r"Job <(\d+)> is submitted", text)
    if not match:
        raise SchedulerError(f"bsub answered {text.strip()!r}, which holds no job id")
    return match.group(1)


def parse_bjobs(job_id: str, text: str) -> list[JobState]:
    """States from ``bjobs -noheader -o "jobid jobindex stat delimiter='|'"`` (one line per array element)."""
    states = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 3:
            task = fields[0] if fields[1] in ("0", "") else f"{fields[0]}[{fields[1]}]"
            states.append(JobState(task, _STATES.get(fields[2], "UNKNOWN"), fields[2]))
    if not states:
        raise JobUnknownError(f"LSF does not list job {job_id} (bjobs printed {text.strip()!r})")
    return states


class Lsf(Scheduler):
    name = facts.PLATFORM.name
    rank_variable = f"${{{facts.RANK}:?not started by jsrun}}"
    local_rank_variable = f"${{{facts.LOCAL_RANK}:?not started by jsrun}}"
    job_id_variable = facts.JOB_ID
    array_variable = facts.ARRAY_INDEX
    array_base = 1

    @classmethod
    def detect(cls) -> bool:
        return shutil.which("bsub") is not None

    def check_supported(self, job: JobSpec) -> None:
        if job.array and job.array.first < 1:
            raise JobSpecError("LSF array indices start at 1; shift the --array range (e.g. 1-10)")
        if job.qos:
            raise JobSpecError("LSF has no QoS directive; use -sla through the site's extra_directives")

    def directives(self, job: JobSpec, site: SiteConfig) -> list[str]:
        name = job.job_name
        if job.array or job.sweep:
            name += f"[{self._array(job)}]"
            if job.array and job.array.max_concurrent:
                name += f"%{job.array.max_concurrent}"
        lines = [f"-J {name}", f"-nnodes {job.nodes}", f"-W {lsf_time(job.walltime_seconds)}"]
        if job.account:
            lines.append(f"-P {job.account}")
        if job.partition:
            lines.append(f"-q {job.partition}")
        if job.constraint:
            lines.append(f"-R select[{job.constraint}]")
        output = self.resolved_output(job)
        if output:
            lines.append(f"-o {self.output_path(output, job)}")
        if job.error:
            lines.append(f"-e {self.output_path(job.error, job)}")
        if job.requeue:
            lines.append("-r")
        return [*lines, *site.extra_directives]

    def _array(self, job: JobSpec) -> str:
        if job.sweep:
            return f"1-{len(job.sweep)}"
        assert job.array is not None
        if not job.array.is_range:
            return ",".join(str(i) for i in job.array.indices)
        step = f":{job.array.step}" if job.array.step > 1 else ""
        return f"{job.array.first}-{job.array.last}{step}"

    def output_path(self, pattern: str, job: JobSpec) -> str:
        return (
            pattern.replace("{name}", job.job_name).replace("{job_id}", "%J").replace("{array_index}", "%I")
        )

    def launcher(self, job: JobSpec) -> list[str]:
        per_rank, sharing = job.gpu_slice if job.gpus_per_node else (0, 1)
        ranks, cpus = job.resolved_ranks_per_node, job.resolved_cpus_per_rank
        # One resource set per rank; ranks sharing a GPU share one resource set holding it.
        sets_per_node, tasks, gpus = (ranks // sharing, sharing, 1) if sharing > 1 else (ranks, 1, per_rank)
        return [
            "jsrun",
            "-n",
            str(job.nodes * sets_per_node),
            "-r",
            str(sets_per_node),
            "-a",
            str(tasks),
            "-c",
            str(cpus * tasks),
            "-g",
            str(gpus),
            "-b",
            f"packed:{cpus}",
        ]

    def first_node_prefix(self) -> list[str]:
        # The script runs on a launch node; the first resource set lands on the first compute node.
        return ["jsrun", "-n", "1", "-r", "1", "-a", "1", "-c", "1"]

    def signal_parts(self, job: JobSpec) -> tuple[Optional[int], Optional[str]]:
        assert job.signal is not None
        requeue = f'brequeue "${self.job_id_variable}"' if job.requeue else None
        return job.walltime_seconds - job.signal.seconds, requeue

    def validate(self, script: str, site: SiteConfig) -> list[str]:
        return check_script(script, site.gpus_per_node, site.cpus_per_node)

    def submit(self, script: Path, workdir: Path) -> str:
        out = run_command(["bsub"], "submit the job to LSF", stdin=script.read_text(), cwd=workdir)
        return parse_bsub_answer(out)

    def status(self, job_id: str) -> list[JobState]:
        argv = ["bjobs", "-noheader", "-o", "jobid jobindex stat delimiter='|'", job_id]
        try:
            out = run_command(argv, f"ask LSF about {job_id}")
        except SchedulerError as exc:
            if "is not found" in str(exc):  # LSF answered: it has forgotten the job
                raise JobUnknownError(str(exc)) from None
            raise
        return parse_bjobs(job_id, out)

    def cancel(self, job_id: str) -> None:
        run_command(["bkill", job_id], f"cancel LSF job {job_id}")
