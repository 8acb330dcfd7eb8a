"""The scheduler's warning signals, turned into a stop request that the ranks agree on at their next commit.

The handler only records the request (``hpcdl.common.elastic_state.request_stop``): it never raises
into the interrupted code, so a signal that lands in the middle of a collective, of a checkpoint's write
or of anything else changes nothing there, and a second one changes nothing at all. System calls that
the signal interrupts are restarted (``siginterrupt(False)``) where the kernel allows.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any, Optional

from hpcdl.checkpoint.errors import CheckpointError
from hpcdl.common.elastic_state import request_stop


def parse(names: Sequence[str]) -> list[signal.Signals]:
    """Signals from names such as ``USR2``, ``SIGTERM`` or numbers; a CheckpointError for others."""
    found = []
    for raw in names:
        name = raw.strip().upper()
        if not name:
            continue
        try:
            if name.isdigit():
                sig = signal.Signals(int(name))
            else:
                sig = signal.Signals["SIG" + name.removeprefix("SIG")]
        except (KeyError, ValueError):
            raise CheckpointError(
                f"{raw!r} is not a signal name; give names such as USR2, TERM, USR1 (comma-separated)"
            ) from None
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            raise CheckpointError(f"{sig.name} cannot be caught; ask the scheduler for USR2, USR1 or TERM")
        if sig not in found:
            found.append(sig)
    if not found:
        raise CheckpointError("no signal to checkpoint on; give at least one, e.g. USR2,TERM")
    return found


def _handler(signum: int, frame: Optional[FrameType]) -> None:
    request_stop(signum)


@contextlib.contextmanager
def catching(signals: Sequence[signal.Signals]) -> Iterator[None]:
    """Within the block, ``signals`` ask for a stop at the next commit; the previous handlers afterwards."""
    if threading.current_thread() is not threading.main_thread():
        raise CheckpointError(
            "hpcdl.checkpoint.run must be called from the main thread: Python delivers signals only there"
        )
    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in signals:
            previous[sig] = signal.signal(sig, _handler)
            signal.siginterrupt(sig, False)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
