"""Hosts of the batch allocation ``hpcdl run`` is started in: Slurm, PBS, LSF, Cobalt or Flux.

Each scheduler leaves its node list in the job's environment (Flux: behind ``flux resource list``).
Slot counts come from the scheduler where it says them (tasks per node, repeated node-file lines);
``--slots-per-host`` overrides them, and where the scheduler says nothing a host gets one slot.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import HostSlots, merge_duplicates

FLUX_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class Allocation:
    scheduler: str
    source: str  # the variable or command the hosts came from
    hosts: list[HostSlots]

    def describe(self) -> str:
        return f"the {self.scheduler} allocation ({self.source})"


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0:
            raise LaunchError(f"host list '{text}' has an unmatched ']'")
        current += char
    if depth != 0:
        raise LaunchError(f"host list '{text}' has an unmatched '['")
    parts.append(current)
    return [part.strip() for part in parts if part.strip()]


def _expand_range(spec: str, context: str) -> list[str]:
    values = []
    for item in spec.split(","):
        first, sep, last = item.partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise LaunchError(f"host list '{context}': cannot read range '{item}' (expected e.g. 01-03)")
        if not sep:
            values.append(first)
            continue
        width = len(first)
        if int(last) < int(first):
            raise LaunchError(f"host list '{context}': range '{item}' runs backwards")
        values.extend(f"{number:0{width}d}" for number in range(int(first), int(last) + 1))
    return values


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm/Flux compressed host list: ``node[01-03,07],gpu5`` -> node01 node02 node03
    node07 gpu5; several bracket groups in one name expand as their product (``r[1-2]n[1-2]``)."""
    hosts: list[str] = []
    for part in _split_top_level(text):
        names = [""]
        for prefix, ranges in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", part):
            suffixes = _expand_range(ranges, text) if ranges else [""]
            names = [name + prefix + suffix for name in names for suffix in suffixes]
        hosts.extend(names)
    return hosts


def expand_counts(text: str) -> list[int]:
    """Expand Slurm's per-node counts: ``2(x3),1`` -> 2 2 2 1."""
    counts = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match:
            raise LaunchError(f"cannot read per-node count '{item}' in '{text}' (expected e.g. 2(x3),1)")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _with_slots(names: list[str], counts: list[int] | None, override: int | None) -> list[HostSlots]:
    if override is not None:
        return merge_duplicates([HostSlots(name, override) for name in names])
    if counts is None:
        counts = [1] * len(names)
    return merge_duplicates([HostSlots(name, count) for name, count in zip(names, counts)])


def _slurm(environ: Mapping[str, str], override: int | None) -> Allocation | None:
    variable = "SLURM_JOB_NODELIST" if "SLURM_JOB_NODELIST" in environ else "SLURM_NODELIST"
    if not environ.get(variable):
        return None
    names = expand_hostlist(environ[variable])
    counts = None
    for count_variable in ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"):
        if environ.get(count_variable):
            counts = expand_counts(environ[count_variable])
            if len(counts) != len(names):
                raise LaunchError(
                    f"{count_variable}={environ[count_variable]} gives {len(counts)} counts for the "
                    f"{len(names)} nodes of {variable}={environ[variable]}; pass -H or --hostfile instead"
                )
            break
    return Allocation("Slurm", f"{variable}={environ[variable]}", _with_slots(names, counts, override))


def _read_nodefile(variable: str, environ: Mapping[str, str]) -> list[str]:
    path = Path(environ[variable])
    try:
        lines = path.read_text().split()
    except OSError as exc:
        raise LaunchError(f"{variable}={path} cannot be read: {exc.strerror}") from None
    if not lines:
        raise LaunchError(f"{variable}={path} lists no hosts")
    return lines


