"""``hpcdl.checkpoint.run`` across real ranks: a signal that reaches one rank only (in the middle of a
collective, or during a checkpoint's write, or twice) stops every rank at the same commit; the job exits
with the requeue status after rank 0 ran the requeue command on a complete checkpoint; the next run
resumes bitwise. A rank killed during the write leaves the previous checkpoint loadable; a checkpoint of
another world size continues data-parallel state and refuses per-rank parts, on every rank alike.

The rank program is ``preemptible_numpy.py`` (no framework: each run starts in about a second); the same
protocol under Slurm with PyTorch: tests/integration/test_checkpoint_slurm.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest
from _ranks import RankResult, run_ranks

import hpcdl.checkpoint as ckpt

PROGRAM = str(Path(__file__).with_name("preemptible_numpy.py"))
STOPPED = ckpt.contract.DEFAULT_EXIT_CODE


def _run(np: int, path: Path, plan: Optional[list[dict[str, Any]]] = None, *extra: str,
         env: Optional[dict[str, str]] = None) -> list[RankResult]:  # fmt: skip
    variables = {"PREEMPT_PLAN": json.dumps(plan or []), **(env or {})}
    return run_ranks(
        np, PROGRAM, env=variables, launcher="manual", args=("--path", str(path), *extra), timeout=90
    )


def _codes(results: list[RankResult]) -> list[Optional[int]]:
    return [r.returncode for r in results]


def _finished(results: list[RankResult]) -> dict[str, Any]:
    assert _codes(results) == [0] * len(results), [r.stderr[-2000:] for r in results]
    assert len({r.result["params"] for r in results}) == 1
    return results[0].result


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The run of 2 ranks (with per-rank noise) that nothing interrupts."""
    return _finished(_run(2, tmp_path_factory.mktemp("reference") / "ckpt", None, "--shard"))


def test_a_signal_on_one_rank_stops_every_rank_at_one_commit_and_the_runs_add_up_bitwise(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    path = tmp_path / "ckpt"
    requeued = tmp_path / "requeued"
    requeue = f'ls "{path}" >> "{requeued}"; echo "rank $HPCDL_RANK" >> "{requeued}"'
    plan = [
        {"name": "collective", "rank": 1, "step": 9, "action": "signal", "where": "collective"},
        {"name": "twice", "rank": 0, "step": 17, "action": "signal", "signal": "TERM"},
        {"name": "in-write", "rank": 1, "after": 16, "action": "signal", "where": "write"},
    ]
    first = _run(2, path, plan, "--shard", env={ckpt.contract.REQUEUE_ENV: requeue})
    assert _codes(first) == [STOPPED, STOPPED], [r.stderr[-2000:] for r in first]
    assert "step 9 saved" in first[0].stderr and "(SIGUSR2; 2 ranks" in first[0].stderr
    # Rank 0 requeued once, when the checkpoint was complete (its directory had its final name).
    assert requeued.read_text().split("\n") == ["ckpt-000001-step-9", "history.jsonl", "rank 0", ""]
    found, _, parts = ckpt.load(path)
    assert (found.manifest.step, sorted(parts)) == (9, [0, 1])

    # A TERM on rank 0 at step 17, and a USR2 on rank 1 while it writes that checkpoint: one stop.
    second = _run(2, path, plan, "--shard")
    assert _codes(second) == [STOPPED, STOPPED], [r.stderr[-2000:] for r in second]
    assert "PLAN in-write: SIGUSR2 to rank 1" in second[1].stderr
    assert [d.name for _, d in ckpt.CheckpointStore(path).complete()] == ["ckpt-000002-step-17"]

    last = _finished(_run(2, path, plan, "--shard"))
    assert (last["resumed_at"], last["params"], last["steps"]) == (
        17,
        reference["params"],
        reference["steps"],
    )
    events = ckpt.CheckpointStore(path).history()
    assert [e["event"] for e in events] == ["start", "checkpoint", "requeue", "start", "checkpoint", "start",
                                            "checkpoint"]  # fmt: skip


def test_a_rank_killed_while_writing_leaves_the_previous_checkpoint_to_resume_from(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    path = tmp_path / "ckpt"
    plan = [{"name": "killed", "rank": 1, "step": 10, "action": "kill", "where": "write"}]
    failed = _run(2, path, plan, "--shard", "--every", "5")
    assert failed[1].returncode == -9 and failed[0].returncode not in (0, STOPPED), failed[0].stderr[-2000:]
    assert "rank 1" in failed[0].stderr  # rank 0 was told which peer it lost
    found, saved, parts = ckpt.load(path)
    assert (found.manifest.step, saved["commits"], sorted(parts)) == (5, 5, [0, 1])
    (partial,) = [p for p in path.iterdir() if p.name.endswith(".partial")]
    assert partial.name == ".ckpt-000002-step-10.partial"
    assert any(
        p.name.startswith(".rank-00001.pkl.") and p.stat().st_size >= 1 << 20 for p in partial.iterdir()
    )

    resumed = _finished(_run(2, path, plan, "--shard", "--every", "5"))
    assert (resumed["resumed_at"], resumed["params"]) == (5, reference["params"])
    assert not partial.exists()


def test_another_world_size_continues_replicated_state_and_refuses_per_rank_parts(tmp_path: Path) -> None:
    stop = [{"name": "stop", "rank": 1, "step": 4, "action": "signal"}]
    assert _codes(_run(2, tmp_path / "replicated", stop)) == [STOPPED, STOPPED]
    resumed = _run(3, tmp_path / "replicated", stop)
    assert _finished(resumed)["seen"] == 2 * 96
    assert "continuing 2 ranks' checkpoint on 3 ranks" in resumed[0].stderr

    assert _codes(_run(2, tmp_path / "sharded", stop, "--shard")) == [STOPPED, STOPPED]
    refused = _run(3, tmp_path / "sharded", stop, "--shard")
    for result in refused:
        assert result.returncode == 1
        assert "per-rank parts cannot be resharded: run with 2 ranks" in result.stderr, result.stderr[-2000:]


_STORM = """
import json, os, signal, threading, time
import numpy as np
import hpcdl.common as hc
from hpcdl.checkpoint import signals
from hpcdl.common.elastic_state import stop_requested

hc.init()
stop = threading.Event()
sent = [0]
def storm():
    while not stop.is_set():
        os.kill(os.getpid(), signal.SIGUSR2)
        sent[0] += 1
        time.sleep(0.0005)
with signals.catching(signals.parse(["USR2"])):
    threading.Thread(target=storm, daemon=True).start()
    wrong = 0
    for i in range(1500):
        out = hc.allreduce(np.full(1 + (i % 5) * 20000, float(hc.rank() + 1), np.float32))
        wrong += int(not np.all(out == 3.0))
    stop.set()
print("RESULT " + json.dumps({"wrong": wrong, "flag": stop_requested(), "sent": sent[0]}), flush=True)
"""


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_signals_landing_in_collectives_change_nothing_but_the_flag(transport: str) -> None:
    """Thousands of USR2s while two ranks allreduce (the engine's threads see them too): every result
    is right, nothing fails, and the only effect is the stop request."""
    results = run_ranks(2, _STORM, env={"HPCDL_TRANSPORT": transport}, launcher="manual", timeout=120)
    for result in results:
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.result["sent"] > 100, result.result
        assert (result.result["wrong"], result.result["flag"]) == (0, 12)
