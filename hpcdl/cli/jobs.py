"""``hpcdl jobs status|cancel|logs JOB``: follow a batch job through its scheduler."""

from __future__ import annotations

from typing import Optional

import typer

from hpcdl.common.exceptions import HpcdlError
from hpcdl.schedulers import Scheduler, get_scheduler
from hpcdl.schedulers.submission import job_log_files, scheduler_of, tail

jobs_app = typer.Typer(help="Follow batch jobs: status, cancel, logs.", no_args_is_help=True)

_SCHEDULER_HELP = "auto|slurm|pbs|cobalt|lsf|flux (default: the one hpcdl submitted the job to, else auto)."


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
    """Print the job's state (one line per array task)."""
    try:
        states = _backend(job_id, scheduler).status(job_id)
    except HpcdlError as exc:
        raise _fail("status", exc) from None
    for state in states:
        typer.echo(f"{state.job_id}\t{state.state}\t{state.native}")


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


def register(app: typer.Typer) -> None:
    """Add ``hpcdl jobs`` to the root app."""
    app.add_typer(jobs_app, name="jobs")
