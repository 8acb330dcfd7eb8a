"""The engine's side of the GPU path with real ranks and no torch: what a device batch carries to the
executor, how its end completes or fails the operations, and what happens to a batch the executor never
finishes (a NCCL kernel waiting forever): the deadline, and a dead peer seen by the engine's heartbeat.
The ranks act as their own executors (gpu_engine_checks.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from _ranks import run_ranks
from runner_helpers import hpcdl_run, rank_lines

CHECKS = Path(__file__).with_name("gpu_engine_checks.py")


def test_batches_carry_tags_counts_and_rows_and_their_end_completes_them() -> None:
    done, _ = hpcdl_run("-np", "3", sys.executable, str(CHECKS), "batches", timeout=60, HPCDL_TIMEOUT="20")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in range(3):
        passes = [line.split()[1] for line in rank_lines(done.stdout, rank) if line.startswith("PASS ")]
        assert passes == [
            "batches_carry_what_the_executor_needs",
            "a_failed_batch_fails_its_operations_and_the_engine",
        ]


def test_a_collective_that_never_finishes_fails_at_the_deadline() -> None:
    results = run_ranks(
        2, str(CHECKS), args=("hung",), env={"HPCDL_TIMEOUT": "2"}, launcher="manual", timeout=60
    )
    for r in results:
        assert r.result is not None, r.stderr[-3000:]
        assert "allreduce 'hung'" in r.result["waited"], r.result
        assert "did not complete on the device" in r.result["aborted"], r.result  # the executor must abort
        assert "ranks 0, 1" in r.result["aborted"], r.result
        assert 1.5 < r.result["seconds"] < 5, r.result


def test_an_operation_no_executor_takes_fails_at_the_deadline_saying_so() -> None:
    results = run_ranks(
        2, str(CHECKS), args=("untaken",), env={"HPCDL_TIMEOUT": "2"}, launcher="manual", timeout=60
    )
    assert results[0].result == {"rank": 0, "ok": True}, results[0].stderr[-3000:]
    message = results[1].result["message"]
    assert "allreduce 'untaken'" in message and "device executor has not taken it" in message, message


def test_a_peer_dying_while_a_collective_never_finishes_fails_the_survivors_at_once() -> None:
    results = run_ranks(
        3, str(CHECKS), args=("dead",), env={"HPCDL_TIMEOUT": "30"}, launcher="manual", timeout=90
    )
    assert results[2].returncode == -9
    for r in results[:2]:
        assert r.result is not None, r.stderr[-3000:]
        assert "rank 2" in r.result["waited"] and "died" in r.result["waited"], r.result
        assert "rank 2" in r.result["aborted"], r.result  # the executor learns it too, and aborts
        assert r.result["seconds"] < 3, r.result  # the heartbeat, not the 30 s deadline
