"""The `hpcdl` command's root: help, version, `python -m hpcdl`, and check-build's matrix."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from typer.main import get_command
from typer.testing import CliRunner

from hpcdl._version import __version__
from hpcdl.cli.main import app
from hpcdl.common import built

runner = CliRunner()


def test_version_flag_prints_package_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"hpcdl {__version__}"


def test_help_lists_every_command_group() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("check-build", "run", "submit", "jobs", "stack", "module", "bench", "timeline"):
        assert command in result.output, command


def _commands(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, [*path, name])


def test_every_commands_help_reads_at_80_columns() -> None:
    """No line wider than 80 columns, no flag name or choice cut short, no <bool> on flags; hpcdl run keeps
    its options in titled sections."""
    for path, command in _commands(get_command(app), []):
        result = runner.invoke(app, [*path, "--help"], terminal_width=80, env={"COLUMNS": "80"})
        where = " ".join(["hpcdl", *path])
        assert result.exit_code == 0, where
        wide = [line for line in result.output.splitlines() if len(line) > 80]
        assert wide == [], f"{where} --help: {wide}"
        assert "…" not in result.output and "<bool>" not in result.output, where
        words = set(re.findall(r"--?[\w-]+", result.output))
        for param in command.params:
            for name in [*param.opts, *param.secondary_opts]:
                if name.startswith("-"):
                    assert name in words, f"{where} --help does not show {name} whole"
    run = runner.invoke(app, ["run", "--help"], terminal_width=80, env={"COLUMNS": "80"}).output
    assert "What starts the ranks: auto, local, ssh, srun, mpiexec, aprun, jsrun, blaunch, flux." in " ".join(
        run.split()
    )
    for title in ("Options:", "Elastic training", "Runtime tunables", "horovodrun flags that change nothing"):
        assert f"\n{title}" in run, title


def test_python_dash_m_is_the_same_program() -> None:
    cmd = [sys.executable, "-m", "hpcdl", "--version"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"hpcdl {__version__}"


def test_check_build_has_horovod_sections_and_marks() -> None:
    result = runner.invoke(app, ["check-build"])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == f"hpcdl v{__version__}:"
    for section in ("Available Frameworks:", "Available Controllers:", "Available Tensor Operations:"):
        assert section in lines
    marks = [line for line in lines if line.startswith("    [")]
    assert marks and all(line[5] in "X " and line[6] == "]" for line in marks)
    # Without --verbose, no reasons are printed.
    assert not any(":" in line for line in marks)


def test_check_build_reflects_the_loaded_runtime() -> None:
    runtime = built()
    assert runtime.loaded, runtime.load_error
    result = runner.invoke(app, ["check-build", "--json"])
    assert result.exit_code == 0
    matrix = json.loads(result.output)
    controllers = {c["name"]: c for c in matrix["controllers"]}
    ops = {c["name"]: c for c in matrix["tensor_operations"]}
    assert controllers["MPI"]["available"] is runtime.mpi.available
    assert ops["shared memory"]["available"] and ops["TCP"]["available"]
    frameworks = {c["name"]: c for c in matrix["frameworks"]}
    assert set(frameworks) == {"TensorFlow", "tf.keras", "PyTorch", "Keras", "JAX", "MXNet"}
