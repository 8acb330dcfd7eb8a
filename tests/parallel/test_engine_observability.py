"""The engine's timeline, stall inspector and autotuner with real ranks."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from runner_helpers import hpcdl_run, rank_lines
from test_engine_ops import CHECKS, passes, results, run_scenario


def test_timeline_is_a_chrome_trace_with_every_phase(tmp_path: Path) -> None:
    env_trace = tmp_path / "from_env.json"
    runtime_trace = tmp_path / "started_at_runtime.json"
    run_scenario(2, "timeline", str(runtime_trace), HPCDL_TIMELINE=str(env_trace))
    for trace, prefix in ((env_trace, "env."), (runtime_trace, "tl.")):
        events = json.loads(trace.read_text())  # strict JSON: the file is closed properly
        assert isinstance(events, list)
        names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
        assert f"{prefix}large" in names and not any(
            n.startswith("tl." if prefix == "env." else "env.") for n in names
        )
        for e in events:
            assert {"name", "ph", "pid"} <= e.keys()
            if e["ph"] == "X":
                assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0
    events = json.loads(runtime_trace.read_text())
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    phases_by_tensor: dict[str, set[str]] = {}
    for e in events:
        if e["ph"] == "X":
            phases_by_tensor.setdefault(tracks[e["tid"]], set()).add(e["name"])
    fused = {"NEGOTIATE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"}
    assert any(phases == fused for name, phases in phases_by_tensor.items() if name.startswith("tl.small."))
    assert phases_by_tensor["tl.large"] == {"NEGOTIATE", "QUEUE", "ALLREDUCE"}  # reduced in place
    assert phases_by_tensor["tl.tiny"] == {"NEGOTIATE", "QUEUE", "ALLREDUCE"}
    spans = [e for e in events if e["ph"] == "X"]
    tiny = [e for e in spans if e["name"] == "ALLREDUCE" and tracks[e["tid"]] == "tl.tiny"]
    assert tiny[0]["args"] == {"inline": True}  # its data came with the negotiation
    assert phases_by_tensor["tl.gather"] == {"NEGOTIATE", "QUEUE", "ALLGATHER"}
    assert phases_by_tensor["tl.bcast"] == {"NEGOTIATE", "QUEUE", "BROADCAST"}
    negotiate = [
        e for e in events if e["ph"] == "X" and e["name"] == "NEGOTIATE" and tracks[e["tid"]] == "tl.bcast"
    ]
    assert sorted(negotiate[0]["args"]["ready_ranks"]) == [0, 1]
    assert negotiate[0]["args"]["last_ready"] == 1  # rank 1 submitted late
    assert any(e["name"] == "CYCLE_START" for e in events)  # mark_cycles=True
    summary = subprocess.run(
        # --top: list every tensor; which ones lead the default top 10 depends on timing.
        [sys.executable, "-m", "hpcdl", "timeline", "summary", "--top", "50", str(runtime_trace)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert summary.returncode == 0, summary.stderr
    assert "MEMCPY_IN_FUSION_BUFFER" in summary.stdout and "tl.large" in summary.stdout
    assert "rank 1:" in summary.stdout  # who the others waited for


def test_timeline_stays_valid_json_when_rank_0_is_killed(tmp_path: Path) -> None:
    trace = tmp_path / "killed.json"
    done, _ = hpcdl_run(
        "-np", "2", sys.executable, CHECKS, "timeline_kill", timeout=60, HPCDL_TIMELINE=str(trace)
    )  # fmt: skip
    assert done.returncode != 0 and "PASS timeline_survives_kill" in done.stdout
    events = json.loads(trace.read_text())  # no shutdown ran, yet the file is complete JSON
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"killed.large", "killed.bcast"} <= names


def test_stall_inspector_warns_then_cancels_naming_the_missing_rank() -> None:
    done = run_scenario(
        2, "stall", HPCDL_STALL_CHECK_TIME_SECONDS="1", HPCDL_STALL_SHUTDOWN_TIME_SECONDS="2.5"
    )
    assert passes(done.stdout, 0) == ["stall"] and passes(done.stdout, 1) == ["stall"]
    warning = "\n".join(rank_lines(done.stderr.replace("<stderr>", "<stdout>"), 0))
    assert "stall inspector" in warning
    assert "allreduce 'stuck.tensor': rank 1 missing (submitted by rank 0" in warning
    listed = [line.split("'")[1] for line in warning.splitlines() if "missing (submitted by" in line]
    assert listed[:6] == ["stuck.a", "stuck.b", "stuck.c", "stuck.d", "stuck.e", "stuck.tensor"], listed
    error = results(done.stdout, 0, "stall error:")[0]
    assert "rank 1 has not submitted it" in error and "HPCDL_STALL_SHUTDOWN_TIME_SECONDS" in error


def test_autotune_converges_and_leaves_user_knobs_alone(tmp_path: Path) -> None:
    log = tmp_path / "autotune.csv"
    user_threshold = 8 << 20
    done = run_scenario(
        2,
        "autotune",
        "24",
        HPCDL_AUTOTUNE="1",
        HPCDL_AUTOTUNE_LOG=str(log),
        HPCDL_AUTOTUNE_WARMUP_SAMPLES="1",
        HPCDL_AUTOTUNE_STEPS_PER_SAMPLE="1",
        HPCDL_FUSION_THRESHOLD=str(user_threshold),
    )
    lines = log.read_text().splitlines()
    converged = [line for line in lines if line.startswith("# converged")]
    assert converged, log.read_text()
    samples = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    assert len(samples) >= 10
    assert {float(s["fusion_threshold"]) for s in samples} == {float(user_threshold)}
    assert len({s["cycle_time_ms"] for s in samples}) >= 4  # it tried several cycle times
    assert all(float(s["bytes_per_second"]) > 0 for s in samples)
    tried = results(done.stdout, 0, "cycle_times")[0]
    assert len(json.loads(tried)) >= 2  # every rank saw the knob change
