"""Where a stuck or diverging rank is, as the waiting ranks are told it, under ``hpcdl run`` and ``mpirun``,
over every transport: a stall report (warning and shutdown) shows each missing rank's main-thread Python
stack and what its engine last submitted, also while that rank holds the GIL in C code; ops submitted in
another order show both ranks' last submissions; shape and process-set mismatches name every rank and its
value; a timeout says where the missing rank is; every rank's flight recorder lands in the job's debug
directory. The rank programs are in ``diagnosis_checks.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _ranks import OPENMPI, RankResult, run_ranks

CHECKS = str(Path(__file__).with_name("diagnosis_checks.py"))
openmpi = pytest.param("openmpi", marks=pytest.mark.skipif(not Path(OPENMPI).exists(), reason="no Open MPI"))


def run(tmp_path: Path, np_: int, scenario: str, launcher: str = "hpcdl", api: str = "common", **env: str):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    settings = {
        "HPCDL_DEBUG_DIR": str(tmp_path / "debug"),
        "HPCDL_TEST_FIFO": str(fifo),
        "HPCDL_STALL_CHECK_TIME_SECONDS": "1",
        # rank 0 checks for stalls once a second: 4 s leaves time for a warning before the shutdown
        "HPCDL_STALL_SHUTDOWN_TIME_SECONDS": "4",
        **env,
    }
    return run_ranks(np_, CHECKS, env=settings, launcher=launcher, args=(scenario, api), timeout=90)


def flight(tmp_path: Path, rank: int) -> dict:
    return json.loads((tmp_path / "debug" / f"flight.rank{rank}.json").read_text())


def frames(message: str) -> list[str]:
    return [line.strip() for line in message.splitlines() if line.strip().startswith("File ")]


def assert_stack_of_stuck_rank(message: str, rank: int, function: str) -> None:
    assert f"rank {rank} (host " in message, message
    assert "its engine last submitted allreduce 'grad.1' (done" in message, message
    assert "its main thread, innermost frame first:" in message, message
    shown = frames(message)
    inner = next(i for i, line in enumerate(shown) if line.endswith(f"in {function}"))
    outer = next(i for i, line in enumerate(shown) if line.endswith("in <module>"))
    assert inner < outer, message


@pytest.mark.parametrize(
    ("launcher", "api", "transport"),
    [
        ("hpcdl", "common", "shm"),
        ("hpcdl", "common", "tcp"),
        pytest.param("openmpi", "common", "mpi", marks=openmpi.marks),
        ("hpcdl", "torch", "gloo-standin"),
    ],
)
def test_a_rank_stuck_in_user_code_is_shown_where_it_is(
    tmp_path: Path, launcher: str, api: str, transport: str
) -> None:
    env = (
        {"HPCDL_GPU_OPERATIONS": "gloo-standin"}
        if transport == "gloo-standin"
        else {"HPCDL_TRANSPORT": transport}
    )
    ranks = run(tmp_path, 3, "user_code", launcher, api, **env)
    for r in ranks[:2]:
        assert r.result and r.result["error"] == "HpcdlShutdownError", r.stdout + r.stderr
        message = r.result["message"]
        assert message.startswith("stall shutdown: allreduce 'grad.2' was submitted by ranks 0, 1"), message
        assert_stack_of_stuck_rank(message, 2, "stuck_in_dataloader")
    warning = ranks[0].stderr
    assert "stall inspector (rank 0)" in warning and "in stuck_in_dataloader" in warning, warning
    for rank in range(3):
        dump = flight(tmp_path, rank)
        assert dump["version"] == 1 and dump["rank"] == rank and dump["size"] == 3
        assert dump["reason"] == "stall" and dump["process_sets"] == {"0": [0, 1, 2]}
        assert dump["stack"] and "(most recent call first)" in dump["stack"]
        names = [op["name"] for op in dump["ops"]]
        assert names == (["grad.1"] if rank == 2 else ["grad.1", "grad.2"]), dump["ops"]
        assert [op["seq"] for op in dump["ops"]] == list(range(1, len(names) + 1))
        first = dump["ops"][0]
        assert first["state"] == "done" and first["submitted"] <= first["negotiated"] <= first["done"], first
        if rank < 2:
            waiting = dump["ops"][1]
            assert waiting["state"] in ("submitted", "cancelled") and waiting["done"] in (
                None,
                waiting["done"],
            )
            assert waiting["device"] == ("gpu" if api == "torch" else "cpu"), waiting


@pytest.mark.parametrize("launcher", ["hpcdl", openmpi])
def test_a_rank_stuck_in_c_code_holding_the_gil_is_shown_where_it_is(tmp_path: Path, launcher: str) -> None:
    ranks = run(tmp_path, 3, "c_call", launcher)
    for r in ranks[:2]:
        assert r.result and r.result["error"] == "HpcdlShutdownError", r.stdout + r.stderr
        assert_stack_of_stuck_rank(r.result["message"], 2, "stuck_in_c_call")


@pytest.mark.parametrize("launcher", ["hpcdl", openmpi])
def test_ops_submitted_in_another_order_show_what_each_rank_submitted(tmp_path: Path, launcher: str) -> None:
    """'order.a' (rank 0's) passes the stall shutdown time first; 'order.b' (rank 1's) is cancelled with it,
    so rank 1 too is told where rank 0 is, rather than only that rank 0 left."""
    ranks = run(tmp_path, 2, "order", launcher)
    ends = (
        "s (HPCDL_STALL_SHUTDOWN_TIME_SECONDS); it was cancelled",
        "the stall shutdown of allreduce 'order.a' ends it",
    )
    for r, other, theirs, end in ((ranks[0], 1, "order.b", ends[0]), (ranks[1], 0, "order.a", ends[1])):
        assert r.result and r.result["error"] == "HpcdlShutdownError", r.stdout + r.stderr
        message = r.result["message"]
        assert message.startswith("stall shutdown: ") and end in message, message
        assert f"rank {other} (host " in message, message
        assert f"its engine last submitted allreduce '{theirs}' (submitted" in message, message
        assert any(line.endswith("in submit_in_order") for line in frames(message)), message
    orders = [[op["name"] for op in flight(tmp_path, rank)["ops"]] for rank in range(2)]
    assert orders == [["order.warm", "order.a"], ["order.warm", "order.b"]], orders


@pytest.mark.parametrize("launcher", ["hpcdl", openmpi])
def test_a_shape_mismatch_names_every_rank_and_its_shape(tmp_path: Path, launcher: str) -> None:
    ranks = run(tmp_path, 3, "shape", launcher)
    expected = "mismatched shape for allreduce 'grad.w2': shape [4] on rank 0, [5] on ranks 1-2."
    for r in ranks:
        assert r.result and r.result["error"] == "HpcdlMismatchError", r.stdout + r.stderr
        assert r.result["message"].startswith(expected), r.result["message"]
    for rank in range(3):
        dump = flight(tmp_path, rank)
        assert dump["reason"] == "mismatch" and dump["message"].startswith(expected), dump["message"]
        assert dump["ops"][-1]["shape"] == [4 if rank == 0 else 5] and dump["ops"][-1]["state"] == "failed"


@pytest.mark.parametrize("api", ["common", "torch"])
def test_a_process_set_mismatch_is_named(tmp_path: Path, api: str) -> None:
    ranks = run(tmp_path, 3, "process_set", api=api)
    for r in ranks:
        assert r.result and r.result["error"] == "HpcdlShutdownError", r.stdout + r.stderr
        message = r.result["message"]
        assert "mismatched process set for allreduce 'ps.x'" in message, message
        assert "process set 1 on rank 0" in message and "process set 0 on ranks 1-2" in message, message


def test_a_timeout_says_where_the_missing_rank_is(tmp_path: Path) -> None:
    ranks: list[RankResult] = run(tmp_path, 2, "timeout", HPCDL_STALL_CHECK_DISABLE="1")
    r = ranks[0]
    assert r.result and r.result["error"] == "HpcdlTimeoutError", r.stdout + r.stderr
    message = r.result["message"]
    assert message.startswith(
        "timed out after 2 s waiting for allreduce 'late': rank 1 has not submitted it"
    ), message
    assert "rank 1 (host " in message and "its engine last submitted allreduce 'warm' (done" in message, (
        message
    )
    assert any(line.endswith("in stuck_in_dataloader") for line in frames(message)), message
    assert flight(tmp_path, 1)["reason"] == "timeout"  # the rank asked where it was
    # Rank 0 wrote its dump at the timeout; when rank 1 shuts down first, 'late' (still pending on rank 0)
    # fails then, and that later dump replaces it.
    assert flight(tmp_path, 0)["reason"] in ("timeout", "error")


def test_the_flight_recorder_keeps_the_last_submissions_finished_and_pending(tmp_path: Path) -> None:
    """A ring of 8: the dump holds the last 8 submissions, oldest first, numbered without gaps; those that
    finished and were released (kept as copies) show their name, shape, size and state as the live ones do."""
    ranks = run(tmp_path, 2, "ring", HPCDL_FLIGHT_RECORDER_SIZE="8")
    results = [
        [json.loads(line[len("RESULT ") :]) for line in r.stdout.splitlines() if line.startswith("RESULT ")]
        for r in ranks
    ]
    assert len(results[0]) == 2 and len(results[1]) == 1, [r.stdout + r.stderr for r in ranks]

    def step(i: int, seq: int) -> dict:
        return {"seq": seq, "name": f"step.{i}", "shape": [i + 1], "bytes": 4 * (i + 1), "state": "done"}

    def shown(ops: list[dict]) -> list[dict]:
        return [{k: op[k] for k in ("seq", "name", "shape", "bytes", "state")} for op in ops]

    while_pending = results[0][0]["while_pending"]
    assert shown(while_pending) == [step(i, i + 1) for i in range(13, 20)] + [
        {"seq": 21, "name": "pending", "shape": [3], "bytes": 12, "state": "submitted"}
    ]
    assert while_pending[-1]["done"] is None and all(op["done"] for op in while_pending[:-1])
    assert all(op["op"] == "allreduce" and op["reduce"] == "average" for op in while_pending)
    assert all(op["error"] is None for op in while_pending)
    rank0_after = [
        {"seq": 21, "name": "pending", "shape": [3], "bytes": 12, "state": "done"},
        {"seq": 22, "name": "go", "shape": [1], "bytes": 4, "state": "done"},
    ]
    assert shown(results[0][1]["after"]) == [step(i, i + 1) for i in range(14, 20)] + rank0_after
    rank1_after = [
        {"seq": 21, "name": "go", "shape": [1], "bytes": 4, "state": "done"},
        {"seq": 22, "name": "pending", "shape": [3], "bytes": 12, "state": "done"},
    ]
    assert shown(results[1][0]["after"]) == [step(i, i + 1) for i in range(14, 20)] + rank1_after
