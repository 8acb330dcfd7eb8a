"""Progress bars for long commands (scaling studies, benchmarks, stack builds, job watching).

One small face over ``rich.progress`` so every command shows the same thing: a description, a bar,
``done/total`` counts (or bytes and a rate for downloads), elapsed time and an ETA. It draws only on a
terminal; when standard error is not a terminal (a batch job's log, a pipe, CI) or the user passed
``--no-progress``, it draws nothing and the command's own lines are all that is printed.

Library code never imports this: it reports through plain callbacks, and the CLI layer hands it one of
these bars' ``advance``/``update`` methods.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

NO_PROGRESS_HELP = "Draw no progress bar (the default when standard error is not a terminal)."


def enabled(no_progress: bool = False, stream=None) -> bool:
    """Whether a bar should be drawn: asked for, and standard error is a terminal."""
    stream = stream if stream is not None else sys.stderr
    return not no_progress and bool(getattr(stream, "isatty", lambda: False)())


@dataclass
class Bar:
    """One task of a progress display; every method is a no-op when drawing is off.

    A count bar draws every step as it happens: its steps are few and each is work the user waits for (a
    benchmark's message size, a study's run), which a 10 Hz redraw would skip when two finish close
    together. A bytes bar redraws at rich's own pace, however many chunks arrive."""

    _progress: Optional[Progress] = None
    _task: Optional[TaskID] = None
    _draw_each_step: bool = False
    completed: float = 0.0
    total: Optional[float] = None
    description: str = ""

    def advance(self, amount: float = 1.0) -> None:
        self.completed += amount
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, amount)
            self._drawn()

    def update(
        self,
        *,
        completed: Optional[float] = None,
        total: Optional[float] = None,
        description: Optional[str] = None,
    ) -> None:
        if completed is not None:
            self.completed = completed
        if total is not None:
            self.total = total
        if description is not None:
            self.description = description
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=completed, total=total, description=description)
            self._drawn()

    def _drawn(self) -> None:
        if self._draw_each_step and self._progress is not None:
            self._progress.refresh()

    def log(self, message: str) -> None:
        """Print a line above the bar (or plainly to standard error when no bar is drawn)."""
        if self._progress is not None:
            self._progress.console.print(message, markup=False, highlight=False)
        else:
            print(message, file=sys.stderr, flush=True)


def _columns(kind: str) -> list:
    text = TextColumn("[progress.description]{task.description}")
    if kind == "bytes":
        return [text, BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn()]
    return [
        text,
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    ]


@contextmanager
def bar(
    description: str, total: Optional[float], *, kind: str = "count", no_progress: bool = False
) -> Iterator[Bar]:
    """A progress bar for the duration of a ``with`` block.

    ``kind`` is ``"count"`` (``done/total``, elapsed, ETA) or ``"bytes"`` (size, rate, ETA). ``total`` may
    be None when unknown (the bar then pulses).
    """
    if not enabled(no_progress):
        yield Bar(total=total, description=description)
        return
    progress = Progress(*_columns(kind), console=Console(stderr=True), transient=False)
    with progress:
        task = progress.add_task(description, total=total)
        yield Bar(
            _progress=progress,
            _task=task,
            _draw_each_step=kind == "count",
            total=total,
            description=description,
        )
