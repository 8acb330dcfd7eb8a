"""The engine's direct path with real ranks: a lone, small blocking collective (a name the response cache
knows, or a new one) or a small group runs on the caller's thread when the engine is idle, with the
engine's guarantees: ordering against operations in flight, mismatches caught (on first-seen names too),
joined ranks, process sets, a runtime shut down and started again (an elastic reset), a peer's shutdown
while a caller waits. The rank programs are in ``direct_path_checks.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from runner_helpers import hpcdl_run, rank_lines

CHECKS = str(Path(__file__).with_name("direct_path_checks.py"))


def run(tmp_path: Path, np_: int, *scenarios: str, **env: str) -> str:
    done, _ = hpcdl_run(
        "-np", str(np_), sys.executable, CHECKS, *scenarios, timeout=120,
        HPCDL_DEBUG_DIR=str(tmp_path / "debug"), HPCDL_DYNAMIC_PROCESS_SETS="1", **env,
    )  # fmt: skip
    assert done.returncode == 0, f"{scenarios} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def passes(stdout: str, rank: int) -> list[str]:
    return [line.split()[1] for line in rank_lines(stdout, rank) if line.startswith("PASS ")]


def direct_calls(stdout: str, np_: int, check: str) -> int:
    """How many of the check's blocking calls ran on their caller's thread, over every rank."""
    prefix = f"RESULT direct {check} "
    return sum(
        int(line[len(prefix) :])
        for rank in range(np_)
        for line in rank_lines(stdout, rank)
        if line.startswith(prefix)
    )


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_direct_calls_keep_order_catch_mismatches_and_serve_process_sets(tmp_path: Path, np_: int) -> None:
    scenarios = ("ordering", "mismatch", "unnamed", "groups", "process_sets")
    stdout = run(tmp_path, np_, *scenarios)
    for rank in range(np_):
        assert passes(stdout, rank) == list(scenarios)
    for check in scenarios:
        assert direct_calls(stdout, np_, check) > 0, f"no call of {check} took the direct path"


def test_direct_calls_beside_a_joined_rank_and_after_a_reset(tmp_path: Path) -> None:
    stdout = run(tmp_path, 3, "join", "reinit")
    for rank in range(3):
        assert passes(stdout, rank) == ["join", "reinit"]
    assert direct_calls(stdout, 3, "join") > 0 and direct_calls(stdout, 3, "reinit") > 0


def test_a_peer_shutting_down_fails_a_waiting_direct_call_at_once(tmp_path: Path) -> None:
    stdout = run(tmp_path, 2, "shutdown")
    assert direct_calls(stdout, 2, "shutdown") > 0
    left = float(next(line.split()[2] for line in rank_lines(stdout, 1) if line.startswith("RESULT left")))
    failed = next(line for line in rank_lines(stdout, 0) if line.startswith("RESULT failed"))
    assert "rank 1 has shut down" in failed, failed
    assert float(failed.split()[2]) - left < 1.0, failed
