"""``hpcdl debug analyze DIR`` on the flight-recorder dumps and last words that real ranks of ``hpcdl run``
left in the job's debug directory: it says which rank is behind and at which operation (and where its Python
stack was), which operations the ranks submitted in a different order, which rank differs in shape, which
rank failed first, and the last operation all ranks completed. The rank programs are
``diagnosis_checks.py`` and ``first_failure_ranks.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from runner_helpers import clean_env, hpcdl_run

HERE = Path(__file__).parent
STALL = {"HPCDL_STALL_CHECK_TIME_SECONDS": "1", "HPCDL_STALL_SHUTDOWN_TIME_SECONDS": "2"}
# "the last operation all ranks completed: allreduce 'grad.1' at 16:46:48.932" and nothing after it: every
# rank completed that one, none a later one
LAST_COMPLETED = r"- the last operation all ranks completed: allreduce '{}' at \d\d:\d\d:\d\d\.\d\d\d$"


def analyzed(tmp_path: Path, np_: int, program: str, *args: str, **env: str) -> list[str]:
    """Run the job under ``hpcdl run`` with its debug directory in `tmp_path`, then analyze that directory."""
    debug = tmp_path / "debug"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    hpcdl_run(
        "-np", str(np_), sys.executable, str(HERE / program), *args,
        cwd=tmp_path, timeout=90, HPCDL_DEBUG_DIR=str(debug), HPCDL_TEST_FIFO=str(fifo), **env,
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "debug", "analyze", str(debug)],
        capture_output=True, text=True, timeout=30, env=clean_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def matching(pattern: str, lines: list[str]) -> list[str]:
    return [line for line in lines if re.search(pattern, line)]


def test_a_rank_stuck_in_user_code_is_named_behind_with_its_stack(tmp_path: Path) -> None:
    lines = analyzed(tmp_path, 3, "diagnosis_checks.py", "user_code", **STALL)
    assert lines[0] == "- dumps of ranks 0-2 of a job of 3", lines
    assert matching(LAST_COMPLETED.format("grad.1"), lines), lines
    (behind,) = matching(r"^- rank \d is behind", lines)
    assert re.match(
        r"- rank 2 is behind: ranks 0-1 wait(ed)? in allreduce 'grad.2' \(submitted at [\d:.]+\), which "
        r"rank 2 has not submitted; its last submission: allreduce 'grad.1' \(done\); its main thread was in "
        r"\(innermost first\):$",
        behind,
    ), behind
    stack = lines[lines.index(behind) + 1 :]
    assert stack[0].strip().startswith('File "') and stack[0].endswith("in stuck_in_dataloader"), stack
    assert not matching("different order|shape", lines), lines


def test_ops_submitted_in_another_order_are_named_with_each_ranks_op(tmp_path: Path) -> None:
    # Rank 0 looks for stalls once a second, at any phase against the submissions: 'order.a' is cancelled at
    # an age of 3 to 4 s, when 'order.b' (1.5 s younger) is past the stall check time, so the shutdown takes
    # it too and each rank dumps while it waits. With 2 s, 'order.b' was at times 0.5 s old then, and failed
    # only when rank 0 left (seen in CI).
    later_shutdown = {**STALL, "HPCDL_STALL_SHUTDOWN_TIME_SECONDS": "3"}
    lines = analyzed(tmp_path, 2, "diagnosis_checks.py", "order", **later_shutdown)
    assert matching(LAST_COMPLETED.format("order.warm"), lines), lines
    assert (
        "- ranks submitted operations in a different order (or took different code paths): after allreduce "
        "'order.warm', the last operation all completed, rank 0 submitted allreduce 'order.a'; rank 1 "
        "submitted allreduce 'order.b'; each waits for an operation the others have not submitted"
    ) in lines, lines
    assert matching(r"^- rank 0 is behind: rank 1 waits in allreduce 'order.b' ", lines), lines
    assert matching(r"^- rank 1 is behind: rank 0 waits in allreduce 'order.a' ", lines), lines


def test_a_shape_mismatch_names_the_rank_that_differs(tmp_path: Path) -> None:
    lines = analyzed(tmp_path, 3, "diagnosis_checks.py", "shape")
    assert lines[1].startswith("- ranks 0-2 wrote their dumps on mismatch: mismatched shape for"), lines
    assert matching(LAST_COMPLETED.format("grad.w"), lines), lines
    assert "- allreduce 'grad.w2': shape [4] on rank 0, [5] on ranks 1-2" in lines, lines
    assert matching(r"^- allreduce 'grad.w2' failed on ranks 0-2: mismatched shape", lines), lines
    assert not matching("is behind|different order", lines), lines


def test_the_rank_that_raised_is_named_first_from_its_last_words(tmp_path: Path) -> None:
    lines = analyzed(tmp_path, 3, "first_failure_ranks.py", "raise", CULPRIT="1")
    assert "- rank 1 failed first, on host " + os.uname().nodename + ": ValueError: boom on rank 1" in lines
    assert '        raise ValueError(f"boom on rank {hc.rank()}")' in lines, lines
    assert matching(r"^- ranks 0, 2 wrote their dumps on error: rank 1 has shut down", lines), lines


def test_ranks_that_held_nothing_when_a_peer_failed_dump_at_their_next_submission(tmp_path: Path) -> None:
    # Rank 1 raises while the others still load their first batch; it exits 3 s after its shutdown told them.
    late = {"SLOW_EXIT": "3", "FIRST_SUBMIT_AFTER": "1"}
    lines = analyzed(tmp_path, 3, "first_failure_ranks.py", "raise", CULPRIT="1", **late)
    assert "- rank 1 failed first, on host " + os.uname().nodename + ": ValueError: boom on rank 1" in lines
    assert matching(r"^- ranks 0, 2 wrote their dumps on error: rank 1 has shut down", lines), lines
