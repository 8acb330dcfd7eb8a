"""``python -m hpcdl.scaling.runtimer COMMAND...``: run one rank's command and record how long it ran.

A scaling study starts every rank of a user's script under this wrapper. When the script reports its steps
through :class:`hpcdl.scaling.StepTimer` the study uses those; otherwise it times whole runs from the
records written here (``run.rankR.json`` beside the step records). Signals the launcher or the batch
system sends (TERM, INT, HUP, USR1, USR2) are passed on to the command, and the wrapper exits with the
command's status (128 + signal when it was killed), so launchers see the same outcome as without it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Optional

from hpcdl.common.discovery import discover
from hpcdl.common.output_file import write_output_file
from hpcdl.common.steps import run_directory, run_file

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def rank_argv(command: list[str]) -> list[str]:
    """The command as run: a first word ending in ``.py`` runs with this Python."""
    if command and command[0].endswith(".py"):
        return [sys.executable, *command]
    return list(command)


def main(argv: Optional[list[str]] = None) -> int:
    command = list(sys.argv[1:] if argv is None else argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("usage: python -m hpcdl.scaling.runtimer COMMAND [ARGS...]", file=sys.stderr)
        return 2
    info = discover()
    started_wall, started = time.time(), time.perf_counter()
    try:
        child = subprocess.Popen(rank_argv(command))
    except OSError as exc:
        print(f"hpcdl scaling: cannot start {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    for signum in FORWARDED:
        signal.signal(signum, lambda number, _frame: child.send_signal(number))
    code = child.wait()
    seconds = time.perf_counter() - started
    directory = run_directory()
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        record = {
            "rank": info.rank,
            "size": info.size,
            "host": info.host,
            "cpus": os.cpu_count() or 0,
            "start": round(started_wall, 6),
            "seconds": seconds,
            "exit": code,
        }
        text = json.dumps(record) + "\n"
        write_output_file(run_file(directory, info.rank), "run record", text, replace=True, mode=0o666)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
