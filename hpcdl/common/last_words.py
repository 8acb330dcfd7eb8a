"""A rank's last words: what it died of, kept where the other ranks and ``hpcdl debug analyze`` find it.

When a rank ends with an uncaught exception, ``sys.excepthook`` (installed by ``init()``) writes
``exit.rank<R>.json`` into the job's debug directory (:mod:`hpcdl.common.debug_dir`) before the traceback is
printed and before the runtime's shutdown at exit tells the other ranks that this one left. A rank whose
error is only a consequence of another's end (``rank 1 has shut down``, a stall cancellation, a lost
connection) then says so under its traceback and names the other rank's own error when it can read that
rank's last words (the same host, or a shared file system). Under a bare ``mpirun`` or ``srun``, whose own
message names whichever rank they saw exit first, every rank's output thus points at the cause.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

from hpcdl.common import debug_dir
from hpcdl.common.output_file import OutputFileError
from hpcdl.diagnosis.consequences import judge
from hpcdl.diagnosis.tracebacks import last_error

FILE = "exit.rank{rank}.json"
# What a launcher sends the other ranks once one has failed (srun --kill-on-bad-exit, mpirun, hpcdl run).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_installed: dict[str, Any] = {}  # the rank, directory and the hook this one wraps


def path(directory: Path, rank: int) -> Path:
    return directory / FILE.format(rank=rank)


def read(directory: Path, rank: int) -> dict[str, Any] | None:
    """Rank `rank`'s last words in `directory`, None when it left none (or they cannot be read)."""
    try:
        words = json.loads(path(directory, rank).read_text())
    except (OSError, ValueError):
        return None
    return words if isinstance(words, dict) else None


def read_all(directory: Path) -> dict[int, dict[str, Any]]:
    """Every rank's last words in `directory`, by rank."""
    found = {}
    for candidate in sorted(directory.glob(FILE.format(rank="*"))):
        words = read(directory, int(candidate.name.split(".")[1][len("rank") :]))
        if words is not None:
            found[int(words.get("rank", -1))] = words
    return found


def install(rank: int, directory: Path | None = None) -> None:
    """Make this process's uncaught exceptions leave their last words (again: only the rank changes)."""
    _installed.update(rank=rank, directory=directory or debug_dir.debug_dir())
    if "previous" not in _installed:
        _installed["previous"] = sys.excepthook
        sys.excepthook = _hook


def _hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    kept = _ignore_stop_signals()
    try:
        _say_last_words(kind, value, tb)
    finally:
        if sys.flags.interactive or hasattr(sys, "ps1"):  # the interpreter goes on after the error
            for signum, handler in kept.items():
                signal.signal(signum, handler)


def _ignore_stop_signals() -> dict[int, Any]:
    """Ignore a launcher's stop signals from the uncaught exception to the process's exit, so that the rank
    ends by its own exit status, and return the handlers they had.

    The culprit's exit makes srun (--kill-on-bad-exit) or mpirun stop the other ranks at once, often while
    one of them is printing the traceback of its consequence or running its exit handlers. A rank ended
    there loses the line naming the cause, and srun, once a task has ended by a signal, stops forwarding
    output: the ranks' tracebacks were cut off in one job of eight on a loaded node. Ignored (SIG_IGN, which
    the interpreter keeps while it finalizes, where it resets its own handlers), not held: an exit that
    hangs is still ended by the launcher's SIGKILL, seconds later."""
    if threading.current_thread() is not threading.main_thread():
        return {}  # only the main thread may set handlers
    kept = {}
    for signum in STOP_SIGNALS:
        handler = signal.getsignal(signum)
        if handler is not None:  # None: set outside Python, and it could not be put back
            kept[signum] = handler
            signal.signal(signum, signal.SIG_IGN)
    return kept


def _say_last_words(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    rank, directory, previous = _installed["rank"], _installed["directory"], _installed["previous"]
    words = None
    if not issubclass(kind, KeyboardInterrupt):
        words = describe(rank, kind, value, tb)
        try:
            debug_dir.write_private(path(directory, rank), json.dumps(words).encode(), "rank's last words")
        except (OSError, OutputFileError) as exc:
            _say(f"hpcdl: rank {rank} could not leave its last words in {directory}: {exc}")
    previous(kind, value, tb)
    if words is not None and words["consequence"]:
        _say(pointer(rank, words["blamed"], directory, words["why"]))


def _say(line: str) -> None:
    """`line` to standard error in one write: print() writes the text and its newline apart on a stream
    that writes through (as a rank's stderr does), and mpirun puts whatever another rank wrote meanwhile
    between the two, on the same line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def describe(
    rank: int, kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> dict[str, Any]:
    """The last words of rank `rank` dying of `value`."""
    lines = "".join(traceback.format_exception(kind, value, tb)).splitlines()
    error = last_error(lines)
    verdict = judge(error) if error is not None else None
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "time": time.time(),
        "error": error.headline(400) if error is not None else kind.__name__,
        "traceback": list(error.lines) if error is not None else lines[-10:],
        "consequence": bool(verdict and verdict.consequence),
        "blamed": list(verdict.blamed) if verdict else [],
        "why": verdict.why if verdict else "",
    }


def pointer(rank: int, blamed: list[int], directory: Path, why: str = "") -> str:
    """What a rank that failed because of others says under its traceback; `why`: what the others did
    (``hpcdl.diagnosis.consequences.Verdict.why``)."""
    if not blamed:
        return (
            f"hpcdl: rank {rank}'s error above is a consequence of another rank's end, not its cause; "
            f"the ranks' last words are in {directory}"
        )
    others = ", ".join(str(other) for other in blamed)
    if why in ("stall", "timeout"):
        return (
            f"hpcdl: rank {rank}'s error above is a consequence of rank {others} not taking part in the "
            "operation (stuck, or on another code path), not its cause."
        )
    text = f"hpcdl: rank {rank}'s error above is a consequence of rank {others}'s end, not its cause."
    for other in blamed:
        words = read(directory, other)
        if words is None:
            text += (
                f" Rank {other} left no Python error (it exited, was killed, or its last words are on its "
                f"host in {directory})."
            )
        elif words.get("consequence"):
            text += f" Rank {other} failed as a consequence too: {words.get('error')}."
        else:
            text += f" Rank {other} failed first, on host {words.get('host')}: {words.get('error')}"
            where = _innermost(words.get("traceback") or [])
            text += f" ({where})." if where else "."
    return text


def _innermost(lines: list[str]) -> str:
    """The innermost ``File "...", line N, in F`` of a traceback's lines, stripped."""
    frames = [line.strip() for line in lines if line.lstrip().startswith('File "')]
    return frames[-1] if frames else ""
