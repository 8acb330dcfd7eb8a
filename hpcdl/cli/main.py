"""Entry point of the ``hpcdl`` command (also ``python -m hpcdl``)."""

from __future__ import annotations

import importlib
from typing import Optional

import typer

from hpcdl._version import __version__

# Each module registers its commands on the root app through ``register(app)``.
COMMAND_MODULES = (
    "check_build", "run", "submit", "jobs", "stack", "module", "bench", "timeline", "scaling", "debug",
)  # fmt: skip

app = typer.Typer(
    name="hpcdl",
    help="Distributed deep learning on HPC clusters: launch ranks, submit batch jobs, check and build "
    "software stacks.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"hpcdl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(
        None, "--version", "-V", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """hpcdl: distributed deep learning on HPC clusters."""


for _name in COMMAND_MODULES:
    importlib.import_module(f"hpcdl.cli.{_name}").register(app)


def main() -> None:
    app()
