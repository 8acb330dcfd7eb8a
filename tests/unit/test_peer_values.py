"""Values a rank receives from other ranks are checked before use (collectives/tests/peer_values_test.cpp):
engine submissions that would make a rank read past a splits list, overflow a size or index outside the
job are refused with the reason, and session frames that were altered, replayed, reflected or announce a
huge length are refused before anything in them is read."""

from __future__ import annotations

from pathlib import Path

from native_programs import assert_checks_pass, build_program


def test_peer_values_are_checked_before_use(tmp_path: Path) -> None:
    sources = ["engine/request.cpp", "net/session.cpp", "net/socket.cpp", "crypto/sha256.cpp"]
    program = build_program("peer_values_test.cpp", sources, tmp_path / "peer_values_test")
    assert_checks_pass(program, 28)
