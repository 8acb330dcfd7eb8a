"""The states of submitted batch jobs, polled until they end: what ``hpcdl jobs watch`` shows and what
``hpcdl scaling collect --wait`` waits for."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from hpcdl.common.exceptions import HpcdlError
from hpcdl.schedulers import JobState, JobUnknownError, SchedulerError, get_scheduler
from hpcdl.schedulers.records import JobRecord, records_dir

FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
DEFAULT_INTERVAL_S = 5.0
DEFAULT_TIMEOUT_S = 24 * 3600.0
NO_ANSWER = "NO ANSWER"  # the state shown while a job's scheduler cannot be asked


class WaitTimeoutError(HpcdlError):
    """Jobs were still queued or running when the wait's deadline passed."""


@dataclass(frozen=True)
class WatchedJob:
    job_id: str
    scheduler: str
    name: str = ""


@dataclass
class JobStatus:
    """One job as its scheduler answered, or why it could not say: ``error`` with ``unanswered`` when the
    scheduler could not be asked (its controller down: nothing is known of the job, which is not counted
    as ended), without when it answered that it knows no such job (it forgot a job that ended long ago)."""

    job: WatchedJob
    states: list[JobState]
    error: str = ""
    unanswered: bool = False

    @property
    def finished(self) -> bool:
        if self.error:
            return not self.unanswered
        return bool(self.states) and all(s.state in FINAL_STATES for s in self.states)

    @property
    def succeeded(self) -> bool:
        return not self.error and bool(self.states) and all(s.state == "COMPLETED" for s in self.states)

    def summary(self) -> str:
        """``RUNNING`` or, for arrays, counts such as ``2 COMPLETED, 1 RUNNING``."""
        if self.error:
            return NO_ANSWER if self.unanswered else "UNKNOWN"
        counts: dict[str, int] = {}
        for s in self.states:
            counts[s.state] = counts.get(s.state, 0) + 1
        if len(self.states) == 1:
            return self.states[0].state
        return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def poll(jobs: list[WatchedJob]) -> list[JobStatus]:
    """Ask each job's scheduler for its state (once per job)."""
    found = []
    for job in jobs:
        try:
            found.append(JobStatus(job, get_scheduler(job.scheduler).status(job.job_id)))
        except JobUnknownError as exc:
            found.append(JobStatus(job, [], str(exc)))
        except SchedulerError as exc:
            found.append(JobStatus(job, [], str(exc), unanswered=True))
    return found


def wait(
    jobs: list[WatchedJob],
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = DEFAULT_INTERVAL_S,
    on_poll: Callable[[list[JobStatus]], None] = lambda statuses: None,
) -> list[JobStatus]:
    """Poll every ``interval`` seconds until every job has finished; WaitTimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        statuses = poll(jobs)
        on_poll(statuses)
        if all(s.finished for s in statuses):
            return statuses
        if time.monotonic() + interval > deadline:
            waiting = [
                f"{s.job.job_id} ({s.summary()}: {s.error})"
                if s.unanswered
                else f"{s.job.job_id} ({s.summary()})"
                for s in statuses
                if not s.finished
            ]
            raise WaitTimeoutError(
                f"job(s) {', '.join(waiting)} had not finished after {timeout:.0f} s; "
                "wait longer (--timeout) or look at them with hpcdl jobs status"
            )
        time.sleep(interval)


def recent_jobs(since_hours: float, now: Optional[float] = None) -> list[WatchedJob]:
    """The jobs hpcdl submitted from this account in the last ``since_hours`` hours, oldest first."""
    cutoff = (time.time() if now is None else now) - since_hours * 3600
    directory = records_dir()
    if not directory.is_dir():
        return []
    recent = [p for p in directory.glob("*.json") if p.stat().st_mtime >= cutoff]
    found = []
    for path in sorted(recent, key=lambda p: p.stat().st_mtime):
        try:
            record = JobRecord(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        found.append(WatchedJob(record.job_id, record.scheduler, record.name))
    return found
