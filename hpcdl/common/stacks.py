"""The Python stacks of a rank, on demand, also while its main thread holds the GIL in C code.

:func:`install` (called by ``init``) has ``faulthandler`` write the stacks of every thread into
``<debug dir>/stacks.rank<R>.txt`` when the process receives :data:`STACK_SIGNAL`. The handler is C code
that needs no GIL, so a rank stuck in a C call or a tight loop still answers. Whoever asks for a dump
empties the file first, so the file holds the latest dump only: the engine does this when a stall report
needs a missing rank's stack (it raises the signal in its own process, over the file descriptor
:func:`descriptor` gives it), and :func:`request` does it for another process. A real-time signal is used,
not SIGUSR1/SIGUSR2 (schedulers send those to warn of a job's end) or SIGQUIT (a launcher may use it).
Like any signal, it ends a sleep early (``sleep``, ``nanosleep``: never restarted); the other system calls
it interrupts restart (faulthandler's handler is installed with ``SA_RESTART``).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time
from pathlib import Path
from typing import IO, Optional

from hpcdl.common.debug_dir import debug_dir
from hpcdl.common.exceptions import HpcdlError
from hpcdl.common.output_file import private_directory

STACK_SIGNAL = signal.SIGRTMIN + 3

_file: Optional[IO[str]] = None  # the file faulthandler writes into, kept open for the process's life


def stack_path(rank: int) -> Path:
    """Where rank ``rank`` of this job writes its stacks."""
    return debug_dir() / f"stacks.rank{int(rank)}.txt"


def install(rank: int) -> None:
    """Register the stack dump of every thread on :data:`STACK_SIGNAL`, written to :func:`stack_path`."""
    global _file
    path = stack_path(rank)
    private_directory(path.parent, "debug directory (HPCDL_DEBUG_DIR)")
    # Appending: whoever empties the file for a new dump need not move this descriptor's offset back.
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    new = os.fdopen(os.open(path, flags, 0o600), "w+")
    faulthandler.register(STACK_SIGNAL, file=new, all_threads=True, chain=False)
    old, _file = _file, new
    if old is not None:
        old.close()


def descriptor() -> int:
    """The file descriptor the dumps go to (-1 before :func:`install`), for the engine."""
    return _file.fileno() if _file is not None else -1


def main_thread_id() -> str:
    """The main thread as a dump names it (``Thread 0x00007f...``)."""
    ident = threading.main_thread().ident or 0
    return f"0x{ident:016x}"


def read(rank: int) -> Optional[str]:
    """The latest dump of rank ``rank`` of this job, or None when there is none."""
    try:
        text = stack_path(rank).read_text(errors="replace")
    except OSError:
        return None
    return text or None


def request(pid: int, rank: int, timeout: float = 2.0) -> Optional[str]:
    """Ask the process ``pid`` (rank ``rank`` of this job, on this host) for its stacks and return them,
    or None when it wrote nothing within ``timeout`` seconds."""
    path = stack_path(rank)
    try:
        os.truncate(path, 0)
    except OSError:
        return None
    os.kill(pid, STACK_SIGNAL)
    deadline = time.monotonic() + timeout
    size = -1
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = path.stat().st_size
        if now > 0 and now == size:  # written and no longer growing
            return read(rank)
        size = now
    return read(rank)


def engine_options(rank: int, size: int) -> dict[str, object]:
    """Install the stack dump of a rank of a job of ``size`` ranks and return the ``hpcdl_init`` options
    that let its engine use it and write its flight recorder (see c_api.h). A job of one process, which no
    peer can wait for, gets no files unless ``HPCDL_DEBUG_DIR`` asks for them; a directory that cannot be
    made costs the stall reports their stacks, not the job."""
    if size <= 1 and not os.environ.get("HPCDL_DEBUG_DIR"):
        return {}
    try:
        install(rank)
    except (OSError, HpcdlError) as exc:
        print(f"hpcdl WARNING: no stack dumps for stall reports: {exc}", flush=True)
        return {}
    return {
        "debug_dir": str(debug_dir()),
        "stack_fd": descriptor(),
        "stack_signal": int(STACK_SIGNAL),
        "stack_thread": main_thread_id(),
    }
