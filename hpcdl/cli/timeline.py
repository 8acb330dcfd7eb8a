"""``hpcdl timeline``: read the engine's Chrome-trace timeline (HPCDL_TIMELINE)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import typer

from hpcdl.common.exceptions import HpcdlError
from hpcdl.common.timeline import TimelineError, render, summarize_file

timeline_app = typer.Typer(
    help="Inspect engine timelines (Chrome trace JSON written with HPCDL_TIMELINE).", rich_markup_mode=None
)


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


@timeline_app.command("step")
def step(
    file: Path = typer.Argument(..., help="Timeline written by rank 0 (HPCDL_TIMELINE, or a study run's)."),
    steps_dir: Optional[Path] = typer.Option(
        None, "--steps", help="StepTimer records of the same run (default: the timeline's directory)."
    ),
    index: Optional[int] = typer.Option(None, "--step", help="Which step (default: the middle traced one)."),
    gap_ms: float = typer.Option(
        1.0, "--gap-ms", help="Without step records: engine idle time that separates two steps."
    ),
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", help="Picture file, .png or .svg (default: TIMELINE-stepN.png beside it)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite a picture hpcdl did not write."),
) -> None:
    """Draw one step: per rank compute and waits, per collective its phases, on one time axis."""
    from hpcdl.scaling import steppicture
    from hpcdl.scaling.outputs import OutputDirectory
    from hpcdl.scaling.plots import PlotError

    try:
        picture = steppicture.build(file, steps_dir, index, gap_ms)
        typer.echo(steppicture.text(picture))
        target = output or file.with_name(f"{file.stem}-step{picture.step}.png")
        fmt = target.suffix.lstrip(".").lower()
        if fmt not in ("png", "svg"):
            raise TimelineError(f"-o {target}: the picture is written as .png or .svg")
        out = OutputDirectory(target.parent, force)
        out.check([target.name])
        try:
            out.write(target.name, steppicture.draw(picture, fmt))
        except PlotError as exc:
            typer.echo(f"hpcdl timeline step: {exc} (the text picture above needs nothing)", err=True)
            return
    except HpcdlError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"hpcdl timeline step: picture in {target}", err=True)


def register(app: typer.Typer) -> None:
    """Add this group's commands to the root app."""
    app.add_typer(timeline_app, name="timeline")
