"""Reading a rank's last traceback, judging it cause or consequence, and naming the job's first failure from
every rank's end, whatever order the launcher saw the ends in."""

from __future__ import annotations

import itertools
import json
import signal
import time
from pathlib import Path

import pytest

from hpcdl.common import last_words
from hpcdl.common.exceptions import HpcdlInternalError
from hpcdl.diagnosis.consequences import Verdict, judge, judge_line
from hpcdl.diagnosis.tracebacks import TracebackReader, last_error
from hpcdl.diagnosis.words import ranks_text
from hpcdl.runner.first_failure import account, detail_lines, with_last_words
from hpcdl.runner.procs import Outcome, RankEnd

SHUTDOWN = (
    "hpcdl.common.exceptions.HpcdlShutdownError: rank 1 has shut down (called shutdown() or exited): the "
    "job's collectives cannot run without it, so this rank's pending and later operations fail."
)
STALL = (
    "hpcdl.common.exceptions.HpcdlShutdownError: stall shutdown: allreduce 'grad.2' was submitted by ranks "
    "0, 2 but rank 1 has not submitted it after 2.0 s (HPCDL_STALL_SHUTDOWN_TIME_SECONDS)"
)


def traceback_lines(*exception_lines: str, frames: int = 1) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    for number in range(frames):
        lines += [f'  File "/job/train.py", line {10 + number}, in step{number}', f"    step{number + 1}()"]
    lines.append("           ^^^^^^^^^")
    return lines + list(exception_lines)


def test_the_reader_keeps_the_last_traceback_among_other_output() -> None:
    lines = [
        "epoch 1",
        *traceback_lines("KeyError: 'x'"),
        "more output",
        *traceback_lines("ValueError: boom on rank 1", frames=2),
        "hpcdl: a line printed after it",
    ]
    error = last_error(lines)
    assert error is not None
    assert (error.type, error.name, error.message) == ("ValueError", "ValueError", "boom on rank 1")
    assert [f.describe() for f in error.frames] == ["/job/train.py:10 in step0", "/job/train.py:11 in step1"]
    assert error.chain == ("ValueError: boom on rank 1",)
    assert not any("^^^" in line for line in error.lines)  # Python 3.11's markers are left out


def test_the_reader_keeps_a_chain_and_shortens_a_long_traceback() -> None:
    lines = [
        *traceback_lines(SHUTDOWN),
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        *traceback_lines("RuntimeError: training failed", frames=12),
    ]
    reader = TracebackReader()
    for line in lines:
        reader.feed(line)
    error = reader.last
    assert error is not None and error.name == "RuntimeError"
    assert error.chain == (SHUTDOWN, "RuntimeError: training failed")
    assert len(error.frames) == 12
    assert "  ... 6 more frame(s) ..." in error.lines
    assert error.lines[0].startswith("Traceback") and error.lines[-1] == "RuntimeError: training failed"
    assert judge(error) == Verdict(True, (1,), "shutdown")  # the user's wrapper does not make it a cause


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (SHUTDOWN, Verdict(True, (1,), "shutdown")),
        (
            "HpcdlShutdownError: ranks 1, 3 have shut down (called shutdown() or exited)",
            Verdict(True, (1, 3), "shutdown"),
        ),
        (STALL, Verdict(True, (1,), "stall")),
        (
            "HpcdlInternalError: allreduce: lost the connection to rank 2 (host b) (connection closed); that "
            "rank probably exited or crashed",
            Verdict(True, (2,), "connection"),
        ),
        (
            "HpcdlInternalError: allreduce (direct, process set 0): rank 1 (pid 16121) died (its process is "
            "gone)",
            Verdict(True, (1,), "connection"),
        ),
        (
            "HpcdlTimeoutError: allgather: timed out receiving from rank 3 (host c) (HPCDL_TIMEOUT); that "
            "rank is hung",
            Verdict(True, (3,), "timeout"),
        ),
        (
            "HpcdlTimeoutError: timed out after 5 s waiting for allreduce 'x': ranks 1, 2 have not submitted "
            "it (a rank may be stuck, slower, or have taken a different code path)",
            Verdict(True, (1, 2), "timeout"),
        ),
        ("HpcdlShutdownError: the job shut down for a reason no rank named", Verdict(True, (), "shutdown")),
        ("HpcdlShutdownError: hpcdl was shut down on this rank (shutdown() was called)", Verdict(False)),
        ("ValueError: boom on rank 1", Verdict(False)),
        ("HpcdlMismatchError: allreduce 'w': shape [4] on rank 0, [5] on ranks 1-2", Verdict(False)),
    ],
)
def test_consequences_name_the_rank_they_blame(line: str, expected: Verdict) -> None:
    error = last_error(traceback_lines(line))
    assert error is not None and judge(error) == expected
    assert judge_line(line, line.split(":")[0].endswith("HpcdlShutdownError")) == expected


