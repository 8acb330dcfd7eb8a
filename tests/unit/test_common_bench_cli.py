"""``hpcdl bench``: lists the benchmarks and refuses unknown names."""

from __future__ import annotations

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
