"""The last Python traceback in a rank's stderr, read line by line as the rank writes it.

A rank's output reaches the launcher one line at a time (through the rank agent, ssh, srun or mpirun), so the
reader is incremental: it keeps only the traceback being read and the last complete one, whatever the length
of the output. Chained exceptions (``During handling of the above exception ...``, ``The above exception was
the direct cause ...``) are kept as one chain: a consequence anywhere in it makes the whole a consequence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

HEADER = "Traceback (most recent call last):"
_CHAIN_LINES = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+)(?:, in (?P<function>.*))?$')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
_MARKERS = re.compile(r"^\s*[\^~]+\s*$")  # Python 3.11's carets under the failing expression
FRAMES_SHOWN = 6  # of a long traceback: the outermost two and the innermost four
MORE_LINES = 40  # of an exception message's further lines, at most


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def describe(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True)
class RaisedError:
    """The exception a traceback ended with: its class (as printed, possibly with its module), message (its
    first line; `more` holds the others), frames (outermost first), the exception lines of its chain
    (earliest first, this one last) and the traceback's own lines, shortened for a summary."""

    type: str
    message: str
    frames: tuple[Frame, ...] = ()
    chain: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()
    more: tuple[str, ...] = ()  # the message's further lines (the runtime's reports span several)

    @property
    def name(self) -> str:
        """The class name without its module (``HpcdlShutdownError``)."""
        return self.type.rsplit(".", 1)[-1]

    def headline(self, width: int = 200) -> str:
        """``Class: message`` on one line, cut at `width` characters."""
        text = f"{self.name}: {self.message}" if self.message else self.name
        return text if len(text) <= width else text[: width - 3] + "..."


@dataclass
class TracebackReader:
    """Feed it a rank's stderr lines; `last` is the last complete traceback's error (None before any), and
    `count` how many exception lines have been read (the further lines of a message do not count)."""

    last: RaisedError | None = None
    count: int = 0
    _lines: list[str] = field(default_factory=list)  # the traceback being read
    _frames: list[Frame] = field(default_factory=list)
    _chain: list[str] = field(default_factory=list)
    _reading: bool = False
    _chained: bool = False  # a chain line came after the last exception line
    _continuing: bool = False  # the lines that follow may still be the last exception's message

    def feed(self, line: str) -> None:
        line = line.rstrip("\r\n")
        if self._continuing and self.last is not None:
            if _continues(line) and len(self.last.more) < MORE_LINES:
                self.last = replace(self.last, more=(*self.last.more, line))
                return
            self._continuing = False
        if line == HEADER:
            if not self._chained:
                self._chain = []
            self._chained = False
            self._reading = True
            self._lines = [line]
            self._frames = []
            return
        if line in _CHAIN_LINES:
            self._chained = self.last is not None
            return
        if not self._reading:
            if line.strip():  # other output between two tracebacks: a new chain
                self._chained = False
            return
        if line.startswith((" ", "\t")):
            frame = _FRAME.match(line)
            if frame:
                self._frames.append(Frame(frame["file"], int(frame["line"]), frame["function"] or "?"))
            if not _MARKERS.match(line):
                self._lines.append(line)
            return
        match = _EXCEPTION.match(line)
        self._reading = False
        if match is None:  # something else interrupted the traceback (another thread's output)
            return
        self._lines.append(line)
        self._chain.append(line)
        self.count += 1
        self._continuing = True
        self.last = RaisedError(
            match["type"],
            (match["message"] or "").strip(),
            tuple(self._frames),
            tuple(self._chain),
            tuple(_shorten(self._lines)),
        )


def _continues(line: str) -> bool:
    """Whether a line after an exception line may belong to its message: not empty, not another traceback
    or chain line, not hpcdl's own note under it."""
    return bool(line.strip()) and line != HEADER and line not in _CHAIN_LINES and not line.startswith("hpcdl")


def _shorten(lines: list[str]) -> list[str]:
    """The header, the outermost and innermost frames (each with its source line), the exception line."""
    frames: list[list[str]] = []
    for line in lines[1:-1]:
        if _FRAME.match(line) or not frames:
            frames.append([line])
        else:
            frames[-1].append(line)
    if len(frames) > FRAMES_SHOWN:
        left = len(frames) - FRAMES_SHOWN
        frames = [*frames[:2], [f"  ... {left} more frame(s) ..."], *frames[-(FRAMES_SHOWN - 2) :]]
    return [lines[0], *(line for frame in frames for line in frame), lines[-1]]


def last_error(lines: list[str]) -> RaisedError | None:
    """The error of the last complete traceback in `lines`."""
    reader = TracebackReader()
    for line in lines:
        reader.feed(line)
    return reader.last
