"""Reading the flight-recorder dumps of a job's ranks: ``flight.rank<R>.json`` in the job's debug directory.

Each rank's engine keeps a bounded ring of its recent collectives and writes it on a stall, a timeout, a
mismatch, a failure or on request (format version 1: rank, size, host, pid, time, reason, message,
process_sets, ops, stack; each op: seq, name, op, reduce, dtype, shape, bytes, process_set, device, state
and the times it was submitted, negotiated, started and done, all wall-clock seconds). A dump that cannot
be read is reported, not fatal: the others still tell most of the story.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = 1
FILE = re.compile(r"^flight\.rank(\d+)\.json$")
PENDING = ("submitted", "negotiated", "started")  # states of an operation still under way
# ... and of one that never completed: cancelled (the job shut down, a stall shutdown) or failed
UNFINISHED = (*PENDING, "cancelled", "failed")


@dataclass(frozen=True)
class Op:
    """One collective as a rank recorded it."""

    seq: int
    name: str
    op: str
    state: str
    submitted: float | None = None
    negotiated: float | None = None
    started: float | None = None
    done: float | None = None
    reduce: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    bytes: int | None = None
    process_set: int = 0
    device: str | None = None
    error: str | None = None

    @property
    def pending(self) -> bool:
        return self.state in PENDING

    @property
    def unfinished(self) -> bool:
        return self.state in UNFINISHED

    def describe(self) -> str:
        """``allreduce 'grad.2'`` (with its process set when not the global one)."""
        text = f"{self.op} '{self.name}'"
        return text if self.process_set == 0 else f"{text} (process set {self.process_set})"


@dataclass(frozen=True)
class Dump:
    """One rank's flight-recorder dump; `ops` oldest first."""

    rank: int
    size: int
    host: str
    pid: int
    time: float
    reason: str
    message: str
    ops: tuple[Op, ...]
    process_sets: dict[int, tuple[int, ...]] = field(default_factory=dict)
    stack: str | None = None


@dataclass(frozen=True)
class Dumps:
    """The dumps found in a directory, by rank, and the files that could not be read (path, why)."""

    by_rank: dict[int, Dump]
    unreadable: list[tuple[Path, str]]


def _op(raw: dict[str, Any]) -> Op:
    shape = raw.get("shape")
    return Op(
        seq=int(raw["seq"]),
        name=str(raw["name"]),
        op=str(raw["op"]),
        state=str(raw["state"]),
        submitted=raw.get("submitted"),
        negotiated=raw.get("negotiated"),
        started=raw.get("started"),
        done=raw.get("done"),
        reduce=raw.get("reduce"),
        dtype=raw.get("dtype"),
        shape=tuple(int(d) for d in shape) if shape is not None else None,
        bytes=raw.get("bytes"),
        process_set=int(raw.get("process_set", 0)),
        device=raw.get("device"),
        error=raw.get("error"),
    )


def parse(raw: Any) -> Dump:
    """A dump from its JSON; ValueError saying what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    if raw.get("version") != VERSION:
        raise ValueError(f"format version {raw.get('version')!r}, this hpcdl reads version {VERSION}")
    try:
        sets = {int(k): tuple(int(r) for r in v) for k, v in (raw.get("process_sets") or {}).items()}
        ops = tuple(sorted((_op(op) for op in raw.get("ops") or []), key=lambda op: op.seq))
        return Dump(
            rank=int(raw["rank"]),
            size=int(raw["size"]),
            host=str(raw.get("host", "?")),
            pid=int(raw.get("pid", 0)),
            time=float(raw["time"]),
            reason=str(raw.get("reason", "")),
            message=str(raw.get("message") or ""),
            ops=ops,
            process_sets=sets,
            stack=raw.get("stack"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"missing or malformed field: {exc}") from None


def load(directory: Path) -> Dumps:
    """Every ``flight.rank<R>.json`` of `directory`."""
    by_rank: dict[int, Dump] = {}
    unreadable: list[tuple[Path, str]] = []
    for path in sorted(directory.iterdir()):
        if not FILE.match(path.name):
            continue
        try:
            dump = parse(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            unreadable.append((path, str(exc)))
            continue
        by_rank[dump.rank] = dump
    return Dumps(by_rank, unreadable)
