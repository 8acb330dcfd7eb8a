"""The byte-offset view the TCP ring algorithms take of a buffer laid over several areas of memory (an engine
batch's tensors; collectives/src/algorithms/areas.h): pieces split where areas end, windows, pairs of buffers
whose areas end in different places."""

from __future__ import annotations

from pathlib import Path

from native_programs import assert_checks_pass, build_program


def test_areas_split_ranges_where_their_areas_end(tmp_path: Path) -> None:
    assert_checks_pass(build_program("areas_test.cpp", [], tmp_path / "areas_test"), 11)
