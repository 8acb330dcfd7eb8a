"""Builds the small C++ check programs of collectives/tests/ together with the runtime sources they test,
with the compiler that builds the runtime (build-essential), warnings as errors (but for the runtime's
helpers a partial build leaves unused, such as the AVX2 probe when only the generic kernels are linked)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "collectives" / "src"
INCLUDE = ROOT / "collectives" / "include"
COMPILE_TIMEOUT_S = 240
# The runtime sources a check program of the shared-memory transport links.
SHM_SOURCES = [
    "transport/shm_comm.cpp",
    "transport/staging_stores.cpp",
    "transport/wait.cpp",
    "net/socket.cpp",
    "crypto/sha256.cpp",
    "algorithms/op_desc.cpp",
    "kernels/reduce.cpp",
    "kernels/reduce_generic.cpp",
]


def build_program(test_source: str, runtime_sources: list[str], output: Path) -> Path:
    """Compile collectives/tests/`test_source` with collectives/src/`runtime_sources` into `output`."""
    compiler = shutil.which("c++") or shutil.which("g++")
    assert compiler, "no C++ compiler: run scripts/setup.sh (build-essential)"
    sources = [ROOT / "collectives" / "tests" / test_source, *(SOURCE / s for s in runtime_sources)]
    flags = [
        "-std=c++17",
        "-O2",
        "-Wall",
        "-Werror",
        "-Wno-unused-function",
        f"-I{SOURCE}",
        f"-I{INCLUDE}",
        "-pthread",
    ]
    done = subprocess.run(
        [compiler, *flags, *map(str, sources), "-o", str(output), "-lrt"],
        capture_output=True,
        text=True,
        timeout=COMPILE_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return output


def assert_checks_pass(program: Path, checks: int) -> None:
    """Runs a check program: it must print `checks` lines, every one an "ok ..." line, and exit 0."""
    done = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert [line for line in lines if not line.startswith("ok ")] == [], done.stdout + done.stderr
    assert len(lines) == checks, done.stdout + done.stderr
    assert done.returncode == 0, done.stderr
