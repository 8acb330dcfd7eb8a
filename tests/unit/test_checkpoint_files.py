"""The atomic writer and the checkpoint directory (``hpcdl.checkpoint.files``, ``.store``): a file or a
checkpoint is complete or absent, the previous checkpoint stays until the next is complete, and damage
or a stranger's file is refused before anything is unpickled."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hpcdl.checkpoint import CheckpointError
from hpcdl.checkpoint.files import FileRecord, read_verified, write_atomic, write_text_atomic
from hpcdl.checkpoint.report import job_progress
from hpcdl.checkpoint.store import HISTORY, MANIFEST, CheckpointStore, Manifest


def _manifest(step: int, files: list[FileRecord], world_size: int = 1) -> Manifest:
    return Manifest(step=step, reason="test", world_size=world_size, job="7", layout={}, files=files,
                    sharded=False)  # fmt: skip


def _checkpoint(store: CheckpointStore, step: int, text: str, keep: int = 1) -> Path:
    partial = store.begin(step)
    record = write_text_atomic(partial, "state.pkl", text)
    return store.finish(partial, _manifest(step, [record]), keep)


def test_a_written_file_is_whole_private_and_recorded(tmp_path: Path) -> None:
    record = write_atomic(
        tmp_path, "a.bin", lambda out: [out.write(b"x" * 1000), out.write(memoryview(b"yz"))]
    )
    path = tmp_path / "a.bin"
    assert path.read_bytes() == b"x" * 1000 + b"yz"
    assert (record.size, record.name) == (1002, "a.bin")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_verified(tmp_path, record) == path.read_bytes()
    assert os.listdir(tmp_path) == ["a.bin"]  # no temporary file left


def test_a_write_that_fails_midway_leaves_the_previous_file_and_no_temporary(tmp_path: Path) -> None:
    write_text_atomic(tmp_path, "a.txt", "old")

    def half(out: object) -> None:
        out.write(b"new, half of it")  # type: ignore[attr-defined]
        raise KeyboardInterrupt  # as a signal's exception would, in the middle of the write

    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path, "a.txt", half)
    assert (tmp_path / "a.txt").read_text() == "old"
    assert os.listdir(tmp_path) == ["a.txt"]


def test_damage_and_a_strangers_file_are_refused_before_unpickling(tmp_path: Path) -> None:
    record = write_text_atomic(tmp_path, "s.pkl", "0123456789")
    path = tmp_path / "s.pkl"
    path.write_text("0123456780")  # same size, another byte
    with pytest.raises(CheckpointError, match="damaged"):
        read_verified(tmp_path, record)
    path.write_text("01234")
    with pytest.raises(CheckpointError, match="damaged"):
        read_verified(tmp_path, record)
    path.write_text("0123456789")
    assert read_verified(tmp_path, record) == b"0123456789"
    if os.geteuid() == 0:
        os.chown(path, 4321, -1)
        with pytest.raises(CheckpointError, match="belongs to user id 4321"):
            read_verified(tmp_path, record)
    with pytest.raises(CheckpointError, match="cannot read"):
        read_verified(tmp_path, FileRecord("missing.pkl", 1, "0" * 64))


def test_the_newest_complete_checkpoint_is_found_and_older_ones_go_only_after_it(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck")
    assert store.latest() == (None, [])
    first = _checkpoint(store, 10, "ten")
    assert first.name == "ckpt-000001-step-10"
    # The next one is being written: until it is renamed into place the first is the one to resume from.
    partial = store.begin(20)
    write_text_atomic(partial, "state.pkl", "twenty")
    found, _ = store.latest()
    assert found is not None and found.directory == first and found.manifest.step == 10
    second = store.finish(partial, _manifest(20, [FileRecord("state.pkl", 6, "x")]), keep=1)
    found, _ = store.latest()
    assert found is not None and (found.directory, found.manifest.step) == (second, 20)
    assert sorted(p.name for p in store.root.iterdir()) == ["ckpt-000002-step-20"]
    third = _checkpoint(store, 30, "thirty", keep=2)
    assert [d.name for _, d in store.complete()] == [second.name, third.name]


def test_a_checkpoint_a_dead_writer_left_is_ignored_then_removed(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    good = _checkpoint(store, 5, "five")
    partial = store.begin(9)
    (partial / ".state.pkl.abc.tmp").write_bytes(b"half")  # the writer was killed here
    found, _ = store.latest()
    assert found is not None and found.directory == good
    assert store.remove_leftovers() == [partial.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name]
    assert store.begin(9).name == ".ckpt-000002-step-9.partial"


def test_a_damaged_newest_checkpoint_is_passed_over_for_the_one_before(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    older = _checkpoint(store, 1, "one", keep=3)
    newer = _checkpoint(store, 2, "two", keep=3)
    (newer / "state.pkl").write_text("truncated, longer")
    found, skipped = store.latest()
    assert found is not None and found.directory == older
    assert "has 17 bytes, its manifest says 3" in skipped[0]
    (newer / MANIFEST).write_text("{not json")
    assert "not an hpcdl checkpoint manifest" in store.latest()[1][0]
    (older / MANIFEST).unlink()
    assert store.latest()[0] is None


def test_a_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(CheckpointError, match="not a directory"):
        CheckpointStore(tmp_path / "f").latest()


def test_history_keeps_whole_lines_only(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.append_history({"event": "start", "job": "1"})
    store.append_history({"event": "checkpoint", "job": "1", "step": 4})
    with open(tmp_path / HISTORY, "a") as out:
        out.write('{"event": "start", "jo')  # a crash cut this line short
    events = store.history()
    assert [e["event"] for e in events] == ["start", "checkpoint"]
    assert events[1]["step"] == 4 and isinstance(events[0]["time"], float)
    assert json.loads((tmp_path / HISTORY).read_text().splitlines()[0])["job"] == "1"


def test_a_jobs_restarts_and_resumed_steps_are_read_from_the_history(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for event in (
        {"event": "start", "job": "41", "resumed_step": None},  # another job's runs do not count
        {"event": "start", "job": "42", "resumed_step": None},
        {"event": "checkpoint", "job": "42", "step": 17, "reason": "SIGUSR2"},
        {"event": "requeue", "job": "42", "ok": True},
        {"event": "start", "job": "42", "resumed_step": 17},
        {"event": "checkpoint", "job": "42", "step": 99, "reason": "finished"},
    ):
        store.append_history(event)
    progress = job_progress(tmp_path, "42")
    assert (progress.restarts, progress.resumed, progress.requeues) == (1, [None, 17], 1)
    assert progress.describe() == (
        "1 restart (run 1 from the start, run 2 from step 17); last checkpoint: step 99 (finished)"
    )
    assert "has not started training yet" in job_progress(tmp_path, "43").describe()


def test_history_is_never_written_through_a_link_or_into_a_strangers_file(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / HISTORY).symlink_to(victim)
    with pytest.raises(CheckpointError, match=r"cannot write .*history\.jsonl"):
        CheckpointStore(tmp_path / "ck").append_history({"event": "start"})
    assert victim.read_text() == "keep me\n"
    if os.geteuid() == 0:
        (tmp_path / "ck" / HISTORY).unlink()
        (tmp_path / "ck" / HISTORY).write_text("")
        os.chown(tmp_path / "ck" / HISTORY, 4321, -1)
        with pytest.raises(CheckpointError, match="belongs to user id 4321"):
            CheckpointStore(tmp_path / "ck").append_history({"event": "start"})
