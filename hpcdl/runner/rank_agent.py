"""Runs one rank for ``hpcdl run``: ``python -c <this file>``, here or on another host over ssh.

Standard library only (a remote host needs Python, not hpcdl, to run plain programs). Protocol on
stdin: the first line is JSON ``{"argv", "env", "cwd", "token"}`` (so the job secret never appears on
a command line); later lines ``signal N`` forward a signal to the rank's process group. EOF on stdin
means the launcher is gone (even killed with SIGKILL, or its ssh connection lost): the rank's process
group gets SIGTERM, then SIGKILL, so no rank outlives its launcher. When the rank ends, the agent
writes ``<token> exit <returncode>`` on stderr and exits; ``<token> pid <pid>`` after the start names the
rank's process group. The launcher strips these lines from the rank's output.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO

GRACE_SECONDS = 3.0


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _stop_group(child: subprocess.Popen) -> None:
    _signal_group(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_group(child.pid, signal.SIGKILL)


def _follow_control(stdin: BinaryIO, child: subprocess.Popen) -> None:
    for line in stdin:
        words = line.split()
        if len(words) == 2 and words[0] == b"signal":
            _signal_group(child.pid, int(words[1]))
    _stop_group(child)


def _interrupts_by_default() -> None:
    """In the rank's process, before exec: SIGINT back at its default. A launcher started with it ignored
    (a non-interactive shell starts background commands so) passes that on to its agents, and the rank
    would never see the Ctrl-C the launcher forwards; a Python rank would get no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def main() -> None:
    stdin = sys.stdin.buffer
    spec = json.loads(stdin.readline())
    env = dict(os.environ)
    env.update(spec["env"])
    try:
        os.chdir(spec["cwd"])
    except OSError as exc:
        sys.stderr.write(
            f"hpcdl run: cannot enter {spec['cwd']} here ({exc.strerror}); staying in {os.getcwd()}\n"
        )
    try:
        child = subprocess.Popen(
            spec["argv"],
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_interrupts_by_default,
        )
    except OSError as exc:
        sys.stderr.write(f"hpcdl run: cannot start {spec['argv'][0]}: {exc.strerror}\n")
        sys.stderr.write(f"{spec['token']} exit 127\n")
        sys.stderr.flush()
        os._exit(127)
    sys.stderr.write(f"{spec['token']} pid {child.pid}\n")
    sys.stderr.flush()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: _signal_group(child.pid, received))
    threading.Thread(target=_follow_control, args=(stdin, child), daemon=True).start()
    returncode = child.wait()
    _signal_group(child.pid, signal.SIGKILL)  # nothing the rank started outlives it
    sys.stdout.flush()
    sys.stderr.write(f"{spec['token']} exit {returncode}\n")
    sys.stderr.flush()
    # os._exit: the control thread may sit in a read of stdin, which blocks interpreter shutdown.
    os._exit(returncode if returncode >= 0 else 128 - returncode)


if __name__ == "__main__":
    main()
