"""Write, submit and follow jobs: what ``hpcdl submit`` and ``hpcdl jobs`` do, as a library."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hpcdl.common.output_file import OutputFileError, open_output_fd
from hpcdl.schedulers.base import Scheduler
from hpcdl.schedulers.errors import JobSpecError, SchedulerError
from hpcdl.schedulers.job import JobSpec
from hpcdl.schedulers.records import JobRecord, load_record, records_dir
from hpcdl.schedulers.site import SiteConfig

SCRIPT_MODE = 0o700


def write_script(script: str, path: Path, force: bool) -> Path:
    """Write a rendered script, readable and executable by its owner only (it holds the job's ``--env``
    values), through :func:`hpcdl.common.output_file.open_output_fd`: created exclusively, never through a
    link nor into another user's file, and with ``force`` replacing an existing file or link of the user's
    atomically. Refuses to replace anything without ``force``."""
    try:
        fd = open_output_fd(path, "script", replace=force, parents=True, mode=SCRIPT_MODE)
    except OutputFileError as exc:
        raise SchedulerError(str(exc)) from None
    with os.fdopen(fd, "w") as out:
        os.fchmod(fd, SCRIPT_MODE)
        out.write(script)
    return path


@dataclass(frozen=True)
class Submitted:
    job_id: str
    script: Path
    record: JobRecord


@dataclass(frozen=True)
class Prepared:
    """A job whose script is written, not yet submitted."""

    job: JobSpec
    script: Path
    workdir: Path


class GroupSubmissionError(SchedulerError):
    """A job of a group was refused after others were submitted; ``left`` are those still submitted (the
    ones hpcdl could not cancel)."""

    def __init__(self, message: str, left: list[Submitted]) -> None:
        super().__init__(message)
        self.left = left


_INTERPRETER = re.compile(r"^(python[0-9.]*|bash|sh)$")
# Options of those interpreters that take a value (python -W/-X, bash -o/-O); -m, -c and - run no file.
_VALUE_OPTIONS = {"python": ("-W", "-X"), "shell": ("-o", "-O")}


def missing_paths(command: list[str], workdir: Path) -> list[str]:
    """The files ``command`` names that do not exist in ``workdir``, where the job starts: a ``*.py`` or
    path-like first word, or the script an interpreter (python, bash, sh) is given to run."""
    if not command:
        return []
    first, rest = command[0], command[1:]
    named = [first] if first.endswith(".py") or "/" in first else []
    if _INTERPRETER.match(Path(first).name):
        with_value = _VALUE_OPTIONS["python" if Path(first).name.startswith("python") else "shell"]
        skip_next = False
        for arg in rest:
            if skip_next:
                skip_next = False
            elif arg in ("-m", "-c", "-"):
                break
            elif arg in with_value:
                skip_next = True
            elif not arg.startswith("-"):
                named.append(arg)
                break
    return [name for name in named if not (workdir / name).expanduser().exists()]


def check_paths(job: JobSpec, workdir: Path) -> None:
    """JobSpecError before anything is submitted when the job's command names a file that is not there
    (it would fail only after waiting in the queue)."""
    missing = missing_paths(job.command, workdir)
    if missing:
        raise JobSpecError(
            f"{', '.join(missing)}: no such file in {workdir}, where the job would start; give the path of "
            "your program (the job would fail only after waiting in the queue)"
        )


def prepare_job(
    scheduler: Scheduler,
    job: JobSpec,
    site: SiteConfig,
    script_path: Optional[Path] = None,
    force: bool = False,
    workdir: Optional[Path] = None,
) -> Prepared:
    """Check the job's files, render its script and write it (to ``script_path`` or hpcdl's state
    directory); nothing is submitted."""
    workdir = (workdir or Path.cwd()).resolve()
    check_paths(job, workdir)
    script = scheduler.render(job, site)
    if script_path is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        script_path = (
            records_dir().parent / "scripts" / f"{job.job_name}-{stamp}-{os.getpid()}.{scheduler.name}.sh"
        )
    write_script(script, script_path, force)
    return Prepared(job, script_path, workdir)


def submit_prepared(scheduler: Scheduler, prepared: Prepared) -> Submitted:
    """Submit a written script and remember the job."""
    job_id = scheduler.submit(prepared.script.resolve(), prepared.workdir)
    record = JobRecord(
        scheduler=scheduler.name,
        job_id=job_id,
        name=prepared.job.job_name,
        workdir=str(prepared.workdir),
        script=str(prepared.script.resolve()),
        log_globs=scheduler.log_globs(prepared.job),
        checkpoint=prepared.job.checkpoint,
    )
    record.save()
    return Submitted(job_id, prepared.script, record)


def submit_job(
    scheduler: Scheduler,
    job: JobSpec,
    site: SiteConfig,
    script_path: Optional[Path] = None,
    force: bool = False,
    workdir: Optional[Path] = None,
) -> Submitted:
    """Render, write (to ``script_path`` or hpcdl's state directory), submit and remember the job."""
    return submit_prepared(scheduler, prepare_job(scheduler, job, site, script_path, force, workdir))


def submit_group(
    scheduler: Scheduler,
    group: list[Prepared],
    on_submitted: Callable[[Submitted], None] = lambda submitted: None,
) -> list[Submitted]:
    """Submit jobs that belong together, all or none: each script is first checked by the scheduler itself
    where it can check without submitting (``sbatch --test-only``), and when one is still refused, the jobs
    submitted before it are cancelled (GroupSubmissionError says which, and which could not be)."""
    for number, prepared in enumerate(group, 1):
        try:
            scheduler.check_submission(prepared.script.resolve(), prepared.workdir)
        except SchedulerError as exc:
            raise SchedulerError(
                f"job {number} of {len(group)} ({prepared.script}) would be refused, so none was "
                f"submitted: {exc}"
            ) from None
    submitted: list[Submitted] = []
    for number, prepared in enumerate(group, 1):
        try:
            done = submit_prepared(scheduler, prepared)
        except SchedulerError as exc:
            raise _rolled_back(
                scheduler, submitted, f"job {number} of {len(group)} was refused: {exc}"
            ) from None
        submitted.append(done)
        on_submitted(done)
    return submitted


def _rolled_back(scheduler: Scheduler, submitted: list[Submitted], refusal: str) -> GroupSubmissionError:
    """Cancel the jobs submitted before a refusal; the error saying so."""
    if not submitted:
        return GroupSubmissionError(f"{refusal}; nothing was submitted", [])
    cancelled, left, problems = [], [], []
    for done in submitted:
        try:
            scheduler.cancel(done.job_id)
            cancelled.append(done.job_id)
        except SchedulerError as exc:
            left.append(done)
            problems.append(str(exc))
    message = f"{refusal}; cancelled the {len(cancelled)} job(s) submitted before it ({', '.join(cancelled)})"
    if left:
        ids = " ".join(d.job_id for d in left)
        message += (
            f"; could NOT cancel {ids} ({'; '.join(problems)}): cancel them yourself with hpcdl jobs cancel"
        )
    return GroupSubmissionError(message, left)


def scheduler_of(job_id: str, requested: str) -> str:
    """The scheduler to ask about ``job_id``: the one it was submitted to by hpcdl, else ``requested``."""
    record = load_record(job_id)
    if record is not None and requested == "auto":
        return record.scheduler
    return requested


def job_log_files(scheduler: Scheduler, job_id: str) -> list[Path]:
    """Output files of the job: those the scheduler reports, else those its record points at."""
    files = [p for p in scheduler.log_files(job_id) if p.is_file()]
    record = load_record(job_id)
    if record is not None:
        files += [p for p in record.log_files() if p not in files]
    if not files:
        where = f" (looked for {', '.join(record.log_globs)} in {record.workdir})" if record else ""
        raise SchedulerError(
            f"no output files of job {job_id} found{where}; the job may not have started yet "
            "(see hpcdl jobs status), or it was not submitted by hpcdl from this account"
        )
    return files


def tail(path: Path, lines: Optional[int]) -> str:
    text = path.read_text(errors="replace")
    if lines is None:
        return text
    return "".join(text.splitlines(keepends=True)[-lines:]) if lines > 0 else ""
