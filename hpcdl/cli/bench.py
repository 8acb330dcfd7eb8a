"""``hpcdl bench NAME [ARGS...]``: run the benchmark module ``hpcdl.benchmarks.NAME`` with ARGS."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from typing import Optional

import typer


def available() -> dict[str, str]:
    """Benchmark names and their one-line descriptions (the first line of each module's docstring)."""
    try:
        package = importlib.import_module("hpcdl.benchmarks")
    except ImportError:  # a source checkout without the editable mapping: use the top-level folder
        package = importlib.import_module("benchmarks")
    found = {}
    for module in pkgutil.iter_modules(package.__path__):
        if module.name.startswith("_"):
            continue
        spec = importlib.util.find_spec(f"{package.__name__}.{module.name}")
        doc = ""
        if spec and spec.origin:
            with open(spec.origin, encoding="utf-8") as source:
                text = source.read()
            start = text.find('"""')
            if start >= 0:
                doc = text[start + 3 :].split("\n", 1)[0].strip().rstrip(".")
        found[module.name] = doc
    return dict(sorted(found.items()))


def _help() -> str:
    """Command help listing the benchmarks (one paragraph each, so the help renderer keeps them apart)."""
    lines = [
        "Run a benchmark: hpcdl bench NAME [ARGS...] (ARGS go to the benchmark; try NAME --help).",
        "On a terminal a progress bar shows how far the ranks are (NAME --no-progress: none).",
    ]
    lines += [f"{name}: {doc}" for name, doc in available().items()]
    return "\n\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add ``hpcdl bench`` to the root app."""

    @app.command(
        "bench",
        help=_help(),
        context_settings={
            "allow_extra_args": True,
            "ignore_unknown_options": True,
            "allow_interspersed_args": False,
        },
    )
    def bench(
        ctx: typer.Context,
        name: Optional[str] = typer.Argument(None, help="Benchmark to run (see the list above)."),
    ) -> None:
        names = available()
        if not name:
            typer.echo(_help())
            raise typer.Exit(0)
        if name not in names:
            typer.echo(f"no benchmark named {name!r}; available: {', '.join(names)}", err=True)
            raise typer.Exit(2)
        try:
            module = importlib.import_module(f"hpcdl.benchmarks.{name}")
        except ImportError:
            module = importlib.import_module(f"benchmarks.{name}")
        module.main(list(ctx.args))
