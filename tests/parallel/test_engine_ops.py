"""The engine with real ranks: ordering, validation, groups, process sets, collectives, cache, fusion,
join."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from runner_helpers import hpcdl_run, rank_lines

CHECKS = str(Path(__file__).with_name("engine_rank_checks.py"))


def run_scenario(np_: int, scenario: str, *args: str, timeout: float = 90, **env: str):
    done, _ = hpcdl_run("-np", str(np_), sys.executable, CHECKS, scenario, *args, timeout=timeout, **env)
    assert done.returncode == 0, f"{scenario} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def passes(stdout: str, rank: int) -> list[str]:
    return [line.split()[1] for line in rank_lines(stdout, rank) if line.startswith("PASS ")]


def results(stdout: str, rank: int, prefix: str) -> list[str]:
    start = f"RESULT {prefix}"
    return [line[len(start) :].strip() for line in rank_lines(stdout, rank) if line.startswith(start)]


def test_core_behaviour_on_three_ranks() -> None:
    done = run_scenario(3, "core", HPCDL_CACHE_CAPACITY="4")
    expected = [
        "out_of_order_threads",
        "mismatch_errors",
        "grouped_atomic",
        "process_sets",
        "other_collectives",
        "wait_timeout",
        "names_and_cache",
        "handle_lifetime",
    ]
    for rank in range(3):
        assert passes(done.stdout, rank) == expected
    # Every rank got the very same mismatch message, naming the tensor, the ranks and the difference.
    messages = [results(done.stdout, rank, "mismatch") for rank in range(3)]
    assert messages[0] == messages[1] == messages[2]
    shape = next(m for m in messages[0] if m.startswith("shape"))
    assert "'bad.shape': shape [3] on ranks 0-1, [4] on rank 2." in shape, shape
    assert [m.split(":")[0] for m in messages[0]] == [
        "shape",
        "dtype",
        "reduction",
        "scaling",
        "root",
        "operation",
        "shape",
    ]
    rows = messages[0][-1]
    assert "'bad.rows': shape [*, 3] on rank 0, [*, 2] on ranks 1-2." in rows, rows
    scaling = messages[0][3]
    assert "scaling (prescale 1, postscale 1) on rank 0, (prescale 2, postscale 1) on ranks 1-2" in scaling, (
        scaling
    )


def test_fusion_on_and_off_give_identical_results() -> None:
    fused = run_scenario(2, "fusion", HPCDL_FUSION_THRESHOLD=str(64 << 20))
    unfused = run_scenario(2, "fusion", HPCDL_FUSION_THRESHOLD="0")
    digests = {}
    for name, done in (("fused", fused), ("unfused", unfused)):
        lines = [results(done.stdout, rank, "digest")[0] for rank in range(2)]
        assert lines[0] == lines[1]
        digests[name] = lines[0]
    assert digests["fused"].split()[0] == digests["unfused"].split()[0]
    assert re.search(r"fusion_threshold=67108864$", digests["fused"])
    assert re.search(r"fusion_threshold=0$", digests["unfused"])


def test_join_with_uneven_data() -> None:
    done = run_scenario(3, "join")
    for rank in range(3):
        assert passes(done.stdout, rank) == ["join_uneven"]


def test_a_loop_of_short_steps_is_not_paced_by_the_cycle_time() -> None:
    # With a 100 ms cycle time, 20 steps paced by it would take 2 s; each step's cycle must start as soon
    # as its caller waits for the step's results.
    done = run_scenario(2, "short_steps", "20", HPCDL_CYCLE_TIME="100")
    for rank in range(2):
        assert passes(done.stdout, rank) == ["short_steps"]
        (line,) = results(done.stdout, rank, "short_steps")
        seconds = float(line.split()[-2])
        assert seconds < 1.0, f"rank {rank}: {line} (a step per 100 ms cycle would take 2 s)"


def test_a_blocking_call_does_not_wake_the_engine_thread() -> None:
    """A blocking 1 MiB allreduce woke the engine thread at its submission, a context switch it did not need
    (its caller runs the cycle): 5-9 us a call at 2 ranks. One rank, so that no late peer makes the engine
    thread take part, whatever the machine's load: 47-50 wake-ups in 300 calls before, 0-1 now. A blocking
    allgather (its result allocated by the engine) likewise; and released results' buffers are reused."""
    calls = 300
    done = run_scenario(1, "blocking_wakes", str(calls))
    assert passes(done.stdout, 0) == ["blocking_wakes", "blocking_gather_wakes", "result_buffers"]
    for check in ("blocking_wakes", "blocking_gather_wakes"):
        (line,) = results(done.stdout, 0, check)
        assert int(line.split()[0]) < calls // 20, line


def test_results_the_engine_allocates_reuse_released_buffers() -> None:
    done = run_scenario(2, "result_buffers")
    for rank in range(2):
        assert passes(done.stdout, rank) == ["result_buffers"], done.stdout[-3000:]


def test_horovod_semantics_of_names_scaling_groups_and_shutdown() -> None:
    """A name stays taken until its result is collected; integer and float16 prescaling rounds like
    Horovod's and a float average over 3 ranks divides; groups on a subset do not shift the global group
    ids; the response cache grows to hold a model with more names than its default capacity; one rank's
    shutdown fails the others' pending and later operations at once, naming it."""
    done = run_scenario(3, "semantics", HPCDL_LOG_LEVEL="info")
    # With hpcdl run --verbose (log level info) rank 0 says when the cache grew, and why, once.
    grew = [line for line in done.stderr.splitlines() if "response cache grew" in line]
    assert len(grew) == 1 and grew[0].startswith("[0]<stderr>:"), done.stderr[-3000:]
    assert "grew to 2048 entries: 'model.0' came back" in grew[0], grew
    for rank in range(3):
        expected = [
            "names_until_collected",
            "prescale_rounds",
            "group_ids",
            "cache_grows",
            "shutdown_ends_the_job",
        ]
        assert passes(done.stdout, rank) == expected, done.stdout[-3000:]
