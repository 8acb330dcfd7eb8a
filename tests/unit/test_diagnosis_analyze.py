"""``hpcdl debug analyze DIR`` on crafted flight-recorder dumps: which rank is behind and at which operation,
which operations were submitted in a different order, which rank differs in shape or dtype, the last
operation all ranks completed, and the rank that failed first (its last words)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from hpcdl.cli.main import app
from hpcdl.common import last_words
from hpcdl.diagnosis import analyze, flight

T0 = 1_764_240_000.0
STACK = (
    "Thread 0x00007f0000000001 (most recent call first):\n"
    '  File "/job/train.py", line 27 in stuck_in_dataloader\n'
    '  File "/job/train.py", line 40 in next_batch\n'
    '  File "/job/train.py", line 52 in train\n'
    '  File "/job/train.py", line 60 in main\n'
    '  File "/job/train.py", line 64 in <module>\n'
    "\n"
    "Thread 0x00007f0000000002 (most recent call first):\n"
    '  File "/usr/lib/python3/threading.py", line 320 in wait\n'
)


def op(seq: int, name: str, state: str = "done", **fields: Any) -> dict[str, Any]:
    done = T0 + seq + 0.5 if state == "done" else None
    record = {
        "seq": seq, "name": name, "op": "allreduce", "reduce": "sum", "dtype": "float32", "shape": [4, 5],
        "bytes": 80, "process_set": 0, "device": "cpu", "state": state, "submitted": T0 + seq,
        "negotiated": None, "started": None, "done": done, "error": None,
    }  # fmt: skip
    record.update(fields)
    return record


def dump(rank: int, ops: list[dict[str, Any]], size: int = 3, **fields: Any) -> dict[str, Any]:
    record = {
        "version": 1, "rank": rank, "size": size, "host": f"node{rank}", "pid": 100 + rank, "time": T0 + 60,
        "reason": "stall", "message": "stall inspector: allreduce 'grad.2' waits",
        "process_sets": {"0": [0, 1, 2]}, "ops": ops, "stack": None,
    }  # fmt: skip
    record.update(fields)
    return record


def write(directory: Path, *dumps: dict[str, Any]) -> Path:
    directory.mkdir(exist_ok=True)
    for record in dumps:
        (directory / f"flight.rank{record['rank']}.json").write_text(json.dumps(record))
    return directory


def texts(directory: Path) -> list[str]:
    return [finding.text for finding in analyze.analyze(flight.load(directory))]


def steps(count: int) -> list[dict[str, Any]]:
    """`count` completed steps of grad.0, grad.1, grad.2 (the same names every step)."""
    return [op(3 * step + i, f"grad.{i}") for step in range(count) for i in range(3)]


def test_the_rank_behind_is_named_with_the_operation_the_others_wait_in(tmp_path: Path) -> None:
    history = steps(3)  # seq 0-8, the last completed: grad.2 (seq 8)
    waiting = [*history, op(9, "grad.0", "submitted")]
    directory = write(
        tmp_path / "job",
        dump(0, waiting),
        dump(2, waiting),
        dump(1, [*history[2:]], stack=STACK),  # a shorter ring: its oldest entries are gone
    )
    found = analyze.analyze(flight.load(directory))
    assert found[0].text == "dumps of ranks 0-2 of a job of 3"
    assert found[1].text == "ranks 0-2 wrote their dumps on stall: stall inspector: allreduce 'grad.2' waits"
    assert found[2].text.startswith("the last operation all ranks completed: allreduce 'grad.2' at ")
    behind = found[3]
    assert behind.text.startswith("rank 1 is behind: ranks 0, 2 wait in allreduce 'grad.0' (submitted at "), (
        behind.text
    )
    assert behind.text.endswith(
        "which rank 1 has not submitted; its last submission: allreduce 'grad.2' (done); its main thread was "
        "in (innermost first):"
    )
    assert behind.details == (
        'File "/job/train.py", line 27 in stuck_in_dataloader',
        'File "/job/train.py", line 40 in next_batch',
        'File "/job/train.py", line 52 in train',
        'File "/job/train.py", line 60 in main',
    )
    assert len(found) == 4  # the same order everywhere, no mismatch, nothing failed


def test_operations_cancelled_by_a_stall_shutdown_still_show_who_was_behind(tmp_path: Path) -> None:
    history = steps(2)
    cancelled = [*history, op(6, "grad.0", "cancelled", error="stall shutdown: ...")]
    directory = write(
        tmp_path / "job",
        dump(0, cancelled, reason="stall"),
        dump(2, cancelled),
        dump(1, history, stack=STACK),
    )
    found = texts(directory)
    assert any(
        t.startswith("rank 1 is behind: ranks 0, 2 waited in allreduce 'grad.0' (submitted at ")
        for t in found
    ), found


def test_operations_submitted_in_a_different_order_are_shown(tmp_path: Path) -> None:
    # both ranks completed x then y (the coordinator's order), but rank 1 submitted y first
    directory = write(
        tmp_path / "job",
        dump(0, [op(0, "w"), op(1, "x"), op(2, "y"), op(3, "z", "submitted")], size=2),
        dump(1, [op(0, "w"), op(2, "x", done=T0 + 1.5), op(1, "y", done=T0 + 2.5), op(3, "z", "submitted")],
             size=2),
    )  # fmt: skip
    found = texts(directory)
    assert (
        "ranks submitted operations in a different order: rank 0 submitted x, y, z; rank 1 submitted y, x, z"
        in (found)
    ), found
    assert not any("is behind" in text for text in found)  # both wait in z


def test_ranks_waiting_in_different_operations_are_each_behind_the_other(tmp_path: Path) -> None:
    directory = write(
        tmp_path / "job",
        dump(0, [op(0, "w"), op(1, "a", "submitted")], size=2),
        dump(1, [op(0, "w"), op(1, "b", "submitted")], size=2),
    )
    found = texts(directory)
    assert any(
        t.startswith("rank 0 is behind: rank 1 waits in allreduce 'b'")
        and t.endswith("it waits in allreduce 'a' instead, which the others have not submitted")
        for t in found
    ), found
    assert any(t.startswith("rank 1 is behind: rank 0 waits in allreduce 'a'") for t in found), found


def test_a_rank_that_differs_in_shape_or_dtype_is_named(tmp_path: Path) -> None:
    error = "mismatch: allreduce 'w': shape [4] on rank 0, [5] on ranks 1-2"
    directory = write(
        tmp_path / "job",
        dump(0, [op(0, "w", "failed", shape=[4], error=error)], reason="mismatch", message=error),
        dump(1, [op(0, "w", "failed", shape=[5], error=error)], reason="mismatch", message=error),
        dump(
            2,
            [op(0, "w", "failed", shape=[5], dtype="float16", error=error)],
            reason="mismatch",
            message=error,
        ),
    )
    found = texts(directory)
    assert "allreduce 'w': dtype float32 on ranks 0-1, float16 on rank 2" in found
    assert "allreduce 'w': shape [4] on rank 0, [5] on ranks 1-2" in found
    assert f"allreduce 'w' failed on ranks 0-2: {error}" in found
    assert "ranks 0-2 completed no operation in the recorded window" in found


def test_allgather_rows_may_differ_but_not_the_rest(tmp_path: Path) -> None:
    ops = [
        [op(0, "g", "submitted", op="allgather", shape=[3, 7])],
        [op(0, "g", "submitted", op="allgather", shape=[5, 7])],
        [op(0, "g", "submitted", op="allgather", shape=[5, 8])],
    ]
    directory = write(tmp_path / "job", *(dump(rank, listed) for rank, listed in enumerate(ops)))
    found = texts(directory)
    assert [t for t in found if "shape" in t] == [
        "allgather 'g': shape [*, 7] on ranks 0-1, [*, 8] on rank 2"
    ]


def test_missing_and_unreadable_dumps_and_process_sets(tmp_path: Path) -> None:
    directory = write(
        tmp_path / "job",
        dump(0, [op(0, "s", process_set=1), op(1, "t", "submitted", process_set=1)], size=4,
             process_sets={"0": [0, 1, 2, 3], "1": [0, 2]}),
        dump(2, [op(0, "s", process_set=1)], size=4, process_sets={"0": [0, 1, 2, 3], "1": [0, 2]}),
    )  # fmt: skip
    (directory / "flight.rank1.json").write_text("{not json")
    (directory / "flight.rank3.json").write_text(json.dumps({"version": 7}))
    found = texts(directory)
    assert found[0] == (
        "dumps of ranks 0, 2 of a job of 4; none of ranks 1, 3 (ended before writing one, or wrote it on its "
        "own host)"
    )
    assert found[1].startswith("flight.rank1.json cannot be read: ")
    assert found[2] == "flight.rank3.json cannot be read: format version 7, this hpcdl reads version 1"
    assert any(
        t.startswith("rank 2 is behind: rank 0 waits in allreduce 't' (process set 1)") for t in found
    ), found
    assert any(
        t.startswith("the last operation all ranks of process set 1 completed: allreduce 's' (process set 1)")
        for t in found
    )


def test_the_cli_reads_the_dumps_and_the_last_words(tmp_path: Path) -> None:
    directory = write(tmp_path / "job", dump(0, [op(0, "w"), op(1, "x", "submitted")], size=2),
                      dump(1, [op(0, "w")], size=2))  # fmt: skip
    traceback = ["Traceback (most recent call last):", '  File "/job/train.py", line 9, in <module>',
                 "ValueError: boom on rank 1"]  # fmt: skip
    words = {"rank": 1, "host": "node1", "pid": 7, "time": T0 + 1, "error": "ValueError: boom on rank 1",
             "traceback": traceback, "consequence": False, "blamed": []}  # fmt: skip
    (directory / "exit.rank1.json").write_text(json.dumps(words))
    done = CliRunner().invoke(app, ["debug", "analyze", str(directory)])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0] == "- dumps of ranks 0-1 of a job of 2"
    assert "- rank 1 failed first, on host node1: ValueError: boom on rank 1" in lines
    assert '      File "/job/train.py", line 9, in <module>' in lines
    assert any(line.startswith("- rank 1 is behind: rank 0 waits in allreduce 'x'") for line in lines)
    empty = CliRunner().invoke(app, ["debug", "analyze", str(tmp_path)])
    assert empty.exit_code == 2 and "holds no flight.rank<R>.json nor exit.rank<R>.json" in empty.output


def test_the_last_operation_all_completed_is_found_by_completion_order_not_the_hosts_clocks(
    tmp_path: Path,
) -> None:
    # rank 1's clock runs 5 s behind; both completed x then y; rank 1 completed z too
    skewed = [op(0, "x", done=T0 - 4.5), op(1, "y", done=T0 - 3.5), op(2, "z", done=T0 - 2.5)]
    directory = write(
        tmp_path / "job",
        dump(0, [op(0, "x"), op(1, "y"), op(2, "z", "submitted")], size=2),
        dump(1, skewed, size=2),
    )
    found = texts(directory)
    assert found[2].startswith("the last operation all ranks completed: allreduce 'y' at "), found
    assert found[2].endswith(" (its last on rank 0; rank 1 completed later ones)"), found
    # both completed x, by clocks 9 s apart: no rank is ahead
    same = write(tmp_path / "same", dump(0, [op(0, "x")], size=2), dump(1, [op(0, "x", done=T0 + 9)], size=2))
    assert "(its last" not in texts(same)[2], texts(same)


def test_ranks_waiting_in_different_operations_are_said_to_differ_in_order(tmp_path: Path) -> None:
    directory = write(
        tmp_path / "job",
        dump(0, [op(0, "w"), op(1, "a", "submitted")]),
        dump(1, [op(0, "w"), op(1, "b", "submitted")]),
        dump(2, [op(0, "w"), op(1, "a", "submitted")]),
    )
    assert (
        "ranks submitted operations in a different order (or took different code paths): after allreduce "
        "'w', the last operation all completed, ranks 0, 2 submitted allreduce 'a'; rank 1 submitted "
        "allreduce 'b'; each waits for an operation the others have not submitted"
    ) in texts(directory)


def test_ranks_that_all_raised_the_same_error_are_not_ranked_by_exit(tmp_path: Path) -> None:
    directory = write(tmp_path / "job", dump(0, [op(0, "w")], size=2), dump(1, [op(0, "w")], size=2))
    error = "HpcdlMismatchError: mismatched shape for allreduce 'w': shape [4] on rank 0, [5] on rank 1."
    for rank in (0, 1):
        words = {"rank": rank, "host": "node", "pid": 7, "time": T0 + rank, "error": error,
                 "traceback": [error], "consequence": False, "blamed": []}  # fmt: skip
        (directory / f"exit.rank{rank}.json").write_text(json.dumps(words))
    found = analyze.analyze(flight.load(directory), last_words.read_all(directory))
    assert [f.text for f in found if "failed" in f.text] == [f"ranks 0-1 failed with the same error: {error}"]
