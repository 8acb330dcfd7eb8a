"""Every rank's Python stacks on request, as one would get them with py-spy, without py-spy.

``hpcdl run`` answers SIGQUIT (as Java and Go programs do) by asking each rank's agent for its rank's stacks
(``hpcdl.common.stacks`` has the rank write them on a real-time signal, also while its main thread holds the
GIL in C code), printing them rank by rank on its stderr and writing them to ``<debug dir>/stacks.txt``.
``hpcdl debug stacks JOB`` finds the job's ``hpcdl run`` through ``<debug dir>/launcher.json``, which it wrote
when it started, sends it SIGQUIT and prints that file once it is new.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from hpcdl.common import debug_dir
from hpcdl.runner.errors import LaunchError

LAUNCHER_FILE = "launcher.json"
STACKS_FILE = "stacks.txt"
ANSWER_SECONDS = 6.0  # how long hpcdl run waits for the ranks' answers (each agent gives its rank 3 s)


def decode(word: bytes) -> str:
    """The stacks an agent sent as one base64 word."""
    try:
        return base64.b64decode(word, validate=True).decode(errors="replace")
    except (binascii.Error, ValueError):
        return "(the rank's agent sent something unreadable)"


def render(answers: list[tuple[str, str | None]]) -> str:
    """Stacks by rank: (label, text or None when no answer came)."""
    parts = []
    for label, text in answers:
        body = text.rstrip("\n") if text is not None else f"(no answer within {ANSWER_SECONDS:g} s)"
        parts.append(f"=== {label} ===\n{body}\n")
    return "".join(parts)


def record_launcher(directory: Path, size: int) -> None:
    """Write ``launcher.json``: where ``hpcdl debug stacks`` finds this ``hpcdl run``."""
    record = {"pid": os.getpid(), "host": socket.gethostname(), "size": size, "started": time.time()}
    debug_dir.write_private(directory / LAUNCHER_FILE, json.dumps(record).encode(), "job record")


def forget_launcher(directory: Path) -> None:
    """Remove ``launcher.json`` as the job ends (its process id may soon be another program's)."""
    with contextlib.suppress(OSError):
        (directory / LAUNCHER_FILE).unlink()


@dataclass(frozen=True)
class Launcher:
    """A job's ``hpcdl run`` as its ``launcher.json`` says."""

    directory: Path
    pid: int
    host: str


def find_job(job: str | None, cwd: Path | None = None) -> Launcher:
    """The job named `job`: a debug directory, or a job id under ``./hpcdl-debug``; without one, the only
    job of ``./hpcdl-debug`` whose ``hpcdl run`` still runs on this host. LaunchError saying what to give
    when there is no such job or several."""
    root = (cwd or Path.cwd()) / debug_dir.ROOT
    if job is not None:
        for candidate in (Path(job), root / job):
            if (candidate / LAUNCHER_FILE).is_file():
                return _read_launcher(candidate)
        raise LaunchError(
            f"no job {job!r}: neither {job} nor {root / job} holds the {LAUNCHER_FILE} that hpcdl run writes "
            "when it starts; give the job's debug directory (HPCDL_DEBUG_DIR), or run this where it started"
        )
    running = [
        launcher
        for found in sorted(root.glob(f"*/{LAUNCHER_FILE}"))
        if (launcher := _read_launcher(found.parent)).host == socket.gethostname() and _alive(launcher.pid)
    ]
    if len(running) != 1:
        listed = ", ".join(launcher.directory.name for launcher in running)
        what = f"{len(running)} jobs run ({listed})" if running else "no job started here runs on this host"
        raise LaunchError(f"name the job: hpcdl debug stacks JOB ({what}, in {root})")
    return running[0]


def _read_launcher(directory: Path) -> Launcher:
    try:
        record = json.loads((directory / LAUNCHER_FILE).read_text())
        return Launcher(directory, int(record["pid"]), str(record["host"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LaunchError(f"cannot read {directory / LAUNCHER_FILE}: {exc}") from None


def _alive(pid: int) -> bool:
    """Whether `pid` is an ``hpcdl run`` of this user (a pid left in a file may be another program's now)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return False
    return owner == os.geteuid() and any(b"hpcdl" in word for word in command[:3])


def request(launcher: Launcher, timeout: float = ANSWER_SECONDS + 4.0) -> str:
    """Ask the job's ``hpcdl run`` (SIGQUIT) for every rank's stacks; the text, once its file is new."""
    if launcher.host != socket.gethostname():
        raise LaunchError(
            f"the job's hpcdl run runs on {launcher.host}, not here: run 'hpcdl debug stacks "
            f"{launcher.directory}' on {launcher.host}"
        )
    if not _alive(launcher.pid):
        raise LaunchError(f"the job's hpcdl run (pid {launcher.pid} on {launcher.host}) no longer runs")
    stacks = launcher.directory / STACKS_FILE
    before = stacks.stat().st_mtime_ns if stacks.exists() else 0
    os.kill(launcher.pid, signal.SIGQUIT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stacks.exists() and stacks.stat().st_mtime_ns != before:
            return stacks.read_text(errors="replace")
        time.sleep(0.05)
    raise LaunchError(
        f"hpcdl run (pid {launcher.pid}) wrote no {stacks} within {timeout:g} s; its own stderr may say why"
    )
