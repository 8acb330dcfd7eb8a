"""The shared-memory staging stores (collectives/src/transport/staging_stores.*): the auto choice between
cached and streaming stores, fed synthetic chunk timings, and the two copies (streaming, and whole lines).

The C++ check program is compiled here with the compiler that built the runtime (build-essential)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    ROOT / "collectives" / "tests" / "staging_stores_test.cpp",
    ROOT / "collectives" / "src" / "transport" / "staging_stores.cpp",
]


def test_auto_choice_and_copies(tmp_path: Path) -> None:
    compiler = shutil.which("c++") or shutil.which("g++")
    assert compiler, "no C++ compiler: run scripts/setup.sh (build-essential)"
    program = tmp_path / "staging_stores_test"
    include = f"-I{ROOT / 'collectives' / 'src'}"
    flags = ["-std=c++17", "-O2", "-Wall", "-Werror", include]
    subprocess.run([compiler, *flags, *map(str, SOURCES), "-o", str(program)], check=True)
    done = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert len(lines) == 16, done.stdout + done.stderr
    assert [line for line in lines if not line.startswith("ok ")] == []
    assert done.returncode == 0
