"""Rank output: every line to the terminal prefixed ``[rank]<stdout>:``, optionally time-stamped and
copied to per-rank log files (``DIR/rank.N/stdout``, ``.../stderr``); the last stderr lines of each
rank, and the last Python traceback in them, are kept for the failure summary."""

from __future__ import annotations

import collections
import contextlib
import datetime
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from hpcdl.common.output_file import OutputFileError, make_directories, open_output_file
from hpcdl.diagnosis.tracebacks import RaisedError, TracebackReader
from hpcdl.runner.errors import LaunchError

TAIL_LINES = 20


@dataclass(frozen=True)
class OutputOptions:
    prefix_timestamp: bool = False
    output_dir: Path | None = None
    force: bool = False


class RankOutput:
    """The sinks of one rank: terminal (shared, locked), optional log files, stderr tail."""

    def __init__(self, rank: int, options: OutputOptions, lock: threading.Lock, files: dict[str, BinaryIO]):
        self.rank = rank
        self._options = options
        self._lock = lock
        self._files = files
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._tracebacks = TracebackReader()
        self.error_at: float | None = None  # when the last traceback's exception line came (monotonic)

    @property
    def error(self) -> RaisedError | None:
        """The exception of the last complete Python traceback on this rank's stderr."""
        return self._tracebacks.last

    def write_line(self, stream: str, line: bytes) -> None:
        """Write one line (with or without its newline) of `stream` ('stdout' or 'stderr')."""
        if not line.endswith(b"\n"):
            line += b"\n"
        if stream == "stderr":
            text = line.decode(errors="replace").rstrip("\n")
            self.stderr_tail.append(text)
            before = self._tracebacks.count
            self._tracebacks.feed(text)
            if self._tracebacks.count != before:
                self.error_at = time.monotonic()
        prefix = f"[{self.rank}]<{stream}>:"
        if self._options.prefix_timestamp:
            stamp = datetime.datetime.now().isoformat(sep=" ", timespec="milliseconds")
            prefix = f"{stamp} {prefix}"
        terminal = sys.stdout.buffer if stream == "stdout" else sys.stderr.buffer
        with self._lock:
            # A closed terminal (`hpcdl run ... | head`) must not stop the draining of the rank's pipe.
            with contextlib.suppress(BrokenPipeError, ValueError):
                terminal.write(prefix.encode() + line)
                terminal.flush()
            log = self._files.get(stream)
            if log is not None and not log.closed:
                log.write(line)
                log.flush()

    def close(self) -> None:
        with self._lock:
            for log in self._files.values():
                log.close()


class OutputRouter:
    """Creates each rank's sinks; refuses to overwrite existing per-rank logs unless forced."""

    def __init__(self, options: OutputOptions, size: int):
        self._options = options
        self._lock = threading.Lock()
        self._width = len(str(size - 1))
        if options.output_dir is not None:
            self._prepare_dir(options.output_dir, size)

    def _rank_dir(self, rank: int) -> Path:
        assert self._options.output_dir is not None
        return self._options.output_dir / f"rank.{rank:0{self._width}d}"

    def _prepare_dir(self, directory: Path, size: int) -> None:
        existing = [
            self._rank_dir(rank) / stream
            for rank in range(size)
            for stream in ("stdout", "stderr")
            if (self._rank_dir(rank) / stream).exists()
        ]
        if existing and not self._options.force:
            raise LaunchError(
                f"--output-filename {directory} already holds rank logs (e.g. {existing[0]}); "
                "choose another directory or add --force to overwrite them"
            )
        try:
            for rank in range(size):
                make_directories(self._rank_dir(rank), "--output-filename directory")
        except OutputFileError as exc:
            raise LaunchError(str(exc)) from None

    def write_untagged(self, stream: str, line: bytes) -> None:
        """A line that belongs to no rank (mpirun's own messages), passed through as it is."""
        terminal = sys.stdout.buffer if stream == "stdout" else sys.stderr.buffer
        with self._lock, contextlib.suppress(BrokenPipeError, ValueError):
            terminal.write(line if line.endswith(b"\n") else line + b"\n")
            terminal.flush()

    def for_rank(self, rank: int) -> RankOutput:
        files: dict[str, BinaryIO] = {}
        if self._options.output_dir is not None:
            try:  # closed by RankOutput.close; parents: elastic workers beyond the first size
                files = {
                    stream: open_output_file(
                        self._rank_dir(rank) / stream,
                        f"{stream} of rank {rank}",
                        binary=True,
                        replace=True,
                        parents=True,
                        mode=0o666,
                    )
                    for stream in ("stdout", "stderr")
                }
            except OutputFileError as exc:
                raise LaunchError(str(exc)) from None
        return RankOutput(rank, self._options, self._lock, files)


def pump_lines(pipe: BinaryIO, on_line: Callable[[bytes], None]) -> None:
    """Read `pipe` to EOF, calling `on_line` per line (thread target)."""
    with pipe:
        for line in iter(pipe.readline, b""):
            on_line(line)
