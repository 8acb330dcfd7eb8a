"""PBS Pro / OpenPBS: ``#PBS`` directives with a ``select`` statement, Cray PALS ``mpiexec`` launch."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hpcdl.platforms import pbs as facts
from hpcdl.schedulers import lint
from hpcdl.schedulers.base import JobState, Scheduler, run_command
from hpcdl.schedulers.errors import JobSpecError, JobUnknownError, SchedulerError
from hpcdl.schedulers.job import JobSpec, format_clock
from hpcdl.schedulers.probe import qsub_version
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


# ---- PBS Pro / OpenPBS ------------------------------------------------------------------------------

_PBS_VALUE = {
    "-N",
    "-l",
    "-q",
    "-A",
    "-j",
    "-o",
    "-e",
    "-J",
    "-r",
    "-v",
    "-m",
    "-M",
    "-W",
    "-S",
    "-k",
    "-P",
    "-a",
    "-p",
    "-c",
    "-u",
}
_PBS_FLAGS = {"-V", "-h", "-z", "-X"}
_PBS_JOB_RESOURCES = {
    "select",
    "place",
    "walltime",
    "filesystems",
    "cput",
    "pcput",
    "software",
    "mem",
    "site",
    "max_walltime",
    "min_walltime",
    "preempt_targets",
}
_PBS_OLD_STYLE = {"nodes", "ncpus", "ngpus", "mpiprocs"}
_PBS_CHUNK_RESOURCES = {
    "ncpus",
    "ngpus",
    "mpiprocs",
    "ompthreads",
    "mem",
    "vmem",
    "host",
    "vnode",
    "arch",
    "aoe",
    "accelerator",
    "naccelerators",
    "accelerator_model",
    "nchunk",
}
_PBS_INT_RESOURCES = {"ncpus", "ngpus", "mpiprocs", "ompthreads", "naccelerators"}
_PBS_WALLTIME = re.compile(r"^(\d+|\d+:[0-5]?\d|\d+:[0-5]?\d:[0-5]?\d)(\.\d+)?$")
_PBS_SIZE = re.compile(r"^\d+([kmgtp]?[bw])?$", re.IGNORECASE)
_PBS_PLACE = re.compile(r"^(free|pack|scatter|vscatter)?(:?(excl|shared|exclhost))?(:?group=\w+)?$")
_PBS_ARRAY = re.compile(r"^(\d+)-(\d+)(?::(\d+))?(%\d+)?$")
_PBS_NAME = re.compile(r"^[A-Za-z][^\s@#:]{0,235}$")


@dataclass(frozen=True)
class Chunk:
    count: int
    resources: dict[str, str]


def parse_select(statement: str, site_resources: set[str]) -> tuple[list[Chunk], list[str]]:
    """PBS ``select=`` value: ``[N:]res=val[:res=val]...[+[N:]res=val...]``; chunks and problems."""
    chunks: list[Chunk] = []
    problems: list[str] = []
    known = _PBS_CHUNK_RESOURCES | site_resources
    for spec in statement.split("+"):
        parts = spec.split(":")
        count = 1
        if parts and parts[0].isdigit():
            count = int(parts.pop(0))
            if count < 1:
                problems.append(f"select chunk {spec!r}: the chunk count must be at least 1")
        if not parts:
            problems.append(f"select chunk {spec!r} names no resources (write e.g. 2:ncpus=64)")
            continue
        resources: dict[str, str] = {}
        for part in parts:
            name, eq, value = part.partition("=")
            if not eq or not name or not value:
                problems.append(f"select chunk {spec!r}: {part!r} is not RESOURCE=VALUE")
            elif name not in known:
                problems.append(
                    f"select chunk {spec!r}: unknown resource {name!r} (known: {', '.join(sorted(known))}; "
                    "add site-defined ones to pbs_chunk_resources in the site file)"
                )
            elif name in _PBS_INT_RESOURCES and not value.isdigit():
                problems.append(f"select chunk {spec!r}: {name}={value} must be a whole number")
            elif name in ("mem", "vmem") and not _PBS_SIZE.match(value):
                problems.append(f"select chunk {spec!r}: {name}={value} is not a size such as 16gb")
            else:
                resources[name] = value
        chunks.append(Chunk(count, resources))
    return chunks, problems


def _split_resource_list(value: str) -> list[str]:
    """``-l a=1,b=2`` into items; ``select`` keeps its own commas-free grammar."""
    return [item for item in value.split(",") if item]


_MPIEXEC_VALUE = {
    "-n",
    "--np",
    "-np",
    "--ppn",
    "-ppn",
    "--depth",
    "-d",
    "--cpu-bind",
    "--env",
    "-env",
    "--hostfile",
    "--mem-bind",
    "--line-buffer-size",
}
_MPIEXEC_FLAGS = {"--no-transfer", "--label", "-l", "--line-buffer"}


def check_script(
    script: str, site_resources: Optional[set[str]] = None, cpus_per_node: Optional[int] = None
) -> list[str]:
    found, problems = lint.directives(script, "#PBS")
    chunks: list[Chunk] = []
    resources_seen: set[str] = set()
    for line, name, value in lint.options(found, _PBS_VALUE, _PBS_FLAGS, problems, "qsub (PBS)"):
        value = value or ""
        if name == "-N" and not _PBS_NAME.match(value):
            problems.append(
                f"line {line}: job name {value!r} must start with a letter, at most 236 characters"
            )
        elif name == "-j" and value not in ("oe", "eo", "n"):
            problems.append(f"line {line}: -j {value} must be oe, eo or n")
        elif name == "-r" and value not in ("y", "n"):
            problems.append(f"line {line}: -r {value} must be y or n")
        elif name == "-J":
            match = _PBS_ARRAY.match(value)
            if not match or int(match.group(2)) <= int(match.group(1)):
                problems.append(f"line {line}: -J {value} must be START-END[:STEP] with END > START")
        elif name == "-l":
            for item in _split_resource_list(value):
                resource, eq, setting = item.partition("=")
                resources_seen.add(resource)
                if not eq or not setting:
                    problems.append(f"line {line}: -l {item!r} is not RESOURCE=VALUE")
                elif resource == "select":
                    parsed, chunk_problems = parse_select(setting, site_resources or set())
                    chunks += parsed
                    problems += [f"line {line}: {p}" for p in chunk_problems]
                elif resource == "walltime" and not _PBS_WALLTIME.match(setting):
                    problems.append(f"line {line}: walltime={setting} is not [[HH:]MM:]SS")
                elif resource == "place" and not _PBS_PLACE.match(setting):
                    problems.append(
                        f"line {line}: place={setting} is not ARRANGEMENT[:SHARING][:group=RES] "
                        "(free|pack|scatter|vscatter, excl|shared|exclhost)"
                    )
                elif resource not in _PBS_JOB_RESOURCES | _PBS_OLD_STYLE | (site_resources or set()):
                    problems.append(f"line {line}: unknown job resource {resource!r}")
    if "select" in resources_seen and resources_seen & _PBS_OLD_STYLE:
        old = ", ".join(sorted(resources_seen & _PBS_OLD_STYLE))
        problems.append(
            f"-l select cannot be combined with old-style {old}; put them inside the select chunk"
        )
    problems += _check_mpiexec(script, chunks, cpus_per_node)
    return problems


def _check_mpiexec(script: str, chunks: list[Chunk], cpus_per_node: Optional[int]) -> list[str]:
    problems: list[str] = []
    nodes = sum(c.count for c in chunks)
    ranks = sum(c.count * int(c.resources.get("mpiprocs", "1")) for c in chunks)
    for argv in lint.launch_lines(script, "mpiexec"):
        values, unknown = lint.flag_values(argv, _MPIEXEC_VALUE, _MPIEXEC_FLAGS)
        problems += [f"mpiexec: unknown option {u!r}" for u in unknown]
        total = lint.int_or_none(values.get("-n", values.get("--np", values.get("-np"))))
        ppn = lint.int_or_none(values.get("--ppn", values.get("-ppn")))
        depth = lint.int_or_none(values.get("--depth", values.get("-d"))) or 1
        if chunks and total is not None and total > ranks:
            problems.append(f"mpiexec -n {total} asks for more ranks than select provides ({ranks} mpiprocs)")
        if chunks and ppn is not None and total is not None and total > ppn * nodes:
            problems.append(
                f"mpiexec -n {total} --ppn {ppn} needs {-(-total // ppn)} nodes; select has {nodes}"
            )
        for chunk in chunks:
            ncpus = lint.int_or_none(chunk.resources.get("ncpus"))
            if ppn and ncpus is not None and ppn * depth > ncpus:
                problems.append(
                    f"mpiexec --ppn {ppn} --depth {depth} needs {ppn * depth} CPUs; chunks have {ncpus}"
                )
        if cpus_per_node and ppn and ppn * depth > cpus_per_node:
            problems.append(
                f"mpiexec --ppn {ppn} --depth {depth} needs more than the {cpus_per_node} CPUs a node has"
            )
    return problems


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
    name = facts.PLATFORM.name
    rank_variable = facts.SCRIPT_RANK
    local_rank_variable = facts.SCRIPT_LOCAL_RANK
    job_id_variable = facts.JOB_ID
    array_variable = facts.ARRAY_INDEX

    @classmethod
    def detect(cls) -> bool:
        return "pbs_version" in qsub_version()

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
        return f'cd "${{{facts.WORKDIR}:-.}}" || exit 1'

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
        return check_script(script, names, site.cpus_per_node)

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
