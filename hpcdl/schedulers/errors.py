"""Errors of the scheduler layer; every message says what to change."""

from __future__ import annotations

from hpcdl.common.exceptions import HpcdlError


class JobSpecError(HpcdlError):
    """The job request is impossible or malformed (walltime form, rank/GPU split, sweep syntax...)."""


class SiteConfigError(HpcdlError):
    """The site configuration file is unreadable, has unknown keys, or the request exceeds the site."""


class SchedulerError(HpcdlError):
    """A scheduler command failed, is missing, or gave an answer hpcdl cannot read."""


class JobUnknownError(SchedulerError):
    """The scheduler answered, and does not know the job: it never existed, or ended long enough ago to be
    forgotten. Any other SchedulerError of a status query means the scheduler could not be asked, which says
    nothing about the job."""


class ScriptCheckError(HpcdlError):
    """A rendered batch script would be rejected by its scheduler; ``problems`` lists why."""

    def __init__(self, scheduler: str, problems: list[str]) -> None:
        self.problems = problems
        listing = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{scheduler} would reject this script:\n{listing}")
