"""``hpcdl check-build``: the frameworks / controllers / tensor operations matrix."""

from __future__ import annotations

import json

import typer

from hpcdl.common.build import Capability
from hpcdl.stack.check_build import Matrix, check_build


def _render(matrix: Matrix, verbose: bool) -> str:
    lines = [f"hpcdl v{matrix.version}:", ""]
    if verbose:
        lines[1:1] = [f"runtime: {matrix.library}"]
    sections: list[tuple[str, list[Capability]]] = [
        ("Available Frameworks", matrix.frameworks),
        ("Available Controllers", matrix.controllers),
        ("Available Tensor Operations", matrix.tensor_operations),
    ]
    for title, caps in sections:
        lines.append(f"{title}:")
        for cap in caps:
            mark = "X" if cap.available else " "
            line = f"    [{mark}] {cap.name}"
            if verbose:
                if cap.available and cap.detail:
                    line += f" ({cap.detail})"
                elif not cap.available and cap.reason:
                    line += f": {cap.reason}"
            lines.append(line)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def check_build_command(
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        help="Say why each missing item is missing; also import every framework with hpcdl's API for it.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the matrix as JSON."),
) -> None:
    """Show which frameworks, controllers and tensor operations this installation supports."""
    matrix = check_build(deep=verbose)
    if as_json:
        typer.echo(json.dumps(matrix.to_dict(), indent=2))
    else:
        typer.echo(_render(matrix, verbose), nl=False)


def register(app: typer.Typer) -> None:
    app.command("check-build")(check_build_command)
