"""Horovod's ``ProcessSet`` for every framework API: a subset of ranks that runs collectives together.

A ``ProcessSet`` is created from a list of world ranks (or an mpi4py communicator) and becomes usable once
it is registered, either by ``init(process_sets=[...])`` or by ``add_process_set`` (dynamic mode). The
runtime owns the sets; this object only remembers the id the runtime gave it. Nothing here knows a
framework, so ``hpcdl.tensorflow`` (and any other framework API) shares one definition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from hpcdl.common import basics


class ProcessSet:
    """A set of world ranks that run collectives together; pass it as ``process_set=`` to any op.

    Note that ops like ``broadcast`` still take the root as a *global* rank, as in Horovod.
    """

    process_set_id: Optional[int] = None
    ranks: Optional[list[int]] = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        if _is_iterable(ranks_or_comm):
            ranks = sorted(ranks_or_comm)
            if any(not isinstance(r, int) for r in ranks):
                raise ValueError(
                    "ProcessSet should be initialized with a list of process ranks or an mpi4py Comm object"
                )
            self.ranks = ranks
        elif hasattr(ranks_or_comm, "Get_group") and hasattr(ranks_or_comm, "Get_size"):
            self.mpi_comm = ranks_or_comm
        else:
            raise ValueError(
                "ProcessSet should be initialized with a list of process ranks or an mpi4py Comm object"
            )

    def _invalidate(self) -> None:
        self.process_set_id = None

    def size(self) -> Optional[int]:
        """Number of ranks in the set, or None if the set is not registered."""
        if self.process_set_id is None:
            return None
        return basics.process_set_size(self.process_set_id)

    def rank(self) -> Optional[int]:
        """This process's rank within the set (-1 if not a member), or None if the set is not registered."""
        if self.process_set_id is None:
            return None
        return basics.process_set_rank(self.process_set_id)

    def included(self) -> Optional[bool]:
        """Whether this process belongs to the set, or None if the set's ranks are not known yet."""
        if self.ranks is None:
            return None
        return basics.rank() in self.ranks

    def __str__(self) -> str:
        return (
            f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"
        )

    __repr__ = __str__


def _is_iterable(x: Any) -> bool:
    try:
        iter(x)
    except TypeError:
        return False
    return not isinstance(x, (str, bytes))


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def comm_world_ranks(comm: Any) -> list[int]:
    """World ranks of an mpi4py communicator (translated through MPI_COMM_WORLD's group)."""
    from mpi4py import MPI

    group = comm.Get_group()
    world = MPI.COMM_WORLD.Get_group()
    return list(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world))


def ranks_of(process_set: ProcessSet) -> list[int]:
    """The world ranks of a set given by ranks or by an mpi4py communicator."""
    if process_set.ranks is not None:
        return list(process_set.ranks)
    return sorted(comm_world_ranks(process_set.mpi_comm))


def requested_world(comm: Any) -> Optional[list[int]]:
    """The world ranks a framework ``init(comm=...)`` asks for: None for all, else a list of ranks."""
    if comm is None:
        return None
    if hasattr(comm, "Get_group") and hasattr(comm, "Get_size"):
        return comm_world_ranks(comm)
    try:
        ranks = [int(r) for r in comm]
    except TypeError:
        raise ValueError(
            "Invalid type of argument comm. Expected list of rank integers or mpi4py.MPI.Comm object."
        ) from None
    return ranks or None


def check_world(requested: Optional[list[int]]) -> None:
    """Refuse an ``init(comm=<subset>)`` after the runtime started (and stop it again): hpcdl's world is
    always every rank the launcher started."""
    if requested is None or sorted(requested) == list(range(basics.size())):
        return
    world = basics.size()
    basics.shutdown()
    raise NotImplementedError(
        f"init(comm=...) names ranks {sorted(requested)}, but this job has {world} ranks and "
        "hpcdl's world is always all of them. Launch only the ranks you need, or keep them all and "
        "pass hvd.ProcessSet(ranks) as process_set= to the collectives."
    )


def init_argument(process_sets: Optional[Sequence[ProcessSet] | str]) -> tuple[list[ProcessSet], Any]:
    """Check a framework ``init``'s ``process_sets`` argument: (the sets to bind after init, what to pass
    to ``hpcdl.common.init``)."""
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(f'process_sets must be a list of ProcessSet or "dynamic", got {process_sets!r}')
        return [], "dynamic"
    sets = list(process_sets or [])
    for ps in sets:
        if not isinstance(ps, ProcessSet):
            raise ValueError(f"process_sets must contain hpcdl ProcessSet objects, got {ps!r}")
    return sets, [ranks_of(ps) for ps in sets] or None


def bind_registered(process_sets: Sequence[ProcessSet]) -> None:
    """After ``init``: give every ProcessSet object the id the runtime registered for its ranks.

    A second object with the same ranks as an earlier one is invalidated, as in Horovod.
    """
    by_ranks = {tuple(basics.process_set_ranks(i)): i for i in basics.process_set_ids()}
    seen = {0}
    for ps in process_sets:
        ranks = ranks_of(ps)
        ps.ranks = ranks
        ps.process_set_id = by_ranks.get(tuple(ranks))
        if ps.process_set_id is None or ps.process_set_id in seen:
            ps._invalidate()
        else:
            seen.add(ps.process_set_id)
    global_process_set.ranks = list(basics.process_set_ranks(0))


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a new process set after ``init`` (needs ``init(process_sets="dynamic")`` or
    ``HPCDL_DYNAMIC_PROCESS_SETS=1``); every rank of the world must call it. Returns the set."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise NotImplementedError(
            "Dynamically adding process sets defined by an MPI communicator is not implemented. "
            "Please build the process set via a list of ranks."
        )
    if process_set.process_set_id is not None:
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    process_set.process_set_id = basics.add_process_set(process_set.ranks)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a dynamic process set (collective over the world); False for the global or an
    unregistered set."""
    process_set_id = process_set.process_set_id
    if process_set_id is None or process_set_id == 0:
        return False
    process_set._invalidate()
    basics.remove_process_set(process_set_id)
    return True


def id_of(process_set: ProcessSet) -> int:
    """The runtime id of a set an op was asked to run on; a clear error for unusable sets."""
    if not isinstance(process_set, ProcessSet):
        raise ValueError(
            f"process_set must be an hpcdl ProcessSet (e.g. hvd.global_process_set), got {process_set!r}"
        )
    if process_set.process_set_id is None:
        raise ValueError(
            f"{process_set} is not registered: pass it to hvd.init(process_sets=[...]) or "
            "hvd.add_process_set() first (a removed set cannot be used any more)"
        )
    return process_set.process_set_id
