"""The picture of one step: rank lanes from StepTimer records placed on the engine timeline's clock,
collective lanes per tensor or fusion batch, steps found as bursts when there are no records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl.scaling import steppicture
from hpcdl.scaling.study import StudyError

ORIGIN = 1_000_000.0  # wall-clock second at which rank 0 started the timeline
STEP_US = 50_000  # each step: 40 ms compute, then the allreduces


def trace_events(steps: int) -> list[dict]:
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "hpcdl engine (rank 0)"}}
    ]
    for tid, name in enumerate(["fc.bias", "fc.weight", "conv.weight"], 1):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}})
    for s in range(steps):
        base = s * STEP_US
        fused = {"fused_tensors": 2, "fused_bytes": 400_000}
        for tid in (1, 2):  # fc.bias and fc.weight: one fusion batch
            events += [
                {
                    "name": "NEGOTIATE",
                    "ph": "X",
                    "pid": 0,
                    "tid": tid,
                    "ts": base + 30_000 + tid,
                    "dur": 10_000 - tid,
                },
                {
                    "name": "ALLREDUCE",
                    "ph": "X",
                    "pid": 0,
                    "tid": tid,
                    "ts": base + 40_000,
                    "dur": 4_000,
                    "args": fused,
                },
            ]
        events += [
            {"name": "NEGOTIATE", "ph": "X", "pid": 0, "tid": 3, "ts": base + 35_000, "dur": 9_000},
            {"name": "QUEUE", "ph": "X", "pid": 0, "tid": 3, "ts": base + 44_000, "dur": 100},
            {
                "name": "ALLREDUCE",
                "ph": "X",
                "pid": 0,
                "tid": 3,
                "ts": base + 44_100,
                "dur": 3_000,
                "args": {"bytes": 2048},
            },
        ]
    return events


def write_run(directory: Path, steps: int, with_records: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    trace = directory / "timeline.json"
    trace.write_text(json.dumps(trace_events(steps)))
    if not with_records:
        return trace
    for rank in (0, 1):
        lines = [
            {"format": 1, "kind": "header", "rank": rank, "size": 2, "host": "h", "reduced_bytes": 402_048}
        ]
        lines.append(
            {"step": 0, "start": ORIGIN - 0.06, "seconds": 0.05, "comm": 0.0, "waits": []}
        )  # warm-up
        if rank == 0:
            lines.append({"kind": "timeline", "file": "timeline.json", "origin": ORIGIN})
        for s in range(steps):
            wait = 0.008 if rank == 0 else 0.002  # rank 1 computes longer and waits less
            lines.append(
                {"step": s + 1, "start": ORIGIN + s * STEP_US / 1e6, "seconds": 0.048, "comm": wait,
                 "waits": [[0.048 - wait, wait]], "samples": 8}
            )  # fmt: skip
        (directory / f"steps.rank{rank}.jsonl").write_text(
            "\n".join(json.dumps(line) for line in lines) + "\n"
        )
    return trace


def test_ranks_and_collectives_on_one_time_axis(tmp_path: Path) -> None:
    trace = write_run(tmp_path, steps=3)
    picture = steppicture.build(trace)
    assert picture.step == 2  # the middle traced step (step 0 is the warm-up before the timeline)
    assert picture.start_us == pytest.approx(STEP_US) and picture.duration_ms == pytest.approx(48.0)
    rank0, rank1 = picture.ranks
    assert [s.phase for s in rank0.spans] == [steppicture.COMPUTE, steppicture.WAIT]
    assert rank0.spans[1].start_us == pytest.approx(STEP_US + 40_000) and rank1.spans[
        1
    ].start_us == pytest.approx(STEP_US + 46_000)
    labels = [lane.label for lane in picture.collectives]
    assert labels == ["fc.bias +1 fused (0.40 MB)", "conv.weight (2.0 kB)"]
    fused = picture.collectives[0]
    negotiate = next(s for s in fused.spans if s.phase == "NEGOTIATE")
    assert negotiate.start_us == STEP_US + 30_001 and negotiate.end_us == STEP_US + 40_000  # both members
    text = steppicture.text(picture)
    assert "rank 0" in text and "=" in text.splitlines()[1] and "A" in text
    assert "# compute" in text and "= waiting for collectives" in text


def test_a_long_tensor_name_is_shortened_in_its_middle_keeping_the_size_whole(tmp_path: Path) -> None:
    trace = write_run(tmp_path, steps=3)
    picture = steppicture.build(trace)
    long = "module.encoder.layers.11.self_attention.out_projection.weight"
    picture.collectives[0].label = f"{long} +1 fused (0.40 MB)"
    row = next(line for line in steppicture.text(picture).splitlines() if "fused" in line)
    label = row.partition(" |")[0]
    assert len(label) == 36 and label.startswith("module.") and label.endswith("weight +1 fused (0.40 MB)")
    assert steppicture.fit_label(f"{long} (2.0 kB)", 30).endswith(".weight (2.0 kB)")
    assert steppicture.fit_label("conv.weight (2.0 kB)", 30) == "conv.weight (2.0 kB)"


def test_without_records_steps_are_bursts_of_engine_activity(tmp_path: Path) -> None:
    trace = write_run(tmp_path, steps=3, with_records=False)
    picture = steppicture.build(trace, step=0, gap_ms=5)
    assert picture.ranks == [] and picture.step == 0
    assert picture.start_us == 30_001 and picture.end_us == 47_100
    assert "burst 1 of 3" in picture.notes[0]
    with pytest.raises(StudyError, match=r"no burst of engine activity 7; choose one of 0\.\.2"):
        steppicture.build(trace, step=7, gap_ms=5)


def test_an_empty_timeline_says_what_is_wrong(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    trace.write_text("[\n")
    with pytest.raises(StudyError, match="holds no collective operations"):
        steppicture.build(trace)


def test_the_command_prints_the_picture_and_writes_the_png(tmp_path: Path) -> None:
    trace = write_run(tmp_path, steps=3)
    command = [sys.executable, "-m", "hpcdl", "timeline", "step", str(trace), "--step", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("step 1 of ") and "rank 1" in done.stdout
    picture = tmp_path / "timeline-step1.png"
    assert picture.stat().st_size > 5_000 and str(picture) in done.stderr
    picture.write_bytes(b"mine")  # the user's file now: kept
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "--force" in again.stderr and picture.read_bytes() == b"mine"
    bad = subprocess.run(
        [*command, "-o", str(tmp_path / "x.jpg")], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and "written as .png or .svg" in bad.stderr
