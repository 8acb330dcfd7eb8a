"""Cobalt (ALCF Theta): ``#COBALT`` directives, ALPS ``aprun -n -N -d -cc depth`` launch."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Optional

from hpcdl.platforms import cobalt as facts
from hpcdl.schedulers import lint
from hpcdl.schedulers.base import JobState, Scheduler, run_command
from hpcdl.schedulers.errors import JobSpecError, JobUnknownError, SchedulerError
from hpcdl.schedulers.job import JobSpec
from hpcdl.schedulers.probe import qsub_version
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


# ---- Cobalt (ALCF Theta) with ALPS aprun -------------------------------------------------------------

_COBALT_VALUE = {
    "-n",
    "--nodecount",
    "-t",
    "--time",
    "-q",
    "--queue",
    "-A",
    "--project",
    "--attrs",
    "-O",
    "--outputprefix",
    "-o",
    "--output",
    "-e",
    "--error",
    "--env",
    "-M",
    "--notify",
    "--dependencies",
    "--proccount",
    "--mode",
    "-i",
    "--inputfile",
}
_COBALT_FLAGS = {"--disable_preboot"}
_COBALT_TIME = re.compile(r"^(\d+|\d+:[0-5]\d:[0-5]\d)$")
_COBALT_ATTRS = re.compile(r"^\w+=[\w.-]+(:\w+=[\w.-]+)*$")
_APRUN_VALUE = {"-n", "-N", "-d", "-cc", "-j", "-e", "-S", "-r", "-p", "-m", "-L"}
_APRUN_FLAGS = {"-b", "-q", "-ss", "-T"}


def check_script(script: str, cpus_per_node: Optional[int] = None) -> list[str]:
    found, problems = lint.directives(script, "#COBALT")
    nodes: Optional[int] = None
    for line, name, value in lint.options(found, _COBALT_VALUE, _COBALT_FLAGS, problems, "qsub (Cobalt)"):
        value = value or ""
        if name in ("-n", "--nodecount"):
            nodes = lint.int_or_none(value)
            if not nodes:
                problems.append(f"line {line}: -n {value} must be a positive node count")
        elif name in ("-t", "--time") and not _COBALT_TIME.match(value):
            problems.append(f"line {line}: -t {value} must be minutes or HH:MM:SS")
        elif name == "--attrs" and not _COBALT_ATTRS.match(value):
            problems.append(f"line {line}: --attrs {value} must be KEY=VALUE[:KEY=VALUE...]")
        elif name == "--env" and not all("=" in item for item in value.split(":")):
            problems.append(f"line {line}: --env {value} must be VAR=VALUE[:VAR=VALUE...]")
    if nodes is None:
        problems.append("no #COBALT -n NODES: Cobalt needs the node count")
    for argv in lint.launch_lines(script, "aprun"):
        values, unknown = lint.flag_values(argv, _APRUN_VALUE, _APRUN_FLAGS)
        problems += [f"aprun: unknown option {u!r}" for u in unknown]
        total, per_node, depth = (
            lint.int_or_none(values.get("-n")),
            lint.int_or_none(values.get("-N")),
            lint.int_or_none(values.get("-d")) or 1,
        )
        if total is None or per_node is None:
            problems.append("aprun needs -n TOTAL_RANKS and -N RANKS_PER_NODE")
            continue
        if nodes is not None and total > nodes * per_node:
            problems.append(
                f"aprun -n {total} -N {per_node} needs {-(-total // per_node)} nodes; the job has {nodes}"
            )
        if nodes is not None and total <= (nodes - 1) * per_node:
            problems.append(f"aprun -n {total} -N {per_node} leaves nodes of the {nodes}-node job idle")
        if depth > 1 and values.get("-cc") != "depth":
            problems.append(f"aprun -d {depth} without -cc depth packs threads onto one core; add -cc depth")
        threads = lint.int_or_none(values.get("-j")) or 1
        if cpus_per_node and per_node * depth > cpus_per_node * threads:
            problems.append(
                f"aprun -N {per_node} -d {depth} needs {per_node * depth} CPUs; a node has {cpus_per_node}"
            )
    return problems


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
    name = facts.PLATFORM.name
    rank_variable = f"${{{facts.RANK}:?not started by aprun}}"
    array_variable = None  # Cobalt has no job arrays
    job_id_variable = facts.JOB_ID
    can_requeue = False

    def local_rank(self, job: JobSpec) -> str:
        # ALPS gives only the global rank; aprun places ranks block-wise, -N per node.
        return f"$(( {facts.RANK} % {job.resolved_ranks_per_node} ))"

    @classmethod
    def detect(cls) -> bool:
        if shutil.which("qsub") is None:
            return False
        return bool(shutil.which("cqstat") or shutil.which("partlist")) or "cobalt" in qsub_version()

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
        return check_script(script, site.cpus_per_node)

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
