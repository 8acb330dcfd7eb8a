"""The GPU path on real ranks, with gloo standing in for NCCL (``HPCDL_GPU_OPERATIONS=gloo-standin``: CPU
tensors take exactly the path CUDA tensors take, only NCCL's kernels and CUDA streams are not exercised).

The engine negotiates every operation by name and the executor runs the decided batches in the engine's
order: every op and form gives Horovod's result, ranks may submit in any order from any thread, every
mismatch raises HpcdlMismatchError on every rank, a stalled rank is named by the stall inspector, a dead
rank makes the others raise at once naming it, and the timeline shows the phases. The checks run inside
the ranks (gpu_rank_checks.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from _ranks import run_ranks
from runner_helpers import hpcdl_run, rank_lines

CHECKS = Path(__file__).with_name("gpu_rank_checks.py")
STANDIN = {"HPCDL_GPU_OPERATIONS": "gloo-standin", "HPCDL_TIMEOUT": "60"}


def run_scenario(np_: int, scenario: str, timeout: float = 240, **env: str):
    done, _ = hpcdl_run(
        "-np", str(np_), sys.executable, str(CHECKS), scenario, timeout=timeout, **{**STANDIN, **env}
    )
    assert done.returncode == 0, f"{scenario} failed:\n{done.stdout[-5000:]}\n{done.stderr[-3000:]}"
    for rank in range(np_):
        lines = rank_lines(done.stdout, rank)
        passes = [line.split()[1] for line in lines if line.startswith("PASS ")]
        expected = [check.__name__ for check in _scenarios()[scenario]]
        assert passes == expected, f"rank {rank} passed {passes}, expected {expected}\n{done.stdout[-3000:]}"
    return done


def _scenarios() -> dict:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_rank_checks", CHECKS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SCENARIOS


def results(stdout: str, rank: int) -> list[dict]:
    return [
        json.loads(line[len("RESULT ") :]) for line in rank_lines(stdout, rank) if line.startswith("RESULT ")
    ]


def test_every_op_and_form_on_three_ranks() -> None:
    """Every dtype and reduction, scaling, in place, views, fused bursts, groups, uneven allgather and
    reducescatter, alltoall splits, broadcast roots, a process set and join with stand-in zeros."""
    run_scenario(3, "forms")


def test_submission_in_another_order_per_rank_and_thread() -> None:
    """Named tensors from three threads and five different collectives, in another order on every rank,
    spread over two NCCL streams (lanes)."""
    run_scenario(3, "order", HPCDL_NUM_NCCL_STREAMS="2")


def test_every_mismatch_raises_the_same_error_on_every_rank() -> None:
    done = run_scenario(3, "mismatch")
    per_rank = [results(done.stdout, rank) for rank in range(3)]
    assert per_rank[0] == per_rank[1] == per_rank[2]
    messages = {r["case"]: r["message"] for r in per_rank[0]}
    assert "mismatched shape for allreduce 'bad.shape'" in messages["shape"]
    assert "shape [3] on ranks 0-1, [4] on rank 2" in messages["shape"]
    assert "dtype float32 on ranks 0-1, float64 on rank 2" in messages["dtype"]
    assert "reduction sum on ranks 0-1, max on rank 2" in messages["reduction"]
    assert "root 0 on ranks 0-1, 1 on rank 2" in messages["root"]
    assert "operation allreduce on ranks 0-1, allgather on rank 2" in messages["operation"]
    assert "mismatched placement for allreduce 'bad.placement'" in messages["placement"]
    assert "a host tensor (engine data plane) on rank 2" in messages["placement"]


def test_jobs_started_and_ended_back_to_back() -> None:
    run_scenario(3, "lifecycle")


def test_a_stalled_rank_is_named_by_the_stall_inspector() -> None:
    done = run_scenario(3, "stall", HPCDL_STALL_CHECK_TIME_SECONDS="1")
    text = "\n".join(line for line in (done.stdout + done.stderr).splitlines() if "[0]<stderr>" in line)
    assert "stall inspector" in text, done.stdout[-3000:] + done.stderr[-3000:]
    assert "allreduce 'late': rank 2 missing (submitted by ranks 0, 1" in text, text


def test_a_dead_rank_makes_the_others_raise_at_once_naming_it() -> None:
    results_ = run_ranks(
        3, str(CHECKS), args=("dead",), env={**STANDIN, "HPCDL_TIMEOUT": "30"}, launcher="manual", timeout=120
    )
    assert results_[2].returncode == -9  # SIGKILL
    for r in results_[:2]:
        assert r.result is not None, r.stderr[-3000:]
        assert not r.result.get("foreign"), r.result  # an hpcdl error, not the backend's
        assert r.result["error"] in ("HpcdlInternalError", "HpcdlShutdownError"), r.result
        assert "rank 2" in r.result["message"], r.result["message"]
        assert r.result["seconds"] < 5, r.result  # noticed as a death, far before the 30 s deadline


def test_the_timeline_shows_the_phases_of_device_operations(tmp_path: Path) -> None:
    timeline = tmp_path / "timeline.json"
    run_scenario(2, "timeline", HPCDL_TIMELINE=str(timeline), HPCDL_FUSION_THRESHOLD=str(1 << 20))
    events = json.loads(timeline.read_text())
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    spans: dict[str, list[dict]] = {}
    for e in events:
        if e["ph"] == "X":
            spans.setdefault(tracks[e["tid"]], []).append(e)
    fused = spans["tl.fused.3"]
    assert [e["name"] for e in fused] == [
        "NEGOTIATE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"
    ] * 3  # fmt: skip
    for e in fused[2:5]:
        assert e["args"]["device"] is True and e["args"]["fused_tensors"] == 6, e
    for step in range(3):
        phases = fused[5 * step : 5 * step + 5]
        for before, after in zip(phases, phases[1:]):  # one after the other (1 us rounding)
            assert before["ts"] <= after["ts"] + 1 and before["ts"] + before["dur"] <= after["ts"] + 2, phases
    big = spans["tl.big"]
    assert [e["name"] for e in big] == ["NEGOTIATE", "QUEUE", "ALLREDUCE"] * 3  # above the threshold: alone
    assert big[2]["args"] == {"device": True, "bytes": 4 << 19}
    cached = [e["args"].get("cached", False) for e in big if e["name"] == "NEGOTIATE"]
    assert cached == [False, True, True]  # the response cache answers from the second step on
    assert [e["name"] for e in spans["tl.gather"]] == ["NEGOTIATE", "QUEUE", "ALLGATHER"]
    assert [e["name"] for e in spans["tl.bcast"]] == ["NEGOTIATE", "QUEUE", "BROADCAST"]