def _pbs(environ: Mapping[str, str], override: int | None) -> Allocation | None:
    if not environ.get("PBS_NODEFILE"):
        return None
    names = _read_nodefile("PBS_NODEFILE", environ)  # one line per slot (mpiprocs)
    return Allocation("PBS", f"PBS_NODEFILE={environ['PBS_NODEFILE']}", _with_slots(names, None, override))


def _lsf(environ: Mapping[str, str], override: int | None) -> Allocation | None:
    if environ.get("LSB_MCPU_HOSTS"):
        words = environ["LSB_MCPU_HOSTS"].split()
        if len(words) % 2 or not all(count.isdigit() for count in words[1::2]):
            raise LaunchError(
                f"LSB_MCPU_HOSTS='{environ['LSB_MCPU_HOSTS']}' is not 'host count host count ...'"
            )
        names, counts = words[0::2], [int(count) for count in words[1::2]]
        return Allocation("LSF", "LSB_MCPU_HOSTS", _with_slots(names, counts, override))
    if environ.get("LSB_HOSTS"):  # one word per slot
        return Allocation("LSF", "LSB_HOSTS", _with_slots(environ["LSB_HOSTS"].split(), None, override))
    return None


def _cobalt(environ: Mapping[str, str], override: int | None) -> Allocation | None:
    if environ.get("COBALT_NODEFILE"):
        names = _read_nodefile("COBALT_NODEFILE", environ)
        source = f"COBALT_NODEFILE={environ['COBALT_NODEFILE']}"
    elif environ.get("COBALT_PARTNAME"):
        # Cray XC node ids (Theta: "3826-3829,3831") name hosts nid03826 ...
        numbers = _expand_range(environ["COBALT_PARTNAME"].replace(" ", ""), environ["COBALT_PARTNAME"])
        names = [f"nid{int(number):05d}" for number in numbers]
        source = f"COBALT_PARTNAME={environ['COBALT_PARTNAME']}"
    else:
        return None
    return Allocation("Cobalt", source, _with_slots(names, None, override))


def parse_flux_resources(text: str, override: int | None) -> list[HostSlots]:
    """Parse ``flux resource list -no '{nnodes} {ncores} {ngpus} {nodelist}'``: a host gets one slot
    per GPU, or per core where it has no GPU."""
    hosts: list[HostSlots] = []
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 4 or not all(f.isdigit() for f in fields[:3]):
            raise LaunchError(f"cannot read flux resource line '{line}'")
        nnodes, ncores, ngpus = (int(f) for f in fields[:3])
        names = expand_hostlist(fields[3])
        per_node = max(1, (ngpus or ncores) // max(nnodes, 1))
        hosts.extend(_with_slots(names, [per_node] * len(names), override))
    return merge_duplicates(hosts)


def _flux(environ: Mapping[str, str], override: int | None) -> Allocation | None:
    if not environ.get("FLUX_JOB_ID"):
        return None
    argv = ["flux", "resource", "list", "-s", "up", "-no", "{nnodes} {ncores} {ngpus} {nodelist}"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=FLUX_TIMEOUT_SECONDS, check=False)
    except FileNotFoundError:
        raise LaunchError("FLUX_JOB_ID is set but 'flux' is not on PATH; pass -H or --hostfile") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"'flux resource list' did not answer within {FLUX_TIMEOUT_SECONDS:g} s") from None
    if done.returncode != 0:
        raise LaunchError(f"'flux resource list' failed ({done.returncode}): {done.stderr.strip()}")
    hosts = parse_flux_resources(done.stdout, override)
    if not hosts:
        raise LaunchError("'flux resource list' shows no nodes up in this allocation")
    return Allocation("Flux", "flux resource list", hosts)


def detect_allocation(environ: Mapping[str, str], slots_per_host: int | None = None) -> Allocation | None:
    """The allocation's hosts, or None outside a batch job."""
    for detector in (_slurm, _pbs, _lsf, _cobalt, _flux):
        allocation = detector(environ, slots_per_host)
        if allocation is not None:
            return allocation
    return None
