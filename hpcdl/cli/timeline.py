"""``hpcdl timeline``: read the engine's Chrome-trace timeline (HPCDL_TIMELINE)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

from hpcdl.common.timeline import TimelineError, render, summarize_file

timeline_app = typer.Typer(help="Inspect engine timelines (Chrome trace JSON written with HPCDL_TIMELINE).")


@timeline_app.command("summary")
def summary(
    file: Path = typer.Argument(..., help="Timeline written by rank 0 (HPCDL_TIMELINE=path)."),
    top: int = typer.Option(10, "--top", min=1, help="How many tensors to list."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Print where the time went: per phase, per tensor, and which ranks the others waited for."""
    try:
        result = summarize_file(file)
    except TimelineError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(result), indent=2))
    else:
        typer.echo(render(result, top=top))


def register(app: typer.Typer) -> None:
    """Add this group's commands to the root app."""
    app.add_typer(timeline_app, name="timeline")
