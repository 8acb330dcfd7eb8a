"""Which rank failed first, by its own error, and which ranks only failed because of it.

The launcher sees the ranks' exits in whatever order its pipes, ssh, srun or mpirun deliver them: when rank
1 raises, rank 0 may fail a few microseconds later with ``HpcdlShutdownError: rank 1 has shut down`` and
still be seen first. So the order of exits decides nothing here. Each rank that ended is judged from what it
left:

- its last Python traceback: an error of its own is a *cause*; the runtime's errors that say another rank
  ended, broke a connection or never submitted an operation are *consequences*, and name that rank
  (:mod:`hpcdl.diagnosis.consequences`);
- without a traceback, its status: a signal or non-zero exit before any other rank failed (or an OOM kill,
  whenever) is a cause; a polite signal or non-zero exit once the job was already failing is the launcher's
  (or mpirun's, srun's) stop.

The first failure is the earliest cause. When there is none, the consequences' blame leads to it: a rank that
exited 0 while the others still waited for it, or one that was stuck (the others' stall shutdown names it).

A rank whose output was lost (an mpirun that crashed while it stopped the job) is judged from the last words
it left in the job's debug directory (:mod:`hpcdl.common.last_words`), where the launcher can read them.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from hpcdl.common import last_words
from hpcdl.diagnosis.consequences import Verdict, judge
from hpcdl.diagnosis.tracebacks import last_error
from hpcdl.diagnosis.words import ranks_text
from hpcdl.runner.procs import RankEnd

# Signals with which a launcher (hpcdl run, srun, mpirun) stops the ranks of a failing job.
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP})
ERROR_WIDTH = 160  # characters of a consequence's error line shown
HEADLINE_WIDTH = 120  # characters of the first failure's error line in the summary's first line
STDERR_LINES_SHOWN = 10


@dataclass(frozen=True)
class Account:
    """The first failure (`first`, with `what` it did in words; `own`: by its own error or status, not
    found through the others' blame), the ranks that failed because of it, those stopped without an error of
    their own, and (`also`) those that failed by their own errors after it."""

    first: RankEnd
    what: str
    consequences: list[tuple[RankEnd, Verdict]]
    stopped: list[RankEnd]
    own: bool = True
    also: tuple[RankEnd, ...] = ()  # later ranks that failed by errors of their own too

    @property
    def exit_code(self) -> int:
        """The launcher's exit code: the first failure's own, else 1 (found through the others' blame, or
        stopped by a launcher after its error)."""
        outcome = self.first.outcome
        if not self.own or outcome is None or outcome.ok:
            return 1
        if self.first.error is not None and outcome.signal in STOP_SIGNALS:
            return 1
        return outcome.launcher_exit_code or 1


def _stopped(end: RankEnd, failing_since: float) -> bool:
    """Ended without an error of its own after the job was failing: by a stop signal, or a non-zero exit."""
    outcome = end.outcome
    if outcome is None or outcome.ok or outcome.oom or end.ended_at is None:
        return False
    if end.ended_at <= failing_since:  # the first failure seen is not a consequence of itself
        return False
    return outcome.signal is None or outcome.signal in STOP_SIGNALS


def _when(end: RankEnd) -> float:
    times = [t for t in (end.error_at, end.ended_at) if t is not None]
    return min(times) if times else float("inf")


def with_last_words(ends: list[RankEnd], directory: Path, since: float) -> list[RankEnd]:
    """`ends`, each rank whose error the launcher never saw completed from the last words it left in
    `directory` at `since` (wall-clock seconds, the job's start) or later; older ones are another job's."""
    completed = []
    for end in ends:
        words = last_words.read(directory, end.rank) if end.error is None else None
        written = words.get("time") if words is not None else None
        error = None
        if words is not None and words.get("rank") == end.rank and isinstance(written, (int, float)):
            lines = words.get("traceback")
            if written >= since and isinstance(lines, list):
                error = last_error([str(line) for line in lines])
        if error is None:
            completed.append(end)
        else:  # its time on the launcher's clock, like the errors it read itself
            completed.append(replace(end, error=error, error_at=time.monotonic() - (time.time() - written)))
    return completed


def account(
    ends: list[RankEnd], blamed_key: Callable[[RankEnd, int], int | None] | None = None
) -> Account | None:
    """The account of a failed job from every rank's end (None when no rank failed); the job was failing
    from the moment the launcher learned of the first failed rank. `blamed_key(end, rank)`: the `.rank` of
    the end that `end`'s error means by ``rank N`` (elastic workers: the worker at that rank of `end`'s
    round), where these differ."""
    failed = [e for e in ends if e.error is not None or (e.outcome is not None and not e.outcome.ok)]
    if not failed:
        return None
    failing_since = min(_when(e) for e in failed)
    causes: list[RankEnd] = []
    consequences: list[tuple[RankEnd, Verdict]] = []
    stopped: list[RankEnd] = []
    for end in failed:
        if end.error is not None:
            verdict = judge(end.error)
            if verdict.consequence:
                if blamed_key is not None:
                    keys = (blamed_key(end, rank) for rank in verdict.blamed)
                    verdict = replace(verdict, blamed=tuple(key for key in keys if key is not None))
                consequences.append((end, verdict))
            elif end.error.name == "KeyboardInterrupt" and _stopped(end, failing_since):
                stopped.append(end)
            else:
                causes.append(end)
        elif _stopped(end, failing_since):
            stopped.append(end)
        else:
            causes.append(end)
    if causes:
        first = min(causes, key=_when)
        also = tuple(end for end in sorted(causes, key=_when) if end is not first)
        return Account(first, _own_failure(first), consequences, stopped, also=also)
    blamed = _blamed(ends, consequences)
    if blamed is not None:
        others = [c for c in consequences if c[0] is not blamed]
        return Account(blamed, _blamed_failure(blamed, consequences), others, stopped, own=False)
    if consequences:
        first, verdict = min(consequences, key=lambda c: _when(c[0]))
        what = f"{_ended(first)}, as a consequence of another rank's end that no rank reported"
        return Account(first, what, [c for c in consequences if c[0] is not first], stopped, own=False)
    first = min(stopped, key=_when)
    return Account(first, _ended(first), [], [e for e in stopped if e is not first], own=False)


def _blamed(ends: list[RankEnd], consequences: list[tuple[RankEnd, Verdict]]) -> RankEnd | None:
    """The rank the consequences blame (the most often named, then the earliest to end), followed down a
    chain of blame (rank 2 lost rank 1, which had lost rank 0) to its end."""
    by_rank = {end.rank: end for end in ends}
    verdicts = {end.rank: verdict for end, verdict in consequences}
    counts: dict[int, int] = {}
    for _, verdict in consequences:
        for rank in verdict.blamed:
            counts[rank] = counts.get(rank, 0) + 1
    known = [rank for rank in counts if rank in by_rank]
    if not known:
        return None
    rank = min(known, key=lambda r: (-counts[r], _when(by_rank[r]), r))
    seen = {rank}
    while rank in verdicts:
        onward = [r for r in verdicts[rank].blamed if r in by_rank and r not in seen]
        if not onward:
            break
        rank = min(onward, key=lambda r: (_when(by_rank[r]), r))
        seen.add(rank)
    return by_rank[rank]


def _ended(end: RankEnd) -> str:
    return end.outcome.describe() if end.outcome is not None else "ended without an exit status"


def _own_failure(end: RankEnd) -> str:
    if end.error is not None:
        return f"failed first, with {end.error.headline(HEADLINE_WIDTH)} ({_ended(end)})"
    return _ended(end)


def _blamed_failure(end: RankEnd, consequences: list[tuple[RankEnd, Verdict]]) -> str:
    """What the blamed rank did: exited (0, early), was stuck (stall shutdown), or left."""
    waiting = ranks_text([c.rank for c, v in consequences if end.rank in v.blamed]) or "the other ranks"
    whys = {v.why for _, v in consequences if end.rank in v.blamed}
    if end.outcome is not None and end.outcome.ok:
        return f"exited with code 0 while {waiting} still waited for it in collectives"
    if whys == {"shutdown"} and end.outcome is not None and end.outcome.signal in STOP_SIGNALS:
        # it shut down (on its way out) and was stopped before it had quite ended
        return (
            f"shut down while {waiting} still waited for it in collectives, and was stopped as it ended "
            f"({end.outcome.describe()})"
        )
    if "stall" in whys:
        return f"never submitted the operation {waiting} waited for (stall shutdown), and {_stop_words(end)}"
    if "timeout" in whys:
        return f"did not answer {waiting} in time (HPCDL_TIMEOUT), and {_stop_words(end)}"
    return f"{_ended(end)}, and {waiting} failed for want of it"


def _stop_words(end: RankEnd) -> str:
    if end.outcome is None:
        return "had no exit status"
    if end.outcome.signal in STOP_SIGNALS:
        return f"was stopped ({end.outcome.describe()})"
    return end.outcome.describe()


def detail_lines(found: Account, label: Callable[[RankEnd], str]) -> list[str]:
    """What follows the summary's first line (``LABEL WHAT``): the first failure's traceback (or its last
    stderr lines), then the consequences grouped by error. `label(end)` names a rank (``rank 1 on host vm``,
    ``worker 3 on vm``)."""
    first = found.first
    lines: list[str] = []
    if first.error is not None:
        lines.append(f"its error ({label(first)}):")
        lines += [f"    {line}" for line in first.error.lines]
    else:
        # what the ranks that waited for it reported about it (the runtime says where a missing rank was)
        reports = [c for c, v in found.consequences if first.rank in v.blamed and c.error and c.error.more]
        if reports:
            lines.append(f"what {label(reports[0])} reported about it:")
            lines += [f"    {line}" for line in reports[0].error.more]  # type: ignore[union-attr]
        elif first.stderr_tail:
            lines.append(f"last lines of its stderr ({label(first)}):")
            lines += [f"    {line}" for line in first.stderr_tail[-STDERR_LINES_SHOWN:]]
    own: dict[str, list[int]] = {}
    for end in found.also:
        own.setdefault(end.error.headline(ERROR_WIDTH) if end.error else _ended(end), []).append(end.rank)
    for headline, ranks in own.items():
        if first.error is not None and headline == first.error.headline(ERROR_WIDTH):
            lines.append(f"{ranks_text(ranks)} failed with the same error")
        else:
            lines.append(f"{ranks_text(ranks)} failed too, not because of it: {headline}")
    groups: dict[str, list[int]] = {}
    for end, _verdict in found.consequences:
        assert end.error is not None
        groups.setdefault(end.error.headline(ERROR_WIDTH), []).append(end.rank)
    for headline, ranks in groups.items():
        lines.append(f"consequence, not a cause: {ranks_text(ranks)} failed with {headline}")
    return lines
