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


@pytest.mark.parametrize("argv", [["--sizes", "4,abc"], ["--sizes", "1.5M"], ["--max-bytes", "1X"]])
def test_allreduce_sizes_that_are_not_sizes_say_what_is_allowed(argv: list[str], capsys) -> None:
    module = importlib.import_module("hpcdl.benchmarks.allreduce")
    with pytest.raises(SystemExit) as done:
        module.main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and "Traceback" not in err
    assert "is not a size; write a number of bytes or one with a unit K, M, G or T" in err


def test_allreduce_sizes_take_units_as_max_bytes_does() -> None:
    module = importlib.import_module("hpcdl.benchmarks.allreduce")
    assert module._sizes("4,64KiB,1M") == [4, 64 << 10, 1 << 20]
    assert module._size("1G") == 1 << 30


@pytest.mark.parametrize("name", ["allreduce", "fusion"])
def test_a_hosts_list_hpcdl_run_would_refuse_is_a_usage_error_naming_the_entry(name: str, capsys) -> None:
    module = importlib.import_module(f"hpcdl.benchmarks.{name}")
    with pytest.raises(SystemExit) as done:
        module.main(["--hosts", "host1:2,host2:x"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "Traceback" not in err
    assert "-H entry 'host2:x'" in err and "not a whole number" in err
