"""The one description of a batch job that every scheduler backend renders.

Everything here is scheduler-neutral: a walltime is a number of seconds, an array is a set of indices,
a sweep is a list of environment assignments. Backends translate these into their own directives.
"""

from __future__ import annotations

import itertools
import re
import signal as _signal
import sys
from dataclasses import dataclass, field
from typing import Optional

from hpcdl.schedulers.errors import JobSpecError
from hpcdl.schedulers.shell import check_directive_value, check_value

WALLTIME_FORMS = (
    "HH:MM:SS, D-HH:MM:SS, a number of minutes (e.g. 90), or a number with a unit s/m/h/d (e.g. 2h)"
)
_CLOCK = re.compile(r"^(?:(\d+)-)?(\d+):([0-5]?\d):([0-5]?\d)$")
_UNIT = re.compile(r"^(\d+)([smhd]?)$")
_UNIT_SECONDS = {"s": 1, "m": 60, "": 60, "h": 3600, "d": 86400}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOB_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
# Why a job's Python is the one hpcdl runs in, when neither --python nor a site file names another.
DEFAULT_PYTHON_ORIGIN = "the interpreter hpcdl runs in; login and compute nodes share the file system"


def default_python() -> str:
    """The interpreter hpcdl runs in: the one that has hpcdl, wherever it was installed (a virtual
    environment need not be active for its ``hpcdl`` to be called by its path)."""
    return sys.executable or "python3"


def parse_walltime(text: str) -> int:
    """Seconds in a walltime written in one of ``WALLTIME_FORMS``; raises JobSpecError otherwise."""
    value = text.strip()
    clock = _CLOCK.match(value)
    if clock:
        days, hours, minutes, seconds = clock.groups()
        total = int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + int(seconds)
    else:
        unit = _UNIT.match(value)
        if not unit:
            raise JobSpecError(f"walltime {text!r} is not in a form hpcdl understands; use {WALLTIME_FORMS}")
        total = int(unit.group(1)) * _UNIT_SECONDS[unit.group(2)]
    if total <= 0:
        raise JobSpecError(f"walltime {text!r} is zero; give a positive time ({WALLTIME_FORMS})")
    return total


