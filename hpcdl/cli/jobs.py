"""``hpcdl jobs status|cancel|logs JOB`` and ``hpcdl jobs watch``: follow batch jobs through their
schedulers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from hpcdl.checkpoint.report import job_progress
from hpcdl.common import progress
from hpcdl.common.exceptions import HpcdlError
from hpcdl.scaling.cluster import load_jobs
from hpcdl.schedulers import Scheduler, get_scheduler, scheduler_names, watch
from hpcdl.schedulers.records import load_record
from hpcdl.schedulers.submission import job_log_files, scheduler_of, tail

jobs_app = typer.Typer(
    help="Follow batch jobs: status, watch, cancel, logs.", no_args_is_help=True, rich_markup_mode=None
)

_SCHEDULER_HELP = (
    f"auto|{'|'.join(scheduler_names())} (default: the one hpcdl submitted the job to, else auto)."
)


def _backend(job_id: str, scheduler: str) -> Scheduler:
    return get_scheduler(scheduler_of(job_id, scheduler))


def _fail(command: str, exc: HpcdlError) -> typer.Exit:
    typer.echo(f"hpcdl jobs {command}: {exc}", err=True)
    return typer.Exit(2)


@jobs_app.command("status")
def status_command(
    job_id: str = typer.Argument(..., metavar="JOB"),
    scheduler: str = typer.Option("auto", "--scheduler", "-s", help=_SCHEDULER_HELP),
) -> None:
    """Print the job's state (one line per array task); for a --checkpoint job, its restarts too."""
    try:
        states = _backend(job_id, scheduler).status(job_id)
    except HpcdlError as exc:
        raise _fail("status", exc) from None
    for state in states:
        typer.echo(f"{state.job_id}\t{state.state}\t{state.native}")
    record = load_record(job_id)
    if record is not None and record.checkpoint:
        typer.echo(
            f"checkpoint {record.checkpoint}: {job_progress(Path(record.checkpoint), job_id).describe()}"
        )


@jobs_app.command("cancel")
def cancel_command(
    job_id: str = typer.Argument(..., metavar="JOB"),
    scheduler: str = typer.Option("auto", "--scheduler", "-s", help=_SCHEDULER_HELP),
) -> None:
    """Cancel the job (every array task)."""
    try:
        backend = _backend(job_id, scheduler)
        backend.cancel(job_id)
    except HpcdlError as exc:
        raise _fail("cancel", exc) from None
    typer.echo(f"hpcdl: asked {backend.name} to cancel job {job_id}")


@jobs_app.command("logs")
def logs_command(
    job_id: str = typer.Argument(..., metavar="JOB"),
    scheduler: str = typer.Option("auto", "--scheduler", "-s", help=_SCHEDULER_HELP),
    lines: Optional[int] = typer.Option(None, "--tail", "-n", help="Only the last N lines of each file."),
) -> None:
    """Print the job's output files."""
    try:
        files = job_log_files(_backend(job_id, scheduler), job_id)
    except HpcdlError as exc:
        raise _fail("logs", exc) from None
    for path in files:
        if len(files) > 1:
            typer.echo(f"==> {path} <==")
        typer.echo(tail(path, lines), nl=False)


def _watched(
    job_ids: list[str], study: Optional[Path], since: float, scheduler: str
) -> list[watch.WatchedJob]:
    if study is not None:
        if job_ids:
            raise typer.BadParameter("give JOB ids or --study, not both")
        return [job.watched for job in load_jobs(study)]
    if job_ids:
        return [watch.WatchedJob(job_id, scheduler_of(job_id, scheduler)) for job_id in job_ids]
    found = watch.recent_jobs(since)
    if not found:
        raise HpcdlError(
            f"hpcdl submitted no jobs from this account in the last {since:g} hours; name the JOB ids, "
            "or pass --since HOURS or --study DIR"
        )
    return found


def _table(statuses: list[watch.JobStatus], started: float) -> Table:
    finished = sum(1 for s in statuses if s.finished)
    table = Table(
        title=f"{finished}/{len(statuses)} job(s) finished, watching for {time.monotonic() - started:.0f} s"
    )
    for column in ("job", "name", "state", "scheduler's state"):
        table.add_column(column)
    for status in statuses:
        if status.error:
            table.add_row(status.job.job_id, status.job.name, status.summary(), status.error)
        for state in status.states:
            table.add_row(state.job_id, status.job.name, state.state, state.native)
    return table


def _changes(statuses: list[watch.JobStatus], seen: dict[str, str]) -> list[str]:
    """Lines for the states that changed since the last poll (what a log gets instead of a live table)."""
    lines = []
    stamp = time.strftime("%H:%M:%S")
    for status in statuses:
        rows = [(s.job_id, s.state, s.native) for s in status.states] or [
            (status.job.job_id, status.summary(), status.error)
        ]
        for job_id, state, native in rows:
            if seen.get(job_id) != state:
                seen[job_id] = state
                name = f" {status.job.name}" if status.job.name else ""
                lines.append(f"{stamp} {job_id}{name} {state} ({native})")
    return lines


@jobs_app.command("watch")
def watch_command(
    job_ids: Optional[list[str]] = typer.Argument(None, metavar="[JOB...]"),
    study: Optional[Path] = typer.Option(
        None, "--study", help="Watch the jobs of a scaling study directory."
    ),
    since: float = typer.Option(
        24.0, "--since", help="Without JOB or --study: the jobs hpcdl submitted in the last HOURS."
    ),
    scheduler: str = typer.Option("auto", "--scheduler", "-s", help=_SCHEDULER_HELP),
    interval: float = typer.Option(watch.DEFAULT_INTERVAL_S, "--interval", help="Seconds between polls."),
    timeout: float = typer.Option(
        watch.DEFAULT_TIMEOUT_S, "--timeout", help="Give up after this many seconds."
    ),
    no_progress: bool = typer.Option(
        False,
        "--no-progress",
        help="Print state changes as lines instead of a live table (the default when standard error is not "
        "a terminal).",
    ),
) -> None:
    """A live table of job states until every job has ended (exit 1 unless every one completed)."""
    started = time.monotonic()
    try:
        jobs = _watched(job_ids or [], study, since, scheduler)
        if progress.enabled(no_progress):
            with Live(_table([], started), console=Console(stderr=True), auto_refresh=False) as live:
                statuses = watch.wait(
                    jobs, timeout, interval, lambda s: live.update(_table(s, started), refresh=True)
                )
        else:
            seen: dict[str, str] = {}
            statuses = watch.wait(
                jobs, timeout, interval, lambda s: [typer.echo(line) for line in _changes(s, seen)]
            )
    except HpcdlError as exc:
        raise _fail("watch", exc) from None
    unconfirmed = [s for s in statuses if not s.succeeded]
    counts: dict[str, int] = {}
    for status in statuses:
        for state in status.states or [None]:
            key = state.state if state else "UNKNOWN (forgotten by the scheduler)"
            counts[key] = counts.get(key, 0) + 1
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    typer.echo(f"hpcdl jobs watch: all {len(statuses)} job(s) ended: {summary}", err=True)
    if unconfirmed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``hpcdl jobs`` to the root app."""
    app.add_typer(jobs_app, name="jobs")
