"""Running ``hpcdl run`` as a user would (``python -m hpcdl run``) and checking for leftovers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

# Variables that would make hpcdl run pick up a batch allocation instead of this machine.
_ALLOCATION_VARIABLES = (
    "SLURM_JOB_NODELIST", "SLURM_NODELIST", "PBS_NODEFILE", "LSB_MCPU_HOSTS", "LSB_HOSTS",
    "COBALT_NODEFILE", "COBALT_PARTNAME", "FLUX_JOB_ID",
)  # fmt: skip


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _ALLOCATION_VARIABLES}
    env.update(extra)
    return env


def hpcdl_run(*args: str, timeout: float = 60, cwd: Path | None = None, **env: str):
    """Run ``python -m hpcdl run ARGS``; return the CompletedProcess (text) and the seconds it took."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "run", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(**env),
        cwd=cwd,
    )
    return done, time.monotonic() - started


def rank_lines(stdout: str, rank: int) -> list[str]:
    prefix = f"[{rank}]<stdout>:"
    return [line[len(prefix) :] for line in stdout.splitlines() if line.startswith(prefix)]


def is_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (read from /proc, no psutil)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], seconds: float = 5.0) -> list[int]:
    """Wait up to `seconds` for `pids` to end; return those still running."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if is_running(pid)]
        if not alive:
            return []
        time.sleep(0.05)
    return [pid for pid in pids if is_running(pid)]


def read_pids(directory: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(directory.glob("*.pid")) if p.read_text().strip()]


def wait_files(directory: Path, pattern: str, count: int, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while len(list(directory.glob(pattern))) < count:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"only {len(list(directory.glob(pattern)))} of {count} {pattern} in {directory}"
            )
        time.sleep(0.05)
