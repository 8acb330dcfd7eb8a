"""The compressed host list of Slurm and Flux (RFC 29 follows Slurm's syntax): ``node[01-03,07],gpu5``.

One parser for every reader: the runner's allocation, Flux's resource list and a rank looking for its step's
first node.
"""

from __future__ import annotations

import re

from hpcdl.errors import LaunchError


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


def expand_range(spec: str, context: str) -> list[str]:
    """Expand ``01-03,7`` to 01 02 03 7 (zero padding kept)."""
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
            suffixes = expand_range(ranges, text) if ranges else [""]
            names = [name + prefix + suffix for name in names for suffix in suffixes]
        hosts.extend(names)
    return hosts


def first_host(text: str) -> str:
    """The first host of a compressed host list (LaunchError when it cannot be read)."""
    first = _split_top_level(text)[:1]
    hosts = expand_hostlist(first[0]) if first else []
    if not hosts or not hosts[0]:
        raise LaunchError(f"host list '{text}' names no host")
    return hosts[0]
