"""Whether a rank's error is its own or a consequence of another rank's end, and which rank it blames.

The runtime fails a rank's collectives when another rank shut down or exited (``HpcdlShutdownError``:
``rank 1 has shut down``), when the stall inspector cancels an operation some ranks never submitted
(``stall shutdown: ... but rank 1 has not submitted it``), and when a connection to a peer breaks or a peer
stops answering (``lost the connection to rank 1``, ``rank 1 (pid N) died``, ``timed out receiving from rank
1``). These are consequences: the cause is the blamed rank's own error, signal or early exit. The runtime
keeps these classes and texts stable for this reading.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpcdl.diagnosis.tracebacks import RaisedError

# Every operation fails with this class when the job shut down; only a rank's own shutdown is its own doing.
SHUTDOWN_CLASSES = ("HpcdlShutdownError",)
_OWN_SHUTDOWN = re.compile(r"shut down on this rank|^hpcdl was shut down$")
_RANKS = r"(?P<ranks>ranks? \d+(?:, \d+)*)"
# (why, pattern naming the rank(s) blamed), most specific first.
_BLAMES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("stall", re.compile(rf"stall shutdown: .*? but {_RANKS} (?:has|have) not submitted")),
    ("shutdown", re.compile(rf"{_RANKS} (?:has|have) shut down")),
    ("connection", re.compile(rf"lost the connection to {_RANKS}")),
    ("connection", re.compile(rf"{_RANKS} \(pid \d+\) died")),
    ("timeout", re.compile(rf"timed out [a-z ]*?{_RANKS}")),
    ("timeout", re.compile(rf"timed out .*?: {_RANKS} (?:has|have) not submitted it")),
)


@dataclass(frozen=True)
class Verdict:
    """`consequence`: the error came from another rank's end (`blamed`, possibly unknown: empty), for
    `why`: 'shutdown', 'stall', 'connection' or 'timeout'."""

    consequence: bool
    blamed: tuple[int, ...] = ()
    why: str = ""


CAUSE = Verdict(False)


def parse_ranks(text: str) -> tuple[int, ...]:
    """``rank 3`` -> (3,), ``ranks 0, 2`` -> (0, 2)."""
    return tuple(int(number) for number in re.findall(r"\d+", text.split(" ", 1)[1]))


def judge_line(line: str, shutdown_class: bool = False) -> Verdict:
    """The verdict on one exception line (``Class: message``); `shutdown_class`: its class is one of
    SHUTDOWN_CLASSES."""
    for why, pattern in _BLAMES:
        match = pattern.search(line)
        if match:
            return Verdict(True, parse_ranks(match["ranks"]), why)
    if shutdown_class and not _OWN_SHUTDOWN.search(line.split(": ", 1)[-1]):
        return Verdict(True, (), "shutdown")
    return CAUSE


def judge(error: RaisedError) -> Verdict:
    """Cause or consequence: a consequence anywhere in the exception's chain (a user's ``raise ... from``
    around the runtime's error) makes the whole one."""
    for line in reversed(error.chain or (f"{error.type}: {error.message}",)):
        name = line.split(":", 1)[0].rsplit(".", 1)[-1]
        verdict = judge_line(line, name in SHUTDOWN_CLASSES)
        if verdict.consequence:
            return verdict
    return CAUSE
