"""Write, submit and follow jobs: what ``hpcdl submit`` and ``hpcdl jobs`` do, as a library."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hpcdl.common.output_file import OutputFileError, open_output_fd
from hpcdl.schedulers.base import Scheduler
from hpcdl.schedulers.errors import SchedulerError
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


def submit_job(
    scheduler: Scheduler,
    job: JobSpec,
    site: SiteConfig,
    script_path: Optional[Path] = None,
    force: bool = False,
    workdir: Optional[Path] = None,
) -> Submitted:
    """Render, write (to ``script_path`` or hpcdl's state directory), submit and remember the job."""
    script = scheduler.render(job, site)
    if script_path is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        script_path = (
            records_dir().parent / "scripts" / f"{job.job_name}-{stamp}-{os.getpid()}.{scheduler.name}.sh"
        )
    write_script(script, script_path, force)
    workdir = (workdir or Path.cwd()).resolve()
    job_id = scheduler.submit(script_path.resolve(), workdir)
    record = JobRecord(
        scheduler=scheduler.name,
        job_id=job_id,
        name=job.job_name,
        workdir=str(workdir),
        script=str(script_path.resolve()),
        log_globs=scheduler.log_globs(job),
    )
    record.save()
    return Submitted(job_id, script_path, record)


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
