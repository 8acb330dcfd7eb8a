"""How a TCP wait chooses between polling its sockets and sleeping (collectives/src/transport/wait.h,
SocketSpin): fed synthetic outcomes, polls that pay go on, polls that do not back off."""

from __future__ import annotations

import subprocess
from pathlib import Path

from native_programs import build_program


def test_polling_goes_on_while_it_pays_and_backs_off_when_not(tmp_path: Path) -> None:
    program = build_program("socket_spin_test.cpp", [], tmp_path / "socket_spin_test")
    done = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert len(lines) == 6, done.stdout + done.stderr
    assert [line for line in lines if not line.startswith("ok ")] == []
    assert done.returncode == 0
