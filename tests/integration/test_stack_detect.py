"""`hpcdl stack detect` / `check` against the real Open MPI, MPICH, mpi4py and torch of this machine."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from stack_fixtures import hpcdl

from hpcdl.stack.detect import detect


@pytest.fixture(scope="module")
def found():
    return detect()


def tool_output(*command: str) -> str:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout


@pytest.mark.skipif(
    not shutil.which("ompi_info"), reason="Open MPI is not installed (apt install openmpi-bin)"
)
def test_detects_open_mpi_version_and_cuda_support(found) -> None:
    version = re.search(r"Open MPI v(\S+)", tool_output("ompi_info", "--version")).group(1)
    parsable = tool_output("ompi_info", "--parsable", "--all")
    built_with_cuda = "mpi_built_with_cuda_support:value:true" in parsable
    openmpi = next(m for m in found.mpis if m.name == "openmpi")
    assert openmpi.version == version
    assert openmpi.detail["cuda_aware"] is built_with_cuda


@pytest.mark.skipif(not shutil.which("mpichversion"), reason="MPICH is not installed (apt install mpich)")
def test_detects_mpich_version_and_device(found) -> None:
    text = tool_output("mpichversion")
    mpich = next(m for m in found.mpis if m.name == "mpich")
    assert mpich.version == re.search(r"MPICH Version:\s+(\S+)", text).group(1)
    assert mpich.detail["device"] == re.search(r"MPICH Device:\s+(\S+)", text).group(1)


@pytest.mark.skipif(not shutil.which("mpirun"), reason="no mpirun on PATH")
def test_default_mpirun_is_the_alternative_it_resolves_to(found) -> None:
    target = Path(shutil.which("mpirun")).resolve().name
    expected = "openmpi" if target in ("orterun", "mpirun.openmpi", "prterun") else "mpich"
    assert found.default_mpirun is not None and found.default_mpirun.name == expected


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_detects_installed_torch(found) -> None:
    assert found.torch is not None
    assert found.torch.version == importlib.metadata.version("torch")
    import torch

    assert found.torch.detail["cuda"] == torch.version.cuda


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed (hpcdl[mpi])")
def test_detects_the_mpi_mpi4py_was_built_with(found) -> None:
    assert found.mpi4py is not None
    assert found.mpi4py.version == importlib.metadata.version("mpi4py")
    implementation = next(m for m in found.mpis if m.name == found.mpi4py.detail["mpi"])
    assert found.mpi4py.detail["mpi_version"] == implementation.version


def test_detect_json_and_loaded_modules() -> None:
    env = {**os.environ, "LOADEDMODULES": "gcc/12:openmpi/4.1.4"}
    done = hpcdl("stack", "detect", "--json", env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["loaded_modules"] == ["gcc/12", "openmpi/4.1.4"]
    assert data["python"] == ".".join(map(str, sys.version_info[:3]))
    assert {"driver", "cuda_toolkits", "cudnn", "nccl", "mpis", "mpi4py", "torch", "hpcdl"} <= set(data)


@pytest.mark.skipif(not shutil.which("mpiexec.mpich"), reason="MPICH is not installed (apt install mpich)")
def test_check_reports_an_mpirun_of_another_mpi(found, tmp_path: Path) -> None:
    """mpi4py or hpcdl's runtime built with Open MPI, but `mpirun` on PATH is MPICH's: an error with a fix."""
    users = []
    if found.mpi4py and found.mpi4py.detail["mpi"] == "openmpi":
        users.append("mpi4py uses Open MPI")
    if found.hpcdl["loaded"] and "Open MPI" in found.hpcdl["mpi_detail"]:
        users.append("hpcdl's runtime uses Open MPI")
    if not users:
        pytest.skip("neither mpi4py nor hpcdl's runtime is built with Open MPI here")
    (tmp_path / "mpirun").symlink_to(shutil.which("mpiexec.mpich"))
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    done = hpcdl("stack", "check", "--json", env=env)
    assert done.returncode == 1
    report = json.loads(done.stdout)
    errors = [f for f in report["findings"] if f["severity"] == "error" and f["part"] == "mpi"]
    for user in users:
        finding = next(f for f in errors if f["message"].startswith(user))
        assert "is MPICH" in finding["message"]
        assert "mpirun.openmpi" in finding["fix"]
    plain = json.loads(hpcdl("stack", "check", "--json").stdout)
    assert not [f for f in plain["findings"] if f["severity"] == "error" and f["part"] == "mpi"]
