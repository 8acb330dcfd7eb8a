"""``hpcdl timeline``: placeholder until its issue lands (registered by hpcdl.cli.main)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this group's commands to the root app."""
