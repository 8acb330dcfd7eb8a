"""The `hpcdl` command's root: help, version, `python -m hpcdl`, and check-build's matrix."""

from __future__ import annotations

import json
import subprocess
import sys

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


def test_check_build_verbose_explains_every_missing_item() -> None:
    result = runner.invoke(app, ["check-build", "--verbose"])
    assert result.exit_code == 0
    for line in result.output.splitlines():
        if line.startswith("    [ ]"):
            name, _, reason = line[8:].partition(": ")
            assert reason, f"no reason given for missing {name!r}"
