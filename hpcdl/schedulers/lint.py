"""Reading a batch script the way a scheduler does, for the checks each scheduler backend makes of its
scripts (``check_script`` in :mod:`hpcdl.schedulers.slurm` and its siblings), which return the problems
the real scheduler or its launcher would report: unknown directives, malformed resource statements and
walltimes, launcher geometry that does not fit the allocation. An empty list means no objection.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Optional


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


def int_or_none(value: Optional[str]) -> Optional[int]:
    return int(value) if value is not None and value.isdigit() else None
