"""Build the wheel the way `pip install .` does and check what ships and what check-build reports.

The wheel is built from source with CMake told that no MPI headers can be found (exactly what happens on a
machine without mpi.h), so it has no MPI shim and the same build also checks the "[ ] MPI" case and its
advice; the editable install used by the rest of the suite was built with both families' headers present
and finds MPI at run time (the binary wheel of scripts/build-wheels.sh: test_wheel_install.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel_without_mpi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    src = tmp_path_factory.mktemp("src") / "hpcdl"
    # A clean copy of the tree, as on a fresh clone (no build directories).
    shutil.copytree(
        REPO, src, ignore=shutil.ignore_patterns("build", "build-*", ".git", "__pycache__", "*.so", ".*cache")
    )
    cmd = [
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out),
        "--config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_MPI=ON",
        "--config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON",
        "--config-settings=build-dir=" + str(tmp_path_factory.mktemp("cmake-build")),
        str(src),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    wheels = list(out.glob("hpcdl-*.whl"))
    assert len(wheels) == 1
    return wheels[0]


def test_wheel_ships_runtime_templates_and_modulefiles(wheel_without_mpi: Path) -> None:
    names = zipfile.ZipFile(wheel_without_mpi).namelist()
    assert "hpcdl/_collectives.so" in names
    assert not any(n.startswith("hpcdl/_mpi_") for n in names)  # no MPI headers, no MPI shim
    assert any(n.startswith("hpcdl/templates/") for n in names)
    assert any(n.startswith("hpcdl/modulefiles/hpcdl/") for n in names)
    shipped_data = (
        "hpcdl/stack/recipes/",
        "hpcdl/stack/tables/",
        "hpcdl/templates/modules/",
        "hpcdl/templates/batch/",
    )
    for data in shipped_data:
        assert any(n.startswith(data) for n in names), f"{data} missing from the wheel"
    assert any(n.startswith("hpcdl/benchmarks/") for n in names)
    assert "hpcdl/cli/main.py" in names
    assert any(n.endswith("entry_points.txt") for n in names)


def test_check_build_without_mpi_headers_says_why(wheel_without_mpi: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel_without_mpi) as wheel:
        wheel.extractall(target)
    runtime = target / "hpcdl" / "_collectives.so"
    # The editable install's import hook would shadow PYTHONPATH; HPCDL_LIBRARY selects the runtime.
    env = dict(os.environ, HPCDL_LIBRARY=str(runtime))
    proc = subprocess.run(
        [sys.executable, "-m", "hpcdl", "check-build", "--verbose"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert str(runtime) in proc.stdout  # the wheel's runtime was the one probed
    mpi_lines = [line for line in proc.stdout.splitlines() if line.startswith("    [ ] MPI")]
    assert len(mpi_lines) == 2, proc.stdout  # controller and tensor operation
    for line in mpi_lines:
        assert "no Open MPI mpi.h at build time" in line and "no MPICH mpi.h at build time" in line
        assert "install libopenmpi-dev" in line and "binary wheel" in line
    assert "    [X] TCP" in proc.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "hpcdl", "check-build", "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    controllers = {c["name"]: c for c in json.loads(as_json.stdout)["controllers"]}
    assert controllers["MPI"]["available"] is False
