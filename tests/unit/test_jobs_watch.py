"""Watching jobs: states polled until they end, a deadline, recent jobs from hpcdl's records, and what
``hpcdl jobs watch`` prints (a live table on a terminal, state changes as lines elsewhere)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from rich.console import Console

from hpcdl.cli import jobs as jobs_cli
from hpcdl.schedulers import JobState, JobUnknownError, SchedulerError, watch
from hpcdl.schedulers.records import JobRecord


class _Scheduler:
    """Answers from a script of states per poll; 'forgotten' raises as Slurm does for an old job, 'down' as
    it does while its controller cannot be reached."""

    def __init__(self, answers: list[list[tuple[str, str]]]) -> None:
        self.answers = answers
        self.polls = 0

    def status(self, job_id: str) -> list[JobState]:
        answer = self.answers[min(self.polls, len(self.answers) - 1)]
        self.polls += 1
        if answer == [("forgotten", "")]:
            raise JobUnknownError(f"Slurm does not know job {job_id}")
        if answer == [("down", "")]:
            raise SchedulerError(f"could not ask Slurm about {job_id}: Unable to contact slurm controller")
        return [JobState(task, state, state) for task, state in answer]


def test_wait_polls_until_every_task_has_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _Scheduler(
        [
            [("7_0", "PENDING"), ("7_1", "PENDING")],
            [("7_0", "COMPLETED"), ("7_1", "RUNNING")],
            [("7_0", "COMPLETED"), ("7_1", "COMPLETED")],
        ]
    )
    monkeypatch.setattr(watch, "get_scheduler", lambda name: backend)
    seen: list[str] = []
    statuses = watch.wait(
        [watch.WatchedJob("7", "slurm", "study")], 10, 0.01, lambda s: seen.append(s[0].summary())
    )
    assert seen == ["2 PENDING", "1 COMPLETED, 1 RUNNING", "2 COMPLETED"]
    assert statuses[0].finished and statuses[0].succeeded


def test_wait_has_a_deadline_that_names_the_waiting_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "get_scheduler", lambda name: _Scheduler([[("8", "RUNNING")]]))
    started = time.monotonic()
    with pytest.raises(watch.WaitTimeoutError, match=r"job\(s\) 8 \(RUNNING\) had not finished after 0 s"):
        watch.wait([watch.WatchedJob("8", "slurm")], 0.2, 0.05)
    assert time.monotonic() - started < 5


def test_a_job_the_scheduler_forgot_counts_as_ended_not_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "get_scheduler", lambda name: _Scheduler([[("forgotten", "")]]))
    (status,) = watch.poll([watch.WatchedJob("9", "slurm")])
    assert status.finished and not status.succeeded and "does not know job 9" in status.error
    assert status.summary() == "UNKNOWN"


def test_a_job_whose_scheduler_cannot_be_asked_has_not_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller outage says nothing of the job: it is neither ended nor failed, the wait goes on, and its
    deadline quotes the scheduler's own error."""
    backend = _Scheduler([[("down", "")], [("down", "")], [("10", "COMPLETED")]])
    monkeypatch.setattr(watch, "get_scheduler", lambda name: backend)
    (status,) = watch.poll([watch.WatchedJob("10", "slurm")])
    assert not status.finished and status.unanswered and status.summary() == "NO ANSWER"
    (status,) = watch.wait([watch.WatchedJob("10", "slurm")], 10, 0.01)
    assert status.succeeded and backend.polls == 3
    monkeypatch.setattr(watch, "get_scheduler", lambda name: _Scheduler([[("down", "")]]))
    with pytest.raises(watch.WaitTimeoutError, match="NO ANSWER: could not ask Slurm about 11: Unable"):
        watch.wait([watch.WatchedJob("11", "slurm")], 0.1, 0.05)


def test_recent_jobs_come_from_hpcdls_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert watch.recent_jobs(24) == []
    for job_id, age_hours in (("old", 48), ("new", 1), ("newer", 0.5)):
        path = JobRecord("slurm", job_id, f"job-{job_id}", str(tmp_path), "s.sh", []).save()
        stamp = time.time() - age_hours * 3600
        os.utime(path, (stamp, stamp))
    assert [j.job_id for j in watch.recent_jobs(24)] == ["new", "newer"]
    assert [j.name for j in watch.recent_jobs(72)] == ["job-old", "job-new", "job-newer"]


def test_watch_shows_a_table_and_logs_changes_once() -> None:
    running = watch.JobStatus(
        watch.WatchedJob("5", "slurm", "scaling-W2"), [JobState("5_0", "RUNNING", "RUNNING")]
    )
    lost = watch.JobStatus(watch.WatchedJob("6", "slurm", "x"), [], "Slurm does not know job 6")
    console = Console(record=True, width=120)
    console.print(jobs_cli._table([running, lost], time.monotonic()))
    table = console.export_text()
    assert "1/2 job(s) finished" in table and "5_0" in table and "scaling-W2" in table and "UNKNOWN" in table
    seen: dict[str, str] = {}
    first = jobs_cli._changes([running, lost], seen)
    assert [line.split(" ", 1)[1] for line in first] == [
        "5_0 scaling-W2 RUNNING (RUNNING)", "6 x UNKNOWN (Slurm does not know job 6)",
    ]  # fmt: skip
    assert jobs_cli._changes([running, lost], seen) == []  # nothing changed: nothing printed
