"""The shared-memory staging stores (collectives/src/transport/staging_stores.*): the auto choice between
cached and streaming stores, fed synthetic chunk timings, and the two copies (streaming, and whole lines)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from native_programs import build_program


def test_auto_choice_and_copies(tmp_path: Path) -> None:
    program = build_program(
        "staging_stores_test.cpp", ["transport/staging_stores.cpp"], tmp_path / "staging_stores_test"
    )
    done = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert len(lines) == 16, done.stdout + done.stderr
    assert [line for line in lines if not line.startswith("ok ")] == []
    assert done.returncode == 0