def end(
    rank: int,
    code: int | None = 1,
    at: float = 1.0,
    error: str | None = None,
    signum: int | None = None,
    oom: str = "",
    error_at: float | None = None,
) -> RankEnd:
    if signum is not None:
        outcome: Outcome | None = Outcome(signal=signum, oom=oom)
    else:
        outcome = None if code is None else Outcome(exit_code=code)
    raised = last_error(traceback_lines(error)) if error else None
    return RankEnd(
        rank, f"node{rank}", outcome, at, raised, error_at if error_at is not None else at, ["last"]
    )


def test_the_cause_is_named_whichever_end_the_launcher_saw_first() -> None:
    cause = end(1, at=3.0, error="ValueError: boom on rank 1")
    others = [end(0, at=1.0, error=SHUTDOWN), end(2, at=2.0, error=SHUTDOWN), end(3, signum=15, at=4.0)]
    for ends in itertools.permutations([cause, *others]):
        found = account(list(ends))
        assert found is not None and found.first is cause and found.own
        assert found.what == "failed first, with ValueError: boom on rank 1 (exited with code 1)"
        assert sorted(e.rank for e, _ in found.consequences) == [0, 2]
        assert [e.rank for e in found.stopped] == [3]
        assert found.exit_code == 1


def test_the_earliest_of_several_causes_is_first() -> None:
    found = account(
        [end(0, at=2.0, error="KeyError: 'a'"), end(1, code=3, at=1.5), end(2, at=1.9, error="OSError: x")]
    )
    assert found is not None and found.first.rank == 1 and found.what == "exited with code 3"
    assert found.exit_code == 3


def test_a_rank_whose_output_was_lost_is_judged_from_its_last_words(tmp_path: Path) -> None:
    """Open MPI's mpirun crashed (in PMIx_Finalize) while it stopped a job: rank 1's traceback never reached
    the launcher and no exit status came for it. The last words it left name its error; another job's, and
    another rank's, do not count."""
    try:
        raise ValueError("boom on rank 1")
    except ValueError as exc:
        words = last_words.describe(1, ValueError, exc, exc.__traceback__)
    (tmp_path / "exit.rank1.json").write_text(json.dumps(words))
    job_start = time.time() - 10
    ends = [end(0, at=2.0, error=SHUTDOWN), end(1, code=None, at=3.0), end(2, code=None, at=3.0)]
    (tmp_path / "exit.rank2.json").write_text(json.dumps({**words, "time": job_start - 60, "rank": 2}))
    found = account(with_last_words(ends, tmp_path, job_start))
    assert found is not None and found.first.rank == 1 and found.own, found
    assert found.what == "failed first, with ValueError: boom on rank 1 (ended without an exit status)"
    assert [c.rank for c, _ in found.consequences] == [0]
    # without them, rank 1 is found through rank 0's blame only
    blamed = account(ends)
    assert blamed is not None and blamed.first.rank == 1 and not blamed.own
    # last words from before the job started, or left under another rank's name, are not read
    stale = account(with_last_words(ends, tmp_path, words["time"] + 1))
    assert stale is not None and not stale.own
    (tmp_path / "exit.rank1.json").write_text(json.dumps({**words, "rank": 3}))
    assert account(with_last_words(ends, tmp_path, job_start)).own is False  # type: ignore[union-attr]


def test_a_rank_that_exited_0_early_is_the_first_failure() -> None:
    found = account([end(0, code=0, at=1.0), end(1, at=2.0, error=SHUTDOWN.replace("rank 1", "rank 0")),
                     end(2, at=2.1, error=SHUTDOWN.replace("rank 1", "rank 0"))])  # fmt: skip
    assert found is not None and found.first.rank == 0 and not found.own
    assert found.what == "exited with code 0 while ranks 1-2 still waited for it in collectives"
    assert found.exit_code == 1


def test_a_rank_that_shut_down_and_was_stopped_as_it_ended_is_the_first_failure() -> None:
    blaming = SHUTDOWN.replace("rank 1", "rank 0")
    found = account([end(0, signum=15, at=1.2), end(1, at=1.0, error=blaming), end(2, at=1.0, error=blaming)])
    assert found is not None and found.first.rank == 0
    assert found.what == (
        "shut down while ranks 1-2 still waited for it in collectives, and was stopped as it ended (was "
        "killed by signal SIGTERM (15))"
    )


def test_a_stuck_rank_named_by_a_stall_shutdown_is_the_first_failure() -> None:
    found = account([end(0, at=1.0, error=STALL), end(2, at=1.0, error=STALL), end(1, signum=15, at=1.2)])
    assert found is not None and found.first.rank == 1
    assert found.what == (
        "never submitted the operation ranks 0, 2 waited for (stall shutdown), and was stopped (was killed "
        "by signal SIGTERM (15))"
    )


