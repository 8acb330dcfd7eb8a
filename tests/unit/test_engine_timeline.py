"""Reading and summarising engine timelines (hpcdl.common.timeline, ``hpcdl timeline summary``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpcdl.cli.main import app
from hpcdl.common.timeline import TimelineError, load_events, render, summarize, summarize_file


def trace_events() -> list[dict]:
    """A small trace shaped like the engine's: two fused tensors and one large one; rank 1 was late twice."""
    meta = [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "bn.weight"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 2, "args": {"name": "bn.bias"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 3, "args": {"name": "fc.weight"}},
    ]
    fused = {"fused_tensors": 2, "fused_bytes": 512}

    def span(name: str, tid: int, ts: int, dur: int, args: dict) -> dict:
        return {"name": name, "ph": "X", "pid": 0, "tid": tid, "ts": ts, "dur": dur, "args": args}

    spans = []
    for tid in (1, 2):
        spans += [
            span("NEGOTIATE", tid, 0, 100, {"ready_ranks": [0, 1], "last_ready": 1}),
            span("QUEUE", tid, 100, 10, {}),
            span("MEMCPY_IN_FUSION_BUFFER", tid, 110, 5, fused),
            span("ALLREDUCE", tid, 115, 50, fused),
            span("MEMCPY_OUT_FUSION_BUFFER", tid, 165, 5, fused),
        ]
    spans += [
        span("NEGOTIATE", 3, 0, 40, {"ready_ranks": [1, 0], "last_ready": 0}),
        span("QUEUE", 3, 40, 130, {}),
        span("ALLREDUCE", 3, 170, 2000, {"bytes": 8192000}),
        {"name": "STALL", "ph": "i", "s": "t", "pid": 0, "tid": 0, "ts": 2200, "args": {}},
    ]
    return meta + spans


def test_summary_counts_fused_spans_once_and_names_the_late_rank() -> None:
    summary = summarize(trace_events(), "t.json")
    phases = {p.phase: p for p in summary.phases}
    assert [p.phase for p in summary.phases] == [
        "NEGOTIATE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"
    ]  # fmt: skip
    assert phases["ALLREDUCE"].count == 2 and phases["ALLREDUCE"].total_us == 2050  # the fused batch once
    assert phases["NEGOTIATE"].count == 3
    assert summary.operations == 3 and summary.span_us == 2170 and summary.stalls == 1
    assert summary.tensors[0].name == "fc.weight" and summary.tensors[0].total_us == 2130
    assert summary.last_ready == {0: 1, 1: 2}
    text = render(summary, top=2)
    assert "fc.weight" in text and "bn.bias" in text and "bn.weight" not in text  # top 2 only
    assert "rank 1: 2 times (67%)" in text


def test_a_trace_cut_short_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    text = json.dumps(trace_events(), indent=0)
    path.write_text(text[: text.rindex("]")].rstrip() + ",\n")  # killed before the closing bracket
    assert len(load_events(path)) == len(trace_events())
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"traceEvents": trace_events()}))
    assert summarize_file(wrapped).operations == 3


def test_bad_files_get_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TimelineError, match="cannot read timeline"):
        load_events(tmp_path / "missing.json")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    with pytest.raises(TimelineError, match="is not a Chrome trace"):
        load_events(garbage)
    result = CliRunner().invoke(app, ["timeline", "summary", str(garbage)])
    assert result.exit_code == 2
    assert "is not a Chrome trace" in result.output and "Traceback" not in result.output


def test_cli_prints_the_summary_and_json(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace_events()))
    result = CliRunner().invoke(app, ["timeline", "summary", str(path)])
    assert result.exit_code == 0, result.output
    assert "3 operations" in result.output and "MEMCPY_IN_FUSION_BUFFER" in result.output
    result = CliRunner().invoke(app, ["timeline", "summary", "--json", str(path)])
    assert json.loads(result.output)["last_ready"] == {"0": 1, "1": 2}
