"""Write, submit and follow jobs: what ``hpcdl submit`` and ``hpcdl jobs`` do, as a library."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hpcdl.schedulers.base import Scheduler
from hpcdl.schedulers.errors import SchedulerError
from hpcdl.schedulers.job import JobSpec
from hpcdl.schedulers.records import JobRecord, load_record, records_dir
from hpcdl.schedulers.site import SiteConfig

SCRIPT_MODE = 0o700


def write_script(script: str, path: Path, force: bool) -> Path:
    """Write a rendered script, readable and executable by its owner only (it holds the job's ``--env``
    values), never through a symbolic link: a new file is created exclusively (``O_EXCL|O_NOFOLLOW``), and
    with ``force`` an existing path is replaced by renaming a file made beside it, which replaces a link
    planted there instead of writing where it points. Refuses to replace anything without ``force``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if not force:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            _write_private(os.open(path, flags, SCRIPT_MODE), script)
            return path
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            _write_private(fd, script)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except FileExistsError:
        raise SchedulerError(
            f"{path} already exists; pass --force to overwrite it, or choose another -o path"
        ) from None
    except OSError as exc:
        raise SchedulerError(f"cannot write the script to {path}: {exc.strerror}") from None
    return path


def _write_private(fd: int, text: str) -> None:
    with os.fdopen(fd, "w") as out:
        os.fchmod(fd, SCRIPT_MODE)
        out.write(text)


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
        checkpoint=job.checkpoint,
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
