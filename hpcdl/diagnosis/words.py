"""How the diagnosis names ranks and times in its sentences."""

from __future__ import annotations

import datetime
from collections.abc import Iterable


def ranks_text(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 0, 2, 5-9`` ('' for none)."""
    ordered = sorted(set(ranks))
    runs: list[str] = []
    index = 0
    while index < len(ordered):
        end = index
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        first, last = ordered[index], ordered[end]
        runs.append(str(first) if first == last else f"{first}-{last}")
        index = end + 1
    if not runs:
        return ""
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(runs)


def clock(seconds: float | None) -> str:
    """A wall-clock time of day to the millisecond (local time), '?' when unknown."""
    if seconds is None:
        return "?"
    return datetime.datetime.fromtimestamp(seconds).strftime("%H:%M:%S.%f")[:-3]
