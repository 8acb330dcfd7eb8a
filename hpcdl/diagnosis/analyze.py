"""What happened in a job, in words, from its ranks' flight-recorder dumps (and their last words).

For each process set it says: the last operation every member completed; which rank is behind and at which
operation (the others wait in an operation it has not submitted: what it last submitted, and where its
Python stack was); which operations the ranks submitted in a different order; which rank differs in
shape, dtype, operation or reduction for the same name; which operations failed and why. Ranks that left
no dump are named, and so is the rank that failed first by its own error when the ranks left last words.

Operations are matched across ranks without trusting their clocks: the engine completes the operations of
a process set in the same order on every member, so the completed ones line up from the newest back;
operations still under way are matched by name (a name is under way at most once per rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcdl.diagnosis.flight import Dump, Dumps, Op
from hpcdl.diagnosis.words import clock, ranks_text

STACK_FRAMES_SHOWN = 4
OPS_SHOWN = 4


def main_thread_frames(stack: str | None) -> list[str]:
    """The innermost frames of the first thread of a faulthandler dump (the main thread comes first)."""
    if not stack:
        return []
    frames: list[str] = []
    started = False
    for line in stack.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            if started:
                break
            started = True
        elif started and line.strip().startswith("File "):
            frames.append(line.strip())
    return frames[:STACK_FRAMES_SHOWN]


@dataclass(frozen=True)
class Finding:
    """One thing that happened: a sentence, and lines that show it (indented when printed)."""

    text: str
    details: tuple[str, ...] = ()


def analyze(dumps: Dumps, last_words: dict[int, dict] | None = None) -> list[Finding]:
    findings = _coverage(dumps)
    findings += _first_failure(last_words or {})
    sets: dict[int, tuple[int, ...]] = {}
    size = max((dump.size for dump in dumps.by_rank.values()), default=0)
    for dump in dumps.by_rank.values():
        sets.update(dump.process_sets)
    sets.setdefault(0, tuple(range(size)))
    used = sorted({op.process_set for dump in dumps.by_rank.values() for op in dump.ops})
    for process_set in used:
        members = [r for r in sets.get(process_set, tuple(range(size))) if r in dumps.by_rank]
        if members:
            findings += _process_set(process_set, {r: dumps.by_rank[r] for r in members})
    return findings


def _coverage(dumps: Dumps) -> list[Finding]:
    found: list[Finding] = []
    ranks = sorted(dumps.by_rank)
    size = max((dump.size for dump in dumps.by_rank.values()), default=0)
    missing = [r for r in range(size) if r not in dumps.by_rank]
    if ranks:
        text = f"dumps of {ranks_text(ranks)} of a job of {size}"
        if missing:
            text += f"; none of {ranks_text(missing)} (ended before writing one, or wrote it on its own host)"
        found.append(Finding(text))
    for path, why in dumps.unreadable:
        found.append(Finding(f"{path.name} cannot be read: {why}"))
    reasons: dict[tuple[str, str], list[int]] = {}
    for dump in dumps.by_rank.values():
        first_line = dump.message.strip().splitlines()[0] if dump.message.strip() else ""
        reasons.setdefault((dump.reason, first_line), []).append(dump.rank)
    for (reason, message), which in sorted(reasons.items(), key=lambda item: min(item[1])):
        dumps_word = "its dump" if len(which) == 1 else "their dumps"
        text = f"{ranks_text(which)} wrote {dumps_word} on {reason or '?'}"
        found.append(Finding(f"{text}: {message}" if message else text))
    return found


def _first_failure(last_words: dict[int, dict]) -> list[Finding]:
    causes = [words for words in last_words.values() if not words.get("consequence")]
    if not causes:
        return []
    first = min(causes, key=lambda words: words.get("time") or 0.0)
    if len(causes) > 1 and len({words.get("error") for words in causes}) == 1:
        # every rank raised the same error (a mismatch): which of them exited first says nothing
        which = ranks_text(int(words.get("rank", -1)) for words in causes)
        return [
            Finding(
                f"{which} failed with the same error: {first.get('error')}",
                tuple(first.get("traceback") or ()),
            )
        ]
    text = f"rank {first.get('rank')} failed first, on host {first.get('host')}: {first.get('error')}"
    return [Finding(text, tuple(first.get("traceback") or ()))]


def _label(process_set: int) -> str:
    return "" if process_set == 0 else f" of process set {process_set}"


def _process_set(process_set: int, dumps: dict[int, Dump]) -> list[Finding]:
    ops = {rank: [op for op in dump.ops if op.process_set == process_set] for rank, dump in dumps.items()}
    found = _last_completed(process_set, ops)
    found += _behind(ops, dumps)
    found += _order(process_set, ops)
    found += _mismatches(ops)
    found += _failed(ops)
    return found


def _done(ops: list[Op]) -> list[Op]:
    return sorted((op for op in ops if op.state == "done"), key=lambda op: (op.done or 0.0, op.seq))


def _after_last(name: str, done: list[Op]) -> int | None:
    """How many operations `done` holds after its last one named `name` (None: it holds none so named)."""
    at = next((i for i in range(len(done) - 1, -1, -1) if done[i].name == name), None)
    return None if at is None else len(done) - 1 - at


def _last_common(ops: dict[int, list[Op]]) -> tuple[int, Op, list[int]] | None:
    """The last operation every member completed, the rank it was the last one of, and the ranks that
    completed later ones; None when a member completed none in its window.

    Each rank's last completed operation is a candidate; the one every rank also completed and after which
    the others completed the most is the furthest behind. Completion order (the same on every member) is
    trusted, not the hosts' clocks; only when the windows share no name do the clocks decide.
    """
    done = {rank: _done(listed) for rank, listed in ops.items()}
    if not all(done.values()):
        return None
    best: tuple[int, int, Op, list[int]] | None = None
    seen: set[str] = set()
    for rank in sorted(done):
        last = done[rank][-1]
        if last.name in seen:  # the same candidate as an earlier rank's: scan every rank once per name
            continue
        seen.add(last.name)
        after = {other: _after_last(last.name, listed) for other, listed in done.items()}
        if any(count is None for count in after.values()):
            continue
        ahead = sorted(other for other, count in after.items() if count)
        total = sum(count or 0 for count in after.values())
        if best is None or total > best[0]:
            best = (total, rank, last, ahead)
    if best is not None:
        return best[1], best[2], best[3]
    lasts = [(r, listed[-1]) for r, listed in done.items()]
    rank, op = min(lasts, key=lambda item: (item[1].done or 0.0, item[0]))
    return rank, op, sorted(r for r, listed in done.items() if (listed[-1].done or 0.0) > (op.done or 0.0))


def _last_completed(process_set: int, ops: dict[int, list[Op]]) -> list[Finding]:
    common = _last_common(ops)
    if common is None:
        none = [rank for rank, listed in ops.items() if not _done(listed)]
        text = f"{ranks_text(none)} completed no operation{_label(process_set)} in the recorded window"
        return [Finding(text)]
    rank, op, ahead = common
    text = f"the last operation all ranks{_label(process_set)} completed: {op.describe()} at {clock(op.done)}"
    if ahead:
        text += f" (its last on {ranks_text([rank])}; {ranks_text(ahead)} completed later ones)"
    return [Finding(text)]


def _behind(ops: dict[int, list[Op]], dumps: dict[int, Dump]) -> list[Finding]:
    """Ranks that have not submitted what others wait in (or waited in, until it was cancelled), and where
    they are instead."""
    pending = {rank: {op.name: op for op in listed if op.unfinished} for rank, listed in ops.items()}
    waited: dict[str, list[int]] = {}
    for rank, names in pending.items():
        for name in names:
            waited.setdefault(name, []).append(rank)
    lacking: dict[int, list[str]] = {}
    for name, waiting in waited.items():
        for rank in ops:
            if rank not in waiting:
                lacking.setdefault(rank, []).append(name)
    found: list[Finding] = []
    for rank in sorted(lacking):
        names = sorted(lacking[rank], key=lambda n: min(pending[r][n].submitted or 0.0 for r in waited[n]))
        first = names[0]
        example = pending[waited[first][0]][first]
        since = min(pending[r][first].submitted or 0.0 for r in waited[first])
        verb = "waited" if not example.pending else "waits" if len(waited[first]) == 1 else "wait"
        text = (
            f"rank {rank} is behind: {ranks_text(waited[first])} {verb} in {example.describe()} (submitted "
            f"at {clock(since)}), which rank {rank} has not submitted"
        )
        if len(names) > 1:
            text += f", nor {len(names) - 1} other operation(s) they submitted"
        mine = [pending[rank][n] for n in sorted(pending[rank], key=lambda n: pending[rank][n].seq)]
        own = sorted(ops[rank], key=lambda op: op.seq)
        if mine:
            shown = ", ".join(op.describe() for op in mine[:OPS_SHOWN])
            waits = "waits" if mine[0].pending else "waited"
            text += f"; it {waits} in {shown} instead, which the others have not submitted"
        elif own:
            text += f"; its last submission: {own[-1].describe()} ({own[-1].state})"
        frames = main_thread_frames(dumps[rank].stack)
        if frames:
            text += "; its main thread was in (innermost first):"
        found.append(Finding(text, tuple(frames)))
    return found


def _aligned(ops: dict[int, list[Op]]) -> dict[int, list[Op]]:
    """The completed operations every rank recorded, lined up from the newest back (the engine completes
    a process set's operations in the same order everywhere) while their names agree."""
    done = {rank: _done(listed) for rank, listed in ops.items()}
    depth = min((len(listed) for listed in done.values()), default=0)
    count = 0
    while count < depth and len({listed[-1 - count].name for listed in done.values()}) == 1:
        count += 1
    return {rank: listed[len(listed) - count :] for rank, listed in done.items()}


def _order(process_set: int, ops: dict[int, list[Op]]) -> list[Finding]:
    """Operations that two ranks submitted in a different order (each rank's submission counter against
    the order they completed in, and for those under way, by name)."""
    aligned = _aligned(ops)
    keys: dict[int, dict[tuple[str, int], int]] = {}  # rank -> (name, instance) -> seq
    for rank, listed in aligned.items():
        keys[rank] = {(op.name, index): op.seq for index, op in enumerate(listed)}
        width = len(listed)
        for op in ops[rank]:
            if op.pending:
                keys[rank][(op.name, width)] = op.seq
    common = set.intersection(*(set(k) for k in keys.values())) if keys else set()
    orders = {rank: sorted(common, key=lambda key, r=rank: keys[r][key]) for rank in keys}
    reference_rank = min(orders)
    reference = orders[reference_rank]
    for rank, order in sorted(orders.items()):
        if order == reference:
            continue
        at = next(i for i, (a, b) in enumerate(zip(order, reference)) if a != b)
        window = slice(at, at + OPS_SHOWN)
        mine = ", ".join(name for name, _ in order[window])
        theirs = ", ".join(name for name, _ in reference[window])
        return [
            Finding(
                f"ranks{_label(process_set)} submitted operations in a different order: rank "
                f"{reference_rank} submitted {theirs}; rank {rank} submitted {mine}"
            )
        ]
    return _cross_wait(process_set, ops)


def _cross_wait(process_set: int, ops: dict[int, list[Op]]) -> list[Finding]:
    """Ranks whose first unfinished operations differ: each waits in one the others have not submitted
    (operations submitted in another order by callers that wait for each, or different code paths)."""
    first = {
        rank: min(unfinished, key=lambda op: op.seq)
        for rank, listed in ops.items()
        if (unfinished := [op for op in listed if op.unfinished])
    }
    by_name: dict[str, list[int]] = {}
    for rank, op in first.items():
        by_name.setdefault(op.name, []).append(rank)
    if len(by_name) < 2:
        return []
    groups = sorted(by_name.values(), key=min)
    submitted = "; ".join(f"{ranks_text(which)} submitted {first[which[0]].describe()}" for which in groups)
    common = _last_common(ops)
    after = f"after {common[1].describe()}, the last operation all completed, " if common else ""
    return [
        Finding(
            f"ranks{_label(process_set)} submitted operations in a different order (or took different code "
            f"paths): {after}{submitted}; each waits for an operation the others have not submitted"
        )
    ]


_COMPARED = ("op", "dtype", "reduce", "process_set")


def _mismatches(ops: dict[int, list[Op]]) -> list[Finding]:
    """Names under way or failed whose operations differ between ranks (shape, dtype, op, reduction)."""
    latest: dict[str, dict[int, Op]] = {}
    for rank, listed in ops.items():
        for op in listed:
            if op.unfinished:
                latest.setdefault(op.name, {})[rank] = op
    found: list[Finding] = []
    for _, by_rank in sorted(latest.items()):
        if len(by_rank) < 2:
            continue
        for field_name in (*_COMPARED, "shape"):
            values: dict[str, list[int]] = {}
            for rank, op in by_rank.items():
                values.setdefault(_value(op, field_name), []).append(rank)
            if len(values) > 1:
                shown = ", ".join(f"{value} on {ranks_text(which)}" for value, which in values.items())
                example = next(iter(by_rank.values()))
                found.append(Finding(f"{example.describe()}: {field_name} {shown}"))
    return found


# Operations whose first dimension may differ between ranks (each rank contributes its own rows).
_OWN_ROWS = ("allgather", "alltoall")


def _value(op: Op, field_name: str) -> str:
    if field_name != "shape":
        return str(getattr(op, field_name))
    if op.shape is None:
        return "?"
    if op.op in _OWN_ROWS:
        return "[*, " + ", ".join(str(d) for d in op.shape[1:]) + "]"
    return "[" + ", ".join(str(d) for d in op.shape) + "]"


def _failed(ops: dict[int, list[Op]]) -> list[Finding]:
    errors: dict[tuple[str, str], list[int]] = {}
    for rank, listed in ops.items():
        for op in listed:
            if op.state == "failed" and op.error:
                errors.setdefault((op.describe(), op.error.strip().splitlines()[0]), []).append(rank)
    return [
        Finding(f"{what} failed on {ranks_text(which)}: {error}") for (what, error), which in errors.items()
    ]


def render(findings: list[Finding]) -> str:
    lines = []
    for finding in findings:
        lines.append(f"- {finding.text}")
        lines += [f"    {detail}" for detail in finding.details]
    return "\n".join(lines) + "\n"
