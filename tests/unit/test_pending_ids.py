"""The engine's record of pending handles (collectives/src/engine/pending_ids.h), which enqueue consults to
refuse a name whose operation is still pending, against a plain set.

The C++ check program is compiled here with the compiler that built the runtime (build-essential)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pending_ids_agree_with_a_set(tmp_path: Path) -> None:
    compiler = shutil.which("c++") or shutil.which("g++")
    assert compiler, "no C++ compiler: run scripts/setup.sh (build-essential)"
    program = tmp_path / "pending_ids_test"
    source = ROOT / "collectives" / "tests" / "pending_ids_test.cpp"
    flags = ["-std=c++17", "-O2", "-Wall", "-Werror", f"-I{ROOT / 'collectives' / 'src'}"]
    subprocess.run([compiler, *flags, str(source), "-o", str(program)], check=True)
    done = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert len(lines) == 11, done.stdout + done.stderr
    assert [line for line in lines if not line.startswith("ok ")] == []
    assert done.returncode == 0
