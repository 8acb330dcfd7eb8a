"""What a rank joining a shared-memory segment accepts (collectives/src/transport/shm_comm.*): the maker's
settings, its size, its owner and mode, its header. Each join of the check program runs in a child process,
so a segment that would make a rank fault shows as a failed check, not as a crash of the test."""

from __future__ import annotations

import subprocess
from pathlib import Path

from native_programs import SHM_SOURCES, build_program


def test_members_check_the_segment_before_they_use_it(tmp_path: Path) -> None:
    program = build_program("shm_segment_test.cpp", SHM_SOURCES, tmp_path / "shm_segment_test")
    done = subprocess.run([str(program)], capture_output=True, text=True, timeout=120, check=False)
    lines = done.stdout.splitlines()
    failed = [line for line in lines if not line.startswith(("ok ", "skip "))]
    assert failed == [], done.stdout + done.stderr
    assert sum(line.startswith("ok ") for line in lines) >= 13, done.stdout
    assert done.returncode == 0
