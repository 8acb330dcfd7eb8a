"""Read an engine timeline (Chrome trace JSON written by rank 0) and summarise where the time went.

The trace holds one track per tensor name (``thread_name`` metadata) with complete events (``"ph": "X"``)
for the phases NEGOTIATE, QUEUE, MEMCPY_IN_FUSION_BUFFER, the collective (ALLREDUCE, ALLGATHER, ...) and
MEMCPY_OUT_FUSION_BUFFER. NEGOTIATE events carry ``ready_ranks`` (in the order the ranks submitted) and
``last_ready``: the rank everybody else waited for.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hpcdl.common.exceptions import HpcdlError

COLLECTIVE_PHASES = ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER", "JOIN")
PHASE_ORDER = (
    "NEGOTIATE",
    "QUEUE",
    "MEMCPY_IN_FUSION_BUFFER",
    *COLLECTIVE_PHASES,
    "MEMCPY_OUT_FUSION_BUFFER",
)


class TimelineError(HpcdlError):
    """The file is not a readable hpcdl/Chrome trace."""


@dataclass(frozen=True)
class PhaseTotal:
    phase: str
    count: int
    total_us: int


@dataclass(frozen=True)
class TensorTotal:
    name: str
    operations: int
    total_us: int  # time in every phase but NEGOTIATE (which mostly measures other ranks' compute)
    negotiate_us: int


@dataclass
class TimelineSummary:
    path: str
    span_us: int
    operations: int
    phases: list[PhaseTotal] = field(default_factory=list)
    tensors: list[TensorTotal] = field(default_factory=list)
    last_ready: dict[int, int] = field(default_factory=dict)  # rank -> times it was the one waited for
    stalls: int = 0
    errors: int = 0


def load_events(path: str | Path) -> list[dict]:
    """The trace's events. Accepts the JSON-array form (also when cut short before its closing bracket,
    which Chrome's trace viewer tolerates too) and the ``{"traceEvents": [...]}`` form."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TimelineError(f"cannot read timeline {p}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            data = json.loads(text.rstrip().rstrip(",") + "]")
        except json.JSONDecodeError as exc:
            raise TimelineError(
                f"{p} is not a Chrome trace (JSON error at line {exc.lineno}: {exc.msg}); "
                "pass the file named by HPCDL_TIMELINE / start_timeline()"
            ) from None
    if isinstance(data, dict):
        data = data.get("traceEvents")
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        raise TimelineError(f"{p} is JSON but not a trace: expected a list of event objects")
    return data


def summarize(events: list[dict], path: str = "") -> TimelineSummary:
    """Totals per phase and per tensor, and which ranks the others waited for."""
    track_names: dict[int, str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            track_names[int(e.get("tid", 0))] = str(e.get("args", {}).get("name", ""))
    phase_count: Counter[str] = Counter()
    phase_us: Counter[str] = Counter()
    tensor_ops: Counter[str] = Counter()
    tensor_us: Counter[str] = Counter()
    tensor_negotiate: Counter[str] = Counter()
    last_ready: Counter[int] = Counter()
    start, end = None, None
    stalls = errors = 0
    seen_fused: set[tuple[str, int, int]] = set()
    for e in events:
        ph = e.get("ph")
        if ph == "i" and e.get("name") == "STALL":
            stalls += 1
        if ph != "X":
            continue
        name, ts, dur = str(e.get("name")), int(e.get("ts", 0)), int(e.get("dur", 0))
        start = ts if start is None else min(start, ts)
        end = ts + dur if end is None else max(end, ts + dur)
        tensor = track_names.get(int(e.get("tid", 0)), f"track {e.get('tid')}")
        args = e.get("args", {}) or {}
        # Members of one fusion batch share the batch's copy and collective spans: count those once.
        if "fused_tensors" not in args or (name, ts, dur) not in seen_fused:
            seen_fused.add((name, ts, dur))
            phase_count[name] += 1
            phase_us[name] += dur
        if name == "NEGOTIATE":
            tensor_ops[tensor] += 1
            tensor_negotiate[tensor] += dur
            if "error" in args:
                errors += 1
            if "last_ready" in args and len(args.get("ready_ranks", [])) > 1:
                last_ready[int(args["last_ready"])] += 1
        else:
            tensor_us[tensor] += dur
    order = {p: i for i, p in enumerate(PHASE_ORDER)}
    phases = sorted(
        (PhaseTotal(p, phase_count[p], phase_us[p]) for p in phase_count),
        key=lambda t: (order.get(t.phase, len(order)), t.phase),
    )
    tensors = sorted(
        (TensorTotal(t, tensor_ops[t], tensor_us[t], tensor_negotiate[t]) for t in tensor_ops),
        key=lambda t: (-t.total_us, t.name),
    )
    return TimelineSummary(
        path=path,
        span_us=(end - start) if start is not None and end is not None else 0,
        operations=sum(tensor_ops.values()),
        phases=phases,
        tensors=tensors,
        last_ready=dict(sorted(last_ready.items())),
        stalls=stalls,
        errors=errors,
    )


def summarize_file(path: str | Path) -> TimelineSummary:
    return summarize(load_events(path), str(path))


def _ms(us: int) -> str:
    return f"{us / 1000:.3f} ms"


def render(summary: TimelineSummary, top: int = 10) -> str:
    """A plain-text report of a summary."""
    lines = [
        f"timeline {summary.path}: {summary.operations} operations over {_ms(summary.span_us)}",
    ]
    if summary.errors:
        lines.append(f"  {summary.errors} operation(s) failed negotiation (mismatch or cancelled)")
    if summary.stalls:
        lines.append(f"  {summary.stalls} stall warning(s)")
    lines.append("")
    lines.append(f"{'phase':<26}{'count':>8}{'total':>16}{'mean':>14}")
    busy = sum(p.total_us for p in summary.phases if p.phase != "NEGOTIATE") or 1
    for p in summary.phases:
        mean = p.total_us / p.count if p.count else 0
        share = "" if p.phase == "NEGOTIATE" else f"  {100 * p.total_us / busy:5.1f}% of engine work"
        lines.append(f"{p.phase:<26}{p.count:>8}{_ms(p.total_us):>16}{mean / 1000:>11.3f} ms{share}")
    lines.append("  (NEGOTIATE is the wait for every rank to submit: mostly the slowest rank's compute)")
    if summary.tensors:
        lines.append("")
        shown = min(top, len(summary.tensors))
        lines.append(f"top {shown} tensors by engine time (queue + copies + collective):")
        for t in summary.tensors[:top]:
            lines.append(
                f"  {t.name:<40} {t.operations:>6} ops {_ms(t.total_us):>14}  negotiate {_ms(t.negotiate_us)}"
            )
    if summary.last_ready:
        lines.append("")
        lines.append("ranks the others waited for (last to submit):")
        total = sum(summary.last_ready.values())
        for rank, count in sorted(summary.last_ready.items(), key=lambda kv: -kv[1]):
            lines.append(f"  rank {rank}: {count} times ({100 * count / total:.0f}%)")
    return "\n".join(lines)
