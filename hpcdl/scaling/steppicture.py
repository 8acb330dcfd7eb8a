"""A picture of one training step from an engine timeline: per rank, when it computed and when it waited
for collectives; per collective (one lane per tensor, or per fusion batch), its phases (negotiation,
queue, copies into and out of the fusion buffer, the collective itself) on the same time axis.

The engine's timeline (``HPCDL_TIMELINE``, written by rank 0) knows the collectives but not what each rank
did meanwhile; the per-rank lanes come from the StepTimer records beside it (a scaling study run with
``--timeline N`` writes both, and the time at which rank 0 started the timeline, which places the
records on the trace's clock). Without records, steps are found as bursts of engine activity separated by
idle gaps, and only the collective lanes are drawn.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hpcdl.common.steps import RankSteps, StepRecordError, read_run_steps
from hpcdl.common.timeline import COLLECTIVE_PHASES, load_events
from hpcdl.scaling.study import StudyError

COMPUTE, WAIT = "compute", "waiting for collectives"
PHASE_COLOURS = {
    COMPUTE: "#1f77b4",
    WAIT: "#ff7f0e",
    "NEGOTIATE": "#c7c7c7",
    "QUEUE": "#bcbd22",
    "MEMCPY_IN_FUSION_BUFFER": "#9467bd",
    "MEMCPY_OUT_FUSION_BUFFER": "#9467bd",
    **{phase: "#d62728" for phase in COLLECTIVE_PHASES},
}
TEXT_MARKS = {
    COMPUTE: "#",
    WAIT: "=",
    "NEGOTIATE": ".",
    "QUEUE": "q",
    "MEMCPY_IN_FUSION_BUFFER": "m",
    "MEMCPY_OUT_FUSION_BUFFER": "m",
    **{phase: phase[0] for phase in COLLECTIVE_PHASES},
}
MAX_COLLECTIVE_LANES = 32
TEXT_WIDTH = 72


@dataclass
class Span:
    phase: str
    start_us: float
    end_us: float


@dataclass
class Lane:
    label: str
    spans: list[Span] = field(default_factory=list)


@dataclass
class StepPicture:
    trace: str
    step: int  # which step (of those with records, or which burst)
    start_us: float
    end_us: float
    ranks: list[Lane]
    collectives: list[Lane]
    notes: list[str] = field(default_factory=list)

    @property
    def duration_ms(self) -> float:
        return (self.end_us - self.start_us) / 1e3


@dataclass
class _Op:
    """The events of one tensor's operation, or of one fusion batch's (members share its spans)."""

    tensors: list[str]
    spans: list[Span]
    nbytes: int = 0


def _operations(events: list[dict[str, Any]]) -> list[_Op]:
    names: dict[int, str] = {}
    by_track: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[int(e.get("tid", 0))] = str(e.get("args", {}).get("name", ""))
        elif e.get("ph") == "X":
            by_track.setdefault(int(e.get("tid", 0)), []).append(e)
    batches: dict[tuple, _Op] = {}
    ops: list[_Op] = []
    for tid, track in by_track.items():
        track.sort(key=lambda e: e["ts"])
        current: list[dict[str, Any]] = []
        for e in [*track, None]:
            if e is None or (e["name"] == "NEGOTIATE" and current):
                _close(names.get(tid, f"track {tid}"), current, batches, ops)
                current = []
            if e is not None:
                current.append(e)
    return ops


def _close(tensor: str, events: list[dict[str, Any]], batches: dict[tuple, _Op], ops: list[_Op]) -> None:
    """Add one operation of one tensor; members of a fusion batch join the batch's operation."""
    if not events:
        return
    spans = [Span(e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events]
    collective = next((e for e in events if e["name"] in COLLECTIVE_PHASES), None)
    args = (collective or {}).get("args", {}) or {}
    nbytes = int(args.get("fused_bytes", args.get("bytes", 0)))
    if collective is not None and "fused_tensors" in args:
        key = (collective["name"], collective["ts"], collective.get("dur", 0))
        if key in batches:
            batch = batches[key]
            batch.tensors.append(tensor)
            negotiate = [s for s in spans if s.phase == "NEGOTIATE"]
            known = [s for s in batch.spans if s.phase == "NEGOTIATE"]
            if negotiate and known:  # the batch negotiated from its first member's start to its last's end
                known[0].start_us = min(known[0].start_us, negotiate[0].start_us)
                known[0].end_us = max(known[0].end_us, negotiate[0].end_us)
            return
        op = _Op([tensor], spans, nbytes)
        batches[key] = op
        ops.append(op)
        return
    ops.append(_Op([tensor], spans, nbytes))


def _bursts(ops: list[_Op], gap_us: float) -> list[tuple[float, float]]:
    """Stretches of engine activity separated by idle gaps longer than ``gap_us``."""
    intervals = sorted((min(s.start_us for s in op.spans), max(s.end_us for s in op.spans)) for op in ops)
    bursts: list[list[float]] = []
    for start, end in intervals:
        if bursts and start <= bursts[-1][1] + gap_us:
            bursts[-1][1] = max(bursts[-1][1], end)
        else:
            bursts.append([start, end])
    return [(a, b) for a, b in bursts]


def _rank_lane(records: RankSteps, index: int, origin: float) -> tuple[Lane, float, float]:
    step = records.steps[index]
    start = (float(step["start"]) - origin) * 1e6
    end = start + float(step["seconds"]) * 1e6
    lane = Lane(f"rank {records.rank}")
    cursor = start
    for offset, duration in step.get("waits", []):
        wait_start = start + float(offset) * 1e6
        if wait_start > cursor:
            lane.spans.append(Span(COMPUTE, cursor, wait_start))
        lane.spans.append(Span(WAIT, wait_start, wait_start + float(duration) * 1e6))
        cursor = wait_start + float(duration) * 1e6
    if end > cursor:
        lane.spans.append(Span(COMPUTE, cursor, end))
    return lane, start, end


def _traced_steps(ranks: dict[int, RankSteps], origin: float) -> list[int]:
    """Indices of the steps every rank recorded that rank 0 ran while the timeline was being written."""
    count = min(len(r.steps) for r in ranks.values())
    stop = ranks[0].timeline_stop
    traced = []
    for i in range(count):
        step = ranks[0].steps[i]
        start = float(step["start"])
        if start >= origin and (stop is None or start + float(step["seconds"]) <= stop):
            traced.append(i)
    return traced


def build(
    trace: Path, steps_dir: Optional[Path] = None, step: Optional[int] = None, gap_ms: float = 1.0
) -> StepPicture:
    """The picture of step ``step`` (default: the middle one of those traced)."""
    ops = _operations(load_events(trace))
    if not ops:
        raise StudyError(
            f"{trace} holds no collective operations; was the timeline recorded during training?"
        )
    notes: list[str] = []
    ranks = _rank_records(steps_dir if steps_dir is not None else trace.parent)
    origin = ranks[0].timeline_origin if ranks and 0 in ranks else None
    if ranks and origin is None:
        notes.append(
            "the step records hold no timeline start (not a study run with --timeline): rank lanes left out"
        )
    if ranks and origin is not None:
        traced = _traced_steps(ranks, origin)
        if not traced:
            raise StudyError(f"no step recorded by every rank began after the timeline started ({trace})")
        chosen = _pick(traced, step, "traced step")
        rank_lanes, bounds = [], []
        for rank in sorted(ranks):
            lane, start, end = _rank_lane(ranks[rank], chosen, origin)
            rank_lanes.append(lane)
            bounds += [start, end]
        window = (min(bounds), max(bounds))
        if len({r.host for r in ranks.values()}) > 1:
            notes.append("ranks on other hosts than rank 0 are placed by their own clocks")
    else:
        bursts = _bursts(ops, gap_ms * 1e3)
        chosen = _pick(list(range(len(bursts))), step, "burst of engine activity")
        window, rank_lanes = bursts[chosen], []
        notes.append(
            f"step {chosen}: burst {chosen + 1} of {len(bursts)} of engine activity (gaps over {gap_ms:g} ms)"
        )
    lanes = [_collective_lane(op, window) for op in ops if _overlaps(op, window)]
    lanes.sort(key=lambda lane: min(s.start_us for s in lane.spans))
    if len(lanes) > MAX_COLLECTIVE_LANES:
        notes.append(f"{len(lanes) - MAX_COLLECTIVE_LANES} more collective lanes not drawn")
        lanes = lanes[:MAX_COLLECTIVE_LANES]
    return StepPicture(str(trace), chosen, window[0], window[1], rank_lanes, lanes, notes)


def _rank_records(directory: Path) -> dict[int, RankSteps]:
    try:
        return read_run_steps(directory) if directory.is_dir() else {}
    except StepRecordError as exc:
        raise StudyError(str(exc)) from None


def _pick(choices: list[int], wanted: Optional[int], what: str) -> int:
    if wanted is None:
        return choices[len(choices) // 2]
    if wanted not in choices:
        raise StudyError(f"no {what} {wanted}; choose one of {choices[0]}..{choices[-1]}")
    return wanted


def _overlaps(op: _Op, window: tuple[float, float]) -> bool:
    collective = [s for s in op.spans if s.phase != "NEGOTIATE"] or op.spans
    return any(s.end_us >= window[0] and s.start_us <= window[1] for s in collective)


def _collective_lane(op: _Op, window: tuple[float, float]) -> Lane:
    label = op.tensors[0] if len(op.tensors) == 1 else f"{op.tensors[0]} +{len(op.tensors) - 1} fused"
    if op.nbytes:
        label += f" ({op.nbytes / 1e6:.2f} MB)" if op.nbytes >= 1e5 else f" ({op.nbytes / 1e3:.1f} kB)"
    spans = [Span(s.phase, max(s.start_us, window[0]), min(s.end_us, window[1])) for s in op.spans]
    return Lane(label, [s for s in spans if s.end_us >= s.start_us])


# ---- drawing -------------------------------------------------------------------------------------------
def fit_label(label: str, width: int) -> str:
    """`label` in `width` characters: a long tensor name is shortened in its middle, so that what follows it
    (``+2 fused (4.22 MB)``) stays whole."""
    if len(label) <= width:
        return label
    cut = label.find(" +") if " +" in label else label.rfind(" (") if label.endswith(")") else -1
    tail = label[cut:] if cut > 0 else ""
    room = width - len(tail) - 2
    if room < 4:
        return label[: width - 2] + ".."
    name = label[: len(label) - len(tail)]
    return f"{name[: room - room // 2]}..{name[len(name) - room // 2 :]}{tail}"


def text(picture: StepPicture, width: int = TEXT_WIDTH) -> str:
    """The picture as text: one row per lane, one character per time slot (the last phase drawn wins)."""
    span = max(picture.end_us - picture.start_us, 1.0)
    lanes = picture.ranks + picture.collectives
    label_width = min(36, max((len(lane.label) for lane in lanes), default=4))
    lines = [f"step {picture.step} of {picture.trace}: {picture.duration_ms:.2f} ms"]
    for lane in lanes:
        row = [" "] * width
        for s in lane.spans:
            first = int((s.start_us - picture.start_us) / span * (width - 1))
            last = int((s.end_us - picture.start_us) / span * (width - 1))
            for column in range(max(first, 0), min(last, width - 1) + 1):
                row[column] = TEXT_MARKS.get(s.phase, "?")
        lines.append(f"{fit_label(lane.label, label_width):<{label_width}} |{''.join(row)}|")
    lines.append(f"{'':<{label_width}}  0{'':>{width - 10}}{picture.duration_ms:.2f} ms")
    legend = [f"{mark} {_legend_name(name)}" for name, mark in TEXT_MARKS.items() if name in _phases(picture)]
    lines.append("  ".join(dict.fromkeys(legend)))
    lines += [f"note: {note}" for note in picture.notes]
    return "\n".join(lines)


def _legend_name(phase: str) -> str:
    if phase in COLLECTIVE_PHASES:
        return "collective"
    if phase.startswith("MEMCPY"):
        return "fusion buffer copy"
    return phase.lower()


def _phases(picture: StepPicture) -> set[str]:
    return {s.phase for lane in picture.ranks + picture.collectives for s in lane.spans}


def draw(picture: StepPicture, fmt: str = "png") -> bytes:
    """The picture with matplotlib (``hpcdl[plot]``)."""
    from hpcdl.scaling.plots import DPI, PlotError

    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        raise PlotError("the step picture needs matplotlib: pip install 'hpcdl[plot]'") from None
    lanes = picture.ranks + picture.collectives
    figure = Figure(figsize=(10.0, max(3.0, 0.32 * len(lanes) + 2.0)), dpi=DPI)
    axes = figure.add_subplot()
    for row, lane in enumerate(reversed(lanes)):
        for s in lane.spans:
            start = (s.start_us - picture.start_us) / 1e3
            length = max((s.end_us - s.start_us) / 1e3, 0.01)
            axes.broken_barh([(start, length)], (row - 0.4, 0.8), color=PHASE_COLOURS.get(s.phase, "#000000"))
    axes.set_yticks(range(len(lanes)))
    axes.set_yticklabels([lane.label for lane in reversed(lanes)], fontsize=8)
    axes.set_xlabel("time in the step (ms)")
    axes.set_xlim(0, picture.duration_ms)
    title = f"step {picture.step}: {picture.duration_ms:.2f} ms ({Path(picture.trace).name})"
    axes.set_title(title, fontsize=10)
    shown = _phases(picture)
    legend: dict[str, str] = {}
    for phase, colour in PHASE_COLOURS.items():
        if phase in shown:
            legend.setdefault(_legend_name(phase), colour)
    handles = [Patch(color=c, label=n) for n, c in legend.items()]
    axes.legend(
        handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=len(handles)
    )
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format=fmt, dpi=DPI)
    return buffer.getvalue()
