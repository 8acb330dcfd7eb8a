"""``hpcdl debug``: what a job is doing or did. ``stacks`` shows every rank's Python stacks now;
``analyze`` tells from the ranks' flight-recorder dumps (and their last words) what happened."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hpcdl.common import last_words
from hpcdl.diagnosis import analyze, flight
from hpcdl.runner import stack_dumps
from hpcdl.runner.errors import LaunchError

debug_app = typer.Typer(help="See what a job is doing, or what went wrong in it.", no_args_is_help=True)


@debug_app.command(
    "stacks",
    help="Print every rank's Python stack (all threads, innermost frame first), also of a rank that holds "
    "the GIL in C code; asks the job's 'hpcdl run', through SIGQUIT (which you may send it yourself).",
)
def stacks_command(
    job: Optional[str] = typer.Argument(
        None,
        help="The job: its debug directory (HPCDL_DEBUG_DIR), or its id under ./hpcdl-debug. Default: the "
        "one job started from here that runs on this host.",
        show_default=False,
    ),
) -> None:
    try:
        text = stack_dumps.request(stack_dumps.find_job(job))
    except LaunchError as exc:
        typer.echo(f"hpcdl debug stacks: error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(text, nl=False)


@debug_app.command("analyze")
def analyze_command(
    directory: Path = typer.Argument(
        ...,
        help="The job's debug directory (HPCDL_DEBUG_DIR; by default ./hpcdl-debug/<job id>).",
        show_default=False,
    ),
) -> None:
    """Say in words what happened in a job, from the flight-recorder dumps its ranks wrote there."""
    if not directory.is_dir():
        typer.echo(f"hpcdl debug analyze: error: {directory} is not a directory", err=True)
        raise typer.Exit(2)
    dumps, words = flight.load(directory), last_words.read_all(directory)
    if not dumps.by_rank and not dumps.unreadable and not words:
        typer.echo(
            f"hpcdl debug analyze: error: {directory} holds no flight.rank<R>.json nor exit.rank<R>.json; "
            "ranks write them there on a stall, a timeout, a mismatch or an error (give the job's "
            "HPCDL_DEBUG_DIR, by default ./hpcdl-debug/<job id>)",
            err=True,
        )
        raise typer.Exit(2)
    typer.echo(analyze.render(analyze.analyze(dumps, words)), nl=False)


def register(app: typer.Typer) -> None:
    app.add_typer(debug_app, name="debug")