def test_a_kill_is_a_cause_before_the_job_fails_and_an_oom_kill_always() -> None:
    lost = "HpcdlInternalError: allreduce: lost the connection to rank 2 (host b) (connection closed)"
    found = account([end(0, at=1.0, error=lost), end(2, signum=signal.SIGKILL, at=1.1)])
    assert found is not None and found.first.rank == 2 and not found.own  # found through the blame
    assert found.what == "was killed by signal SIGKILL (9), and rank 0 failed for want of it"
    oom = "the kernel log says: Memory cgroup out of memory: Killed process 42 (python)"
    found = account(
        [end(0, at=1.0, error="ValueError: late"), end(2, signum=signal.SIGKILL, at=0.5, oom=oom)]
    )
    assert found is not None and found.first.rank == 2 and found.own
    assert found.what == f"was killed by signal SIGKILL (9): the kernel's OOM killer ended it ({oom})"
    assert found.exit_code == 128 + signal.SIGKILL


def test_blame_is_followed_down_a_chain() -> None:
    found = account([
        end(2, at=1.0, error=SHUTDOWN),  # blames rank 1
        end(1, at=1.1, error=SHUTDOWN.replace("rank 1", "rank 0")),
        end(0, code=0, at=0.5),
    ])  # fmt: skip
    assert found is not None and found.first.rank == 0 and found.what.startswith("exited with code 0")


def test_no_failure_and_only_consequences() -> None:
    assert account([end(0, code=0), end(1, code=0)]) is None
    found = account([end(0, at=2.0, error="HpcdlShutdownError: the job shut down"), end(1, code=None)])
    assert found is not None and found.first.rank == 0 and not found.own
    assert "no rank reported" in found.what


def test_details_show_the_traceback_and_group_the_consequences() -> None:
    found = account(
        [end(1, at=3.0, error="ValueError: boom"), *(end(r, at=1.0, error=SHUTDOWN) for r in (0, 2, 3, 5))]
    )
    assert found is not None
    lines = detail_lines(found, lambda e: e.where)
    assert lines[0] == "its error (rank 1 on host node1):"
    assert lines[1:3] == [
        "    Traceback (most recent call last):",
        '      File "/job/train.py", line 10, in step0',
    ]
    assert lines[-2] == "    ValueError: boom"
    assert lines[-1].startswith(
        "consequence, not a cause: ranks 0, 2-3, 5 failed with HpcdlShutdownError: rank 1 "
    )
    assert ranks_text([4]) == "rank 4" and ranks_text([]) == ""


def test_a_stuck_rank_is_shown_with_what_the_others_reported_about_it() -> None:
    report = [
        "Where the missing ranks are:",
        "  rank 1 (host node1, pid 7): its engine last submitted allreduce 'g'",
        "    its main thread, innermost frame first:",
        '  File "/job/train.py", line 27 in stuck_in_dataloader',
    ]
    waiting = end(0, at=1.0, error=STALL)
    raised = last_error([*traceback_lines(STALL), *report, "hpcdl: rank 0's error above is a consequence"])
    assert raised is not None and raised.more == tuple(report)
    waiting = RankEnd(0, "node0", waiting.outcome, 1.0, raised, 1.0, [])
    found = account([waiting, end(2, at=1.0, error=STALL), end(1, signum=15, at=1.2)])
    assert found is not None and found.first.rank == 1
    lines = detail_lines(found, lambda e: e.where)
    assert lines[0] == "what rank 0 on host node0 reported about it:"
    assert lines[1:5] == [f"    {line}" for line in report]


class _Writes:
    """A standard error that keeps each write() apart."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_a_consequence_says_so_in_one_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under mpirun, every rank's stderr is forwarded write by write: a pointer written as its text and then
    its newline once had another rank's traceback line glued to its end."""
    stderr = _Writes()
    monkeypatch.setattr("sys.stderr", stderr)
    installed = {"rank": 0, "directory": tmp_path, "previous": lambda *args: None}
    monkeypatch.setattr(last_words, "_installed", installed)
    try:
        raise HpcdlInternalError(
            "allreduce: lost the connection to rank 2 (host b) (connection closed); that rank probably "
            "exited or crashed"
        )
    except HpcdlInternalError as error:
        last_words._say_last_words(HpcdlInternalError, error, error.__traceback__)
    (said,) = [text for text in stderr.writes if "hpcdl: rank 0's error above" in text]
    assert said.startswith("hpcdl: rank 0's error above is a consequence of rank 2's end") and said.endswith(
        "\n"
    ), stderr.writes
