"""``hpcdl module write``: modulefiles for an installed stack, or hpcdl's own modulefile for an install."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hpcdl.common.exceptions import HpcdlError
from hpcdl.modules.own import current_installation, find_installation, write_own
from hpcdl.modules.render import FORMATS
from hpcdl.modules.stack_modules import parse_compiler, write_stack_modules
from hpcdl.stack.lockfile import load_lock
from hpcdl.stack.recipe import load_recipes

module_app = typer.Typer(
    help="Lmod (Lua) and Environment Modules (Tcl) modulefiles.", no_args_is_help=True, rich_markup_mode=None
)


def _formats(value: str) -> tuple[str, ...]:
    if value == "both":
        return FORMATS
    if value not in FORMATS:
        raise HpcdlError(f"--format {value}: choose lua, tcl or both")
    return (value,)


@module_app.command("write")
def write_command(
    lockfile: Optional[Path] = typer.Argument(
        None, help="Lockfile of a stack built with `hpcdl stack build`; leave out for hpcdl's own modulefile."
    ),
    prefix: Optional[Path] = typer.Option(
        None, "--prefix", help="Stack install prefix; for hpcdl's own module, its venv or --prefix tree."
    ),
    root: Optional[Path] = typer.Option(
        None, "--root", help="Modulefile tree (default: PREFIX/modulefiles)."
    ),
    output_format: str = typer.Option("both", "--format", "-f", help="lua | tcl | both"),
    force: bool = typer.Option(False, "--force", help="Overwrite modulefiles that differ."),
    compiler: Optional[str] = typer.Option(None, "--compiler", help="Compiler module name, e.g. gcc/12."),
    depends_on: list[str] = typer.Option([], "--depends-on", help="Module hpcdl's own module loads first."),
    recipes_dirs: list[Path] = typer.Option([], "--recipes", help="Extra recipe directory (repeatable)."),
) -> None:
    """Write modulefiles (never over a different existing file without --force).

    Examples: hpcdl module write stack.lock --prefix /opt/stack;
    hpcdl module write --prefix /opt/hpcdl/0.1.0 --root /opt/modulefiles --depends-on openmpi/4.1.4
    """
    try:
        formats = _formats(output_format)
        if lockfile is not None:
            if prefix is None:
                raise HpcdlError(
                    "a stack's modulefiles need --prefix (the directory given to hpcdl stack build)"
                )
            target = root or prefix / "modulefiles"
            cc = parse_compiler(compiler) if compiler else None
            written = write_stack_modules(
                load_lock(lockfile), load_recipes(recipes_dirs), prefix, target, formats, force, cc
            )
            hint = f"module use {target.resolve() / 'lmod' / 'Core'}"
        else:
            installation = find_installation(prefix) if prefix else current_installation()
            target = root or installation.prefix / "modulefiles"
            written = write_own(target, installation, depends_on, formats, force)
            hint = f"module use {target.resolve()}; module load hpcdl"
    except HpcdlError as exc:
        typer.echo(f"hpcdl module write: error: {exc}", err=True)
        raise typer.Exit(2) from None
    for item in written:
        typer.echo(f"{'wrote' if item.changed else 'unchanged'} {item.path}")
    typer.echo(f"use them with: {hint}")


def register(app: typer.Typer) -> None:
    """Add this group's commands to the root app."""
    app.add_typer(module_app, name="module")
