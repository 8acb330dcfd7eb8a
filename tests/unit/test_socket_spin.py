"""How a TCP wait chooses between polling its sockets and sleeping (collectives/src/transport/wait.h,
SocketSpin): fed synthetic outcomes, polls that pay go on, polls that do not back off."""

from __future__ import annotations

from pathlib import Path

from native_programs import assert_checks_pass, build_program


def test_polling_goes_on_while_it_pays_and_backs_off_when_not(tmp_path: Path) -> None:
    assert_checks_pass(build_program("socket_spin_test.cpp", [], tmp_path / "socket_spin_test"), 6)
