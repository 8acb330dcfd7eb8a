"""Progress bars of long commands, seen on a real terminal (a pseudo-terminal as standard error): counts
that follow the ranks' work, nothing with --no-progress, and plain lines when standard error is a pipe."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

from runner_helpers import clean_env

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def on_terminal(*args: str, cwd: Path, timeout: float = 300) -> tuple[subprocess.CompletedProcess, str]:
    """Run ``python -m hpcdl ARGS`` with standard error on a pseudo-terminal; (result, terminal text). The
    terminal is read while the command runs, as a terminal would be (a full one would block it)."""
    master, slave = os.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed and everything was read
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "hpcdl", *args],
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env={**clean_env(), "COLUMNS": "120", "TERM": "xterm"},
        )
    finally:
        os.close(slave)
        reader.join(10)
        os.close(master)
    return done, _ESCAPES.sub("", b"".join(chunks).decode(errors="replace"))


ALLREDUCE = ["bench", "allreduce", "-np", "2", "--sizes", "4,1024,65536", "--repeats", "1", "--no-mpi"]


def test_benchmark_progress_follows_the_ranks(tmp_path: Path) -> None:
    done, terminal = on_terminal(*ALLREDUCE, cwd=tmp_path)
    assert done.returncode == 0, terminal
    assert "allreduce -np 2" in terminal
    assert "1/3" in terminal and "3/3" in terminal  # one step per message size, as rank 0 finished it
    assert "65536" not in done.stdout.split("\n")[0] and "64 KiB" in done.stdout  # the table still on stdout

    quiet, terminal = on_terminal(*ALLREDUCE, "--no-progress", cwd=tmp_path)
    assert quiet.returncode == 0 and "3/3" not in terminal and "allreduce -np 2" not in terminal


def test_scaling_study_progress_counts_runs(tmp_path: Path) -> None:
    (tmp_path / "nap.py").write_text("import time\ntime.sleep(0.1)\n")
    run = ["scaling", "run", "--strong", "-W", "1,2", "--repeats", "2", "-o", "s", "--", "nap.py"]
    done, terminal = on_terminal(*run, cwd=tmp_path)
    assert done.returncode == 0, terminal
    assert "4/4" in terminal and "W=2 repeat 2/2" in terminal
    # without a terminal: no bar, one line per finished run
    piped = subprocess.run(
        [sys.executable, "-m", "hpcdl", *run[:-4], "-o", "t", "--", "nap.py"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=clean_env(),
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    lines = [line for line in piped.stderr.splitlines() if line.startswith("W=")]
    assert [line.split(":")[0] for line in lines] == [
        "W=1 repeat 1/2", "W=2 repeat 1/2", "W=1 repeat 2/2", "W=2 repeat 2/2",
    ]  # fmt: skip
    assert "━" not in piped.stderr