def format_clock(seconds: int) -> str:
    """``HH:MM:SS`` with hours allowed past 24 (PBS, Slurm and Cobalt all accept it)."""
    hours, rest = divmod(seconds, 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


@dataclass(frozen=True)
class ArraySpec:
    """Array task indices: a range ``start-stop[:step]`` or an explicit list, with an optional limit."""

    indices: tuple[int, ...]
    step: int = 1
    max_concurrent: Optional[int] = None
    is_range: bool = True

    @classmethod
    def parse(cls, text: str) -> ArraySpec:
        forms = "START-STOP, START-STOP:STEP, A,B,C, each optionally followed by %LIMIT (e.g. 0-9%2)"
        body, _, limit_text = text.strip().partition("%")
        limit = None
        if limit_text:
            if not limit_text.isdigit() or int(limit_text) < 1:
                raise JobSpecError(f"array {text!r}: the limit after % must be a positive number ({forms})")
            limit = int(limit_text)
        ranged = re.match(r"^(\d+)-(\d+)(?::(\d+))?$", body)
        if ranged:
            start, stop, step = int(ranged.group(1)), int(ranged.group(2)), int(ranged.group(3) or 1)
            if stop < start or step < 1:
                raise JobSpecError(f"array {text!r}: need START <= STOP and STEP >= 1 ({forms})")
            return cls(tuple(range(start, stop + 1, step)), step, limit, True)
        if re.match(r"^\d+(,\d+)*$", body):
            indices = tuple(sorted({int(i) for i in body.split(",")}))
            return cls(indices, 1, limit, False)
        raise JobSpecError(f"array {text!r} is not in a form hpcdl understands; use {forms}")

    @property
    def first(self) -> int:
        return self.indices[0]

    @property
    def last(self) -> int:
        return self.indices[-1]


@dataclass(frozen=True)
class Sweep:
    """A parameter sweep: the cartesian product of ``NAME=V1,V2`` settings, one array task each."""

    names: tuple[str, ...]
    points: tuple[tuple[str, ...], ...]

    @classmethod
    def parse(cls, settings: list[str]) -> Sweep:
        names: list[str] = []
        values: list[list[str]] = []
        for setting in settings:
            name, sep, raw = setting.partition("=")
            if not sep or not _NAME.match(name) or not raw:
                raise JobSpecError(
                    f"sweep {setting!r} must look like NAME=V1,V2,... with NAME an environment variable name"
                )
            if name in names:
                raise JobSpecError(
                    f"sweep variable {name} is given twice; list all its values in one --sweep"
                )
            names.append(name)
            values.append(raw.split(","))
        return cls(tuple(names), tuple(itertools.product(*values)))

    def __len__(self) -> int:
        return len(self.points)


@dataclass(frozen=True)
class SignalSpec:
    """Signal the job ``seconds`` before its walltime (to checkpoint), as Slurm's ``--signal=USR2@90``."""

    name: str = "USR2"
    seconds: int = 90

    @classmethod
    def parse(cls, text: str) -> SignalSpec:
        name, _, seconds = text.strip().partition("@")
        name = name.upper().removeprefix("SIG")
        valid = sorted(s.name[3:] for s in _signal.Signals if not s.name.startswith("SIG_"))
        if name not in valid:
            raise JobSpecError(f"signal {text!r}: unknown signal {name!r}; use one of {', '.join(valid)}")
        if name in ("KILL", "STOP"):
            raise JobSpecError(f"signal {name} cannot be caught by the job; use USR1, USR2 or TERM")
        if seconds and (not seconds.isdigit() or int(seconds) < 1):
            raise JobSpecError(f"signal {text!r}: the time after @ must be a positive number of seconds")
        return cls(name, int(seconds) if seconds else 90)


@dataclass
class JobSpec:
    """What the user asked for, before any scheduler is chosen. ``validate`` fills in the defaults."""

    command: list[str]
    nodes: int = 1
    gpus_per_node: int = 0
    ranks_per_node: Optional[int] = None
    cpus_per_rank: Optional[int] = None
    walltime: str = "01:00:00"
    job_name: str = "hpcdl"
    account: Optional[str] = None
    partition: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    output: Optional[str] = None
    error: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)
    modules: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    signal: Optional[SignalSpec] = None
    requeue: bool = False
    array: Optional[ArraySpec] = None
    sweep: Optional[Sweep] = None
    launcher_args: list[str] = field(default_factory=list)
    python: str = field(default_factory=default_python)  # hpcdl's helpers and a *.py command run with it
    python_origin: str = DEFAULT_PYTHON_ORIGIN  # why this interpreter (the script says so)
    checkpoint: Optional[str] = None  # the training's checkpoint directory (hpcdl.checkpoint)

    @property
    def walltime_seconds(self) -> int:
        return parse_walltime(self.walltime)

    @property
    def total_ranks(self) -> int:
        return self.nodes * self.resolved_ranks_per_node

    @property
    def resolved_ranks_per_node(self) -> int:
        if self.ranks_per_node is not None:
            return self.ranks_per_node
        return self.gpus_per_node if self.gpus_per_node > 0 else 1

    @property
    def resolved_cpus_per_rank(self) -> int:
        return self.cpus_per_rank if self.cpus_per_rank is not None else 1

    @property
    def argv(self) -> list[str]:
        """The command as run on each rank: a ``*.py`` first word is run by ``python``."""
        if self.command and self.command[0].endswith(".py"):
            return [self.python, *self.command]
        return list(self.command)

    def validate(self) -> JobSpec:
        """Check the request on its own (site limits are checked by ``SiteConfig.check``)."""
        if not self.command:
            raise JobSpecError("no command given; put the program to run after the options, e.g. train.py")
        for name, value, least in (
            ("--nodes", self.nodes, 1),
            ("--gpus-per-node", self.gpus_per_node, 0),
            ("--ranks-per-node", self.ranks_per_node, 1),
            ("--cpus-per-rank", self.cpus_per_rank, 1),
        ):
            if value is not None and value < least:
                raise JobSpecError(f"{name} must be at least {least}, got {value}")
        gpus, ranks = self.gpus_per_node, self.resolved_ranks_per_node
        if gpus and gpus % ranks and ranks % gpus:
            raise JobSpecError(
                f"{ranks} ranks per node cannot share {gpus} GPUs evenly; use a divisor or a multiple of "
                f"{gpus} for --ranks-per-node"
            )
        parse_walltime(self.walltime)
        if not _JOB_NAME.match(self.job_name):
            raise JobSpecError(
                f"job name {self.job_name!r}: use 1-64 letters, digits, '_', '.', '-' starting with a letter"
            )
        for key, value in self.env.items():
            if not _NAME.match(key):
                raise JobSpecError(f"environment variable name {key!r} is not valid; use letters, digits, _")
            check_value(value, f"the value of {key}")
        self._check_script_values()
        if self.signal and self.signal.seconds >= self.walltime_seconds:
            raise JobSpecError(
                f"signal {self.signal.seconds}s before the end is not inside the walltime "
                f"({self.walltime_seconds}s); choose a shorter lead time or a longer walltime"
            )
        if self.requeue and not self.signal:
            raise JobSpecError(
                "--requeue needs --signal SIG@SECONDS: the job requeues after it has been signalled"
            )
        if self.array and self.sweep:
            raise JobSpecError("give either --array or --sweep, not both (a sweep makes its own array)")
        if self.checkpoint is not None and (self.array or self.sweep):
            raise JobSpecError(
                "--checkpoint with --array or --sweep would have every task write one checkpoint; submit "
                "one job per task, each with its own checkpoint path"
            )
        return self

    def _check_script_values(self) -> None:
        """Values that reach the script's directives or its shell (see :mod:`hpcdl.schedulers.shell`)."""
        for option, value in (
            ("--account", self.account),
            ("--partition", self.partition),
            ("--qos", self.qos),
            ("--constraint", self.constraint),
            ("--output", self.output),
            ("--error", self.error),
        ):
            if value is not None:
                check_directive_value(value, option)
        for module in self.modules:
            check_value(module, "module")
            if not module or module.startswith("-"):
                raise JobSpecError(f"module {module!r} is not a module name (names do not start with '-')")
        for arg in self.launcher_args:
            check_value(arg, "launcher argument")
        if self.checkpoint is not None:
            check_value(self.checkpoint, "checkpoint path")
        check_value(self.python, "python")
        if not self.python.strip() or self.python.startswith("-"):
            raise JobSpecError(
                f"python {self.python!r} is not an interpreter; give its path, e.g. /usr/bin/python3"
            )
        for point in self.sweep.points if self.sweep else ():
            for value in point:
                check_value(value, "sweep value")

    @property
    def gpu_slice(self) -> tuple[int, int]:
        """(GPUs each rank gets, ranks sharing one GPU): one of the two is 1."""
        gpus, ranks = self.gpus_per_node, self.resolved_ranks_per_node
        if gpus >= ranks:
            return gpus // ranks, 1
        return 1, ranks // gpus
