"""The names of unnamed collectives in a graph, and the check that the ranks created the same ones.

Eagerly an unnamed operation is named by the engine's deterministic counter. In a graph, Horovod names it
after its tensor, whose name comes from counters of every op the graph holds, so ranks whose graphs differ
anywhere before it (a rank-dependent branch, one more ``tf.gradients`` call) disagree. hpcdl names it by
its position among the unnamed collectives on its process set of its outermost graph
(``<graph>.collective_<k>``, ``<graph>.set<id>.collective_<k>`` on process set ``id``). ``<graph>`` is
``graph`` both for a TensorFlow 1 graph and for TensorFlow 2's ``tf.function`` graphs, which all count in
the program's one outer graph, in the order they are traced: names agree whenever the ranks create the
same unnamed collectives in the same order, whatever else their graphs hold.

When they do not (a collective that only some ranks create), names cannot be matched: one created after
the shared ones would wait for the engine's deadline, one before them would shift their names. So before
the first execution of a graph's unnamed collectives on a process set (and again after the graph gained
some, as a TensorFlow 1 graph may between runs), its members exchange how many each created, in one small
allreduce (one int64 per member, which a joined member takes part in with zeros), and when the counts
differ every member fails at once, before submitting any of them, with a message that says to name them.
The check waits only for the members to start that execution (every member that runs the graph does), with
the engine's deadline; a slow member delays it and is never mistaken for a missing one. Its cost is one
exchange per graph and process set, not per step. What it cannot tell apart: a rank that created an
unnamed collective it never runs fails as well; pass ``name=`` to such collectives. A collective that every
rank creates but only some run (a ``tf.cond`` branch that only some ranks take) fails at the engine's
deadline, naming the ranks that did not submit it and the collective, and saying to name it.
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from hpcdl.common import basics, engine
from hpcdl.common.exceptions import HpcdlMismatchError
from hpcdl.common.types import ReduceOp

AUTO = ".collective_"


def is_auto(name: str) -> bool:
    """Whether ``name`` was given by :func:`auto_name`."""
    return AUTO in name


def _outermost(graph: Any) -> Any:
    while isinstance(getattr(graph, "outer_graph", None), tf.Graph):
        graph = graph.outer_graph
    return graph


def _label(graph: Any) -> str:
    """A graph's name as the ranks agree on it: a tf.function's Python name, ``graph`` for a TensorFlow 1
    graph."""
    if not hasattr(graph, "outer_graph"):
        return "graph"
    return re.sub(r"_\d+$", "", re.sub("[^a-zA-Z0-9_]", "_", graph.name))


class Census:
    """The unnamed collectives of one graph on one process set: how many this rank created, and whether
    every member created as many (:meth:`check`)."""

    def __init__(self, label: str, process_set: int) -> None:
        self.label = label
        self.prefix = label if process_set == 0 else f"{label}.set{process_set}"
        self.process_set = process_set
        self.created = 0
        self._agreed = 0
        self._failed: Optional[tuple[int, HpcdlMismatchError]] = None

    def name(self) -> str:
        """The name of the next unnamed collective created in the graph on the set."""
        name = f"{self.prefix}{AUTO}{self.created}"
        self.created += 1
        return name

    def check(self) -> None:
        """Return once every member of the set created as many unnamed collectives in the graph as this
        rank (exchanged the first time, and again after the graph gained some); else raise
        :class:`HpcdlMismatchError` (every member does). Called by every submitting op of such a
        collective before it submits."""
        if self._agreed == self.created:
            return
        with _lock_of(self.prefix):  # one exchange at a time per name, whatever the graph
            count = self.created
            if self._agreed == count:
                return
            if self._failed is not None and self._failed[0] == count:
                raise self._failed[1]
            counts = self._exchange(count)
            members = basics.process_set_ranks(self.process_set)
            taken = {rank: int(n) - 1 for rank, n in zip(members, counts) if n > 0}  # 0: a joined member
            if len(set(taken.values())) <= 1:
                self._agreed = count
                return
            error = HpcdlMismatchError(self._disagreement(taken))
            self._failed = (count, error)
            raise error

    def _disagreement(self, taken: dict[int, int]) -> str:
        """What went wrong, given each member's count: the counts, and which ranks alone created the
        collectives the others lack (their names, the first few)."""
        where = f"graph {self.label!r}" + (f" on process set {self.process_set}" if self.process_set else "")
        fewest = min(taken.values())
        extra = []
        for k in range(fewest, min(max(taken.values()), fewest + 4)):
            ranks = [str(rank) for rank, n in sorted(taken.items()) if n > k]
            extra.append(f"{self.prefix}{AUTO}{k} (only on rank{'s' * (len(ranks) > 1)} {', '.join(ranks)})")
        return (
            f"the ranks created different numbers of unnamed collectives in {where} ("
            + ", ".join(f"rank {rank}: {n}" for rank, n in sorted(taken.items()))
            + f"): {', '.join(extra)}{', ...' if max(taken.values()) - fewest > 4 else ''}; none of them ran"
        )

    def _exchange(self, count: int) -> np.ndarray:
        """Every member's count + 1 (0 for a joined member), in set order, with the engine's deadline."""
        counts = np.zeros(basics.process_set_size(self.process_set), dtype=np.int64)
        counts[basics.process_set_rank(self.process_set)] = count + 1
        handle = engine.allreduce_async(
            counts, name=f"{self.prefix}.census", op=ReduceOp.SUM, process_set=self.process_set
        )
        try:
            handle.wait()
            return handle.result()
        finally:
            handle.release()


_CENSUSES: weakref.WeakKeyDictionary[Any, dict[int, Census]] = weakref.WeakKeyDictionary()
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def _lock_of(prefix: str) -> threading.Lock:
    with _LOCKS_LOCK:
        return _LOCKS.setdefault(prefix, threading.Lock())


def census(process_set: int) -> Census:
    """The census of the current graph's outermost graph on ``process_set``."""
    graph = _outermost(tf.compat.v1.get_default_graph())
    by_set = _CENSUSES.setdefault(graph, {})
    if process_set not in by_set:
        by_set[process_set] = Census(_label(graph), process_set)
    return by_set[process_set]


def auto_name(process_set: int) -> str:
    """The name of the next unnamed collective on ``process_set`` in the current graph."""
    return census(process_set).name()
