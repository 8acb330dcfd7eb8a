"""``examples/preemptible_train.py`` as README shows it: two ranks under ``hpcdl run``; a USR2 to one rank
stops both with the state saved (exit status 75), and the same command again resumes and finishes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from runner_helpers import clean_env

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "preemptible_train.py"


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        found += children
        frontier += children
    return found


def _rank_pids(launcher: int) -> list[int]:
    pids = []
    for pid in _descendants(launcher):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            command
            and Path(command[0].decode()).name.startswith("python")
            and str(EXAMPLE).encode() in command
        ):
            pids.append(pid)
    return pids


@pytest.mark.slow
def test_the_example_stops_on_a_signal_to_one_rank_and_resumes(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "hpcdl", "run", "-np", "2", sys.executable, str(EXAMPLE)]
    command += ["--checkpoint", str(tmp_path / "ckpt"), "--epochs", "3", "--step-seconds", "0.05"]
    first = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env()
    )
    assert first.stdout is not None
    lines = []
    for line in first.stdout:
        lines.append(line)
        if "epoch 1/3" in line:
            pids = _rank_pids(first.pid)
            assert len(pids) == 2, pids
            os.kill(max(pids), signal.SIGUSR2)
            break
    lines += first.stdout.readlines()
    assert first.wait(timeout=120) == 75, "".join(lines)
    saved = re.search(r"step (\d+) saved to .*\(SIGUSR2; 2 ranks", "".join(lines))
    assert saved and int(saved.group(1)) > 33, "".join(lines)

    again = subprocess.run(command, capture_output=True, text=True, timeout=300, env=clean_env())
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"resuming from step {saved.group(1)}" in again.stdout + again.stderr
    assert "done: 3 epochs, 99 steps" in again.stdout
