"""hpcdl.common.stacks: a rank's Python stacks written on its signal into the job's debug directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcdl.common import stacks
from hpcdl.common.output_file import OutputFileError


def a_function_of_the_user(rank: int) -> str | None:
    return stacks.request(os.getpid(), rank)


def test_a_dump_names_the_functions_on_the_stack_innermost_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCDL_DEBUG_DIR", str(tmp_path / "debug"))
    stacks.install(3)
    assert stacks.stack_path(3) == tmp_path / "debug" / "stacks.rank3.txt"
    assert stacks.read(3) is None  # nothing asked yet
    for _ in range(2):  # the file holds the latest dump only
        text = a_function_of_the_user(3)
        assert text is not None and text.count("(most recent call first)") >= 1
        frames = text.splitlines()
        mine = next(i for i, line in enumerate(frames) if "in a_function_of_the_user" in line)
        caller = next(i for i, line in enumerate(frames) if "in test_a_dump_names" in line)
        assert mine < caller  # innermost first
        assert text.lower().count(f"thread {stacks.main_thread_id()}") == 1  # one dump, the main thread in it
    mode = os.stat(stacks.stack_path(3)).st_mode & 0o777
    assert mode == 0o600 and os.stat(tmp_path / "debug").st_mode & 0o777 == 0o700


def test_the_engine_gets_the_dump_descriptor_only_where_peers_can_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HPCDL_DEBUG_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert stacks.engine_options(0, 1) == {}  # a job of one process writes nothing
    assert not (tmp_path / "hpcdl-debug").exists()
    options = stacks.engine_options(1, 2)
    assert options["stack_fd"] == stacks.descriptor() >= 0
    assert options["stack_signal"] == int(stacks.STACK_SIGNAL)
    assert Path(str(options["debug_dir"])).parent == tmp_path / "hpcdl-debug"


def test_a_linked_debug_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "debug").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv("HPCDL_DEBUG_DIR", str(tmp_path / "debug"))
    with pytest.raises(OutputFileError, match="debug directory"):
        stacks.install(0)
