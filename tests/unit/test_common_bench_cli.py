"""``hpcdl bench``: lists the benchmarks, refuses unknown names, and every benchmark takes --no-progress."""

from __future__ import annotations

import importlib

import pytest
from typer.testing import CliRunner

from hpcdl.cli.bench import available
from hpcdl.cli.main import app


def test_bench_lists_benchmarks_with_descriptions() -> None:
    names = available()
    assert "allreduce" in names and "gloo" in names["allreduce"]
    result = CliRunner().invoke(app, ["bench"])
    assert result.exit_code == 0 and "allreduce" in result.output


def test_unknown_benchmark_is_refused_with_the_list() -> None:
    result = CliRunner().invoke(app, ["bench", "nope"])
    assert result.exit_code == 2
    assert "no benchmark named 'nope'" in result.output and "allreduce" in result.output


def test_every_benchmark_takes_no_progress_as_the_help_promises(capsys) -> None:
    """``hpcdl bench``'s help says NAME --no-progress turns the bar off: every benchmark accepts it."""
    for name in available():
        module = importlib.import_module(f"hpcdl.benchmarks.{name}")
        with pytest.raises(SystemExit) as done:
            module.main(["--help"])
        assert done.value.code == 0, name
        assert "--no-progress" in capsys.readouterr().out, name
