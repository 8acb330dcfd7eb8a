"""The job's debug directory (HPCDL_DEBUG_DIR, else ./hpcdl-debug/<job id>), its private files, and a rank's
last words kept there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl.common import debug_dir, last_words
from hpcdl.common.exceptions import HpcdlShutdownError
from hpcdl.common.output_file import OutputFileError


def test_the_directory_comes_from_the_environment_or_the_job_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert debug_dir.debug_dir({"HPCDL_DEBUG_DIR": "rel/dir"}) == tmp_path / "rel" / "dir"
    assert (
        debug_dir.debug_dir({"SLURM_JOB_ID": "77", "PMIX_NAMESPACE": "9"}) == tmp_path / "hpcdl-debug" / "77"
    )
    assert (
        debug_dir.debug_dir({"PMIX_NAMESPACE": "prterun-vm-1@1"})
        == tmp_path / "hpcdl-debug" / "prterun-vm-1_1"
    )
    meeting = {"MASTER_ADDR": "node1", "MASTER_PORT": "29500"}
    assert debug_dir.debug_dir(meeting) == tmp_path / "hpcdl-debug" / "node1-29500"
    assert debug_dir.debug_dir({}) == tmp_path / "hpcdl-debug" / f"parent{os.getppid()}"
    assert debug_dir.launcher_dir({}).name.startswith("run-")  # hpcdl run outside any scheduler's job
    assert debug_dir.launcher_dir({"LSB_JOBID": "5"}) == tmp_path / "hpcdl-debug" / "5"
    assert not (tmp_path / "hpcdl-debug").exists()  # nothing is made until a file is written


def test_files_are_private_and_never_written_through_a_link(tmp_path: Path) -> None:
    directory = tmp_path / "debug" / "job"
    target = tmp_path / "someone-elses-file"
    target.write_text("theirs")
    directory.mkdir(parents=True, mode=0o700)
    (directory / "flight.rank0.json").symlink_to(target)
    debug_dir.write_private(directory / "flight.rank0.json", b"mine")
    assert target.read_text() == "theirs"  # the link was replaced, not followed
    written = directory / "flight.rank0.json"
    assert not written.is_symlink() and written.read_text() == "mine"
    assert written.stat().st_mode & 0o777 == 0o600
    debug_dir.write_private(tmp_path / "fresh" / "x.json", b"{}")
    assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to another user needs root")
def test_another_users_directory_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(OutputFileError, match="it belongs to user nobody"):
        debug_dir.write_private(theirs / "exit.rank0.json", b"{}")


def _raise(exc: BaseException) -> None:
    """Run the installed excepthook on `exc` as the interpreter would for an uncaught exception (and put
    back the stop signals' handlers, which the hook leaves ignored in a process that is about to exit)."""
    kept = {signum: signal.getsignal(signum) for signum in last_words.STOP_SIGNALS}
    try:
        raise exc
    except BaseException as caught:
        sys.excepthook(type(caught), caught, caught.__traceback__)
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)


def test_last_words_are_kept_and_a_consequence_points_at_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(last_words, "_installed", {})
    last_words.install(1, tmp_path)
    _raise(ValueError("boom on rank 1"))
    words = last_words.read(tmp_path, 1)
    assert words is not None and words["error"] == "ValueError: boom on rank 1" and not words["consequence"]
    assert (tmp_path / "exit.rank1.json").stat().st_mode & 0o777 == 0o600
    assert "ValueError: boom on rank 1" in capsys.readouterr().err  # the traceback is still printed
    last_words.install(0, tmp_path)
    _raise(HpcdlShutdownError("rank 1 has shut down (called shutdown() or exited): ..."))
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(
        "hpcdl: rank 0's error above is a consequence of rank 1's end, not its cause. Rank 1 failed first, "
        f"on host {words['host']}: ValueError: boom on rank 1 (File "
    )
    assert sorted(last_words.read_all(tmp_path)) == [0, 1]
    assert json.loads((tmp_path / "exit.rank0.json").read_text())["blamed"] == [1]
    last_words.install(2, tmp_path)
    _raise(HpcdlShutdownError("rank 3 has shut down (called shutdown() or exited): ..."))
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith(
        "Rank 3 left no Python error (it exited, was killed, or its last words are on its host in "
        f"{tmp_path})."
    )


def test_a_rank_cancelled_by_a_stall_shutdown_points_at_the_rank_that_did_not_take_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(last_words, "_installed", {})
    last_words.install(0, tmp_path)
    stall = "stall shutdown: allreduce 'grad.0' was submitted by ranks 0, 2 but rank 1 has not submitted it"
    _raise(HpcdlShutdownError(stall))
    assert capsys.readouterr().err.splitlines()[-1] == (
        "hpcdl: rank 0's error above is a consequence of rank 1 not taking part in the operation (stuck, or "
        "on another code path), not its cause."
    )


STOPPED_WHILE_SPEAKING = """
import atexit, os, signal, sys, time
from pathlib import Path
from hpcdl.common import last_words
from hpcdl.common.exceptions import HpcdlShutdownError

def printing_traceback_when_the_launcher_stops_the_job(kind, value, tb):
    os.kill(os.getpid(), signal.SIGTERM)  # srun --kill-on-bad-exit: the culprit has just exited
    sys.__excepthook__(kind, value, tb)

def exit_handler():
    os.kill(os.getpid(), signal.SIGHUP)  # and again while the runtime shuts down
    time.sleep(0.2)
    print("the exit handlers ran", file=sys.stderr, flush=True)

atexit.register(exit_handler)
sys.excepthook = printing_traceback_when_the_launcher_stops_the_job
last_words.install(0, Path(sys.argv[1]))
raise HpcdlShutdownError("rank 1 has shut down (called shutdown() or exited): ...")
"""


def test_a_launchers_stop_lets_the_rank_say_whose_end_caused_its_own_and_exit(tmp_path: Path) -> None:
    """Stop signals that come while a consequence's traceback is printed, or while it exits, are ignored:
    the line naming the cause is printed, and the rank ends by its own exit status (srun stops forwarding
    the job's output once a task has ended by a signal)."""
    culprit = {"rank": 1, "host": "node2", "error": "ValueError: x"}
    (tmp_path / "exit.rank1.json").write_text(json.dumps(culprit))
    command = [sys.executable, "-c", STOPPED_WHILE_SPEAKING, str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    error = "hpcdl.common.exceptions.HpcdlShutdownError: rank 1 has shut down"
    assert lines[-3].startswith(error), done.stderr
    assert lines[-2] == (
        "hpcdl: rank 0's error above is a consequence of rank 1's end, not its cause. Rank 1 failed first, "
        "on host node2: ValueError: x."
    )
    assert lines[-1] == "the exit handlers ran"
