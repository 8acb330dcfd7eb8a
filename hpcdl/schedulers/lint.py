"""Checks a batch script the way its scheduler would, for schedulers that cannot run here.

Each ``check_<scheduler>(script, ...)`` returns the problems the real ``qsub``/``bsub``/``flux batch``
(or their launchers) would report: unknown directives, malformed resource statements and walltimes,
launcher geometry that does not fit the allocation. An empty list means no objection.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Optional

# ---- shared helpers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Directive:
    line: int
    args: list[str]


def directives(script: str, prefix: str) -> tuple[list[Directive], list[str]]:
    """Directives in the leading comment block, and problems (directives a scheduler would ignore)."""
    found: list[Directive] = []
    problems: list[str] = []
    body_started = False
    for number, raw in enumerate(script.splitlines(), start=1):
        line = raw.strip()
        if line.startswith(prefix):
            if body_started:
                problems.append(f"line {number}: {prefix} directive after the first command is ignored")
                continue
            try:
                found.append(Directive(number, shlex.split(line[len(prefix) :])))
            except ValueError as exc:
                problems.append(f"line {number}: cannot parse directive ({exc})")
        elif line and not line.startswith("#"):
            body_started = True
    if script and not script.startswith("#!"):
        problems.append("line 1: the script must start with a #! interpreter line")
    return found, problems


def options(
    found: list[Directive], takes_value: set[str], flags: set[str], problems: list[str], scheduler: str
) -> list[tuple[int, str, Optional[str]]]:
    """Split directives into (line, option, value); unknown options are problems."""
    result: list[tuple[int, str, Optional[str]]] = []
    for directive in found:
        args = list(directive.args)
        while args:
            arg = args.pop(0)
            name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
            if name in takes_value:
                if eq:
                    value: Optional[str] = inline
                elif args:
                    value = args.pop(0)
                else:
                    problems.append(f"line {directive.line}: {name} needs a value")
                    continue
                result.append((directive.line, name, value))
            elif name in flags and not eq:
                result.append((directive.line, name, None))
            else:
                problems.append(f"line {directive.line}: {scheduler} does not know the option {arg!r}")
    return result


def launch_lines(script: str, launcher: str) -> list[list[str]]:
    """argv of every line that runs ``launcher`` (a trailing ``&`` dropped)."""
    found = []
    for raw in script.splitlines():
        line = raw.strip()
        if line.startswith(launcher + " "):
            try:
                argv = shlex.split(line)
            except ValueError:
                continue
            found.append(argv[:-1] if argv[-1] == "&" else argv)
    return found


def flag_values(argv: list[str], takes_value: set[str], flags: set[str]) -> tuple[dict[str, str], list[str]]:
    """Launcher options up to the command: {option: value}, and options the launcher does not know."""
    values: dict[str, str] = {}
    unknown: list[str] = []
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        name, eq, inline = argv[i].partition("=")
        if name in takes_value:
            if eq:
                values[name] = inline
            elif i + 1 < len(argv):
                values[name] = argv[i + 1]
                i += 1
        elif name in flags:
            values[name] = ""
        else:
            unknown.append(argv[i])
        i += 1
    return values, unknown


def _int(value: Optional[str]) -> Optional[int]:
    return int(value) if value is not None and value.isdigit() else None


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


def check_slurm(script: str) -> list[str]:
    found, problems = directives(script, "#SBATCH")
    for line, name, value in options(found, _SLURM_VALUE, _SLURM_FLAGS, problems, "sbatch"):
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
            and _int(value) is None
        ):
            problems.append(f"line {line}: {name}={value} must be a whole number")
    return problems


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


def check_pbs(
    script: str, site_resources: Optional[set[str]] = None, cpus_per_node: Optional[int] = None
) -> list[str]:
    found, problems = directives(script, "#PBS")
    chunks: list[Chunk] = []
    resources_seen: set[str] = set()
    for line, name, value in options(found, _PBS_VALUE, _PBS_FLAGS, problems, "qsub (PBS)"):
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
    for argv in launch_lines(script, "mpiexec"):
        values, unknown = flag_values(argv, _MPIEXEC_VALUE, _MPIEXEC_FLAGS)
        problems += [f"mpiexec: unknown option {u!r}" for u in unknown]
        total = _int(values.get("-n", values.get("--np", values.get("-np"))))
        ppn = _int(values.get("--ppn", values.get("-ppn")))
        depth = _int(values.get("--depth", values.get("-d"))) or 1
        if chunks and total is not None and total > ranks:
            problems.append(f"mpiexec -n {total} asks for more ranks than select provides ({ranks} mpiprocs)")
        if chunks and ppn is not None and total is not None and total > ppn * nodes:
            problems.append(
                f"mpiexec -n {total} --ppn {ppn} needs {-(-total // ppn)} nodes; select has {nodes}"
            )
        for chunk in chunks:
            ncpus = _int(chunk.resources.get("ncpus"))
            if ppn and ncpus is not None and ppn * depth > ncpus:
                problems.append(
                    f"mpiexec --ppn {ppn} --depth {depth} needs {ppn * depth} CPUs; chunks have {ncpus}"
                )
        if cpus_per_node and ppn and ppn * depth > cpus_per_node:
            problems.append(
                f"mpiexec --ppn {ppn} --depth {depth} needs more than the {cpus_per_node} CPUs a node has"
            )
    return problems


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


def check_cobalt(script: str, cpus_per_node: Optional[int] = None) -> list[str]:
    found, problems = directives(script, "#COBALT")
    nodes: Optional[int] = None
    for line, name, value in options(found, _COBALT_VALUE, _COBALT_FLAGS, problems, "qsub (Cobalt)"):
        value = value or ""
        if name in ("-n", "--nodecount"):
            nodes = _int(value)
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
    for argv in launch_lines(script, "aprun"):
        values, unknown = flag_values(argv, _APRUN_VALUE, _APRUN_FLAGS)
        problems += [f"aprun: unknown option {u!r}" for u in unknown]
        total, per_node, depth = _int(values.get("-n")), _int(values.get("-N")), _int(values.get("-d")) or 1
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
        threads = _int(values.get("-j")) or 1
        if cpus_per_node and per_node * depth > cpus_per_node * threads:
            problems.append(
                f"aprun -N {per_node} -d {depth} needs {per_node * depth} CPUs; a node has {cpus_per_node}"
            )
    return problems


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


def check_lsf(
    script: str, gpus_per_node: Optional[int] = None, cpus_per_node: Optional[int] = None
) -> list[str]:
    found, problems = directives(script, "#BSUB")
    nodes: Optional[int] = None
    for line, name, value in options(found, _LSF_VALUE, _LSF_FLAGS, problems, "bsub"):
        value = value or ""
        if name == "-nnodes":
            nodes = _int(value)
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
    for argv in launch_lines(script, "jsrun"):
        values, unknown = flag_values(argv, _JSRUN_VALUE, _JSRUN_FLAGS)
        problems += [f"jsrun: unknown option {u!r}" for u in unknown]
        sets = _int(values.get("-n", values.get("--nrs")))
        per_host = _int(values.get("-r", values.get("--rs_per_host")))
        gpus = _int(values.get("-g", values.get("--gpu_per_rs"))) or 0
        cpus = _int(values.get("-c", values.get("--cpu_per_rs"))) or 1
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


def check_flux(script: str) -> list[str]:
    found, problems = directives(script, "# flux:")
    nodes: Optional[int] = None
    for line, name, value in options(found, _FLUX_VALUE, _FLUX_FLAGS, problems, "flux batch"):
        value = value or ""
        if name in ("-N", "--nodes"):
            nodes = _int(value)
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
    for argv in launch_lines(script, "flux"):
        if len(argv) < 2 or argv[1] != "run":
            continue
        values, unknown = flag_values(argv[1:], _FLUX_RUN_VALUE, _FLUX_RUN_FLAGS)
        problems += [f"flux run: unknown option {u!r}" for u in unknown]
        run_nodes = _int(values.get("-N", values.get("--nodes")))
        tasks = _int(values.get("-n", values.get("--ntasks")))
        if nodes is not None and run_nodes is not None and run_nodes > nodes:
            problems.append(f"flux run -N {run_nodes} asks for more nodes than the batch job has ({nodes})")
        if run_nodes is not None and tasks is not None and tasks < run_nodes:
            problems.append(f"flux run -n {tasks} is fewer tasks than nodes (-N {run_nodes})")
    return problems
