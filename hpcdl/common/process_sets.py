"""Horovod's ``ProcessSet`` and ``init(comm, process_sets)`` for every framework API.

A ``ProcessSet`` is created from a list of ranks (or an mpi4py communicator) and becomes usable once it is
registered, either by ``init(process_sets=[...])`` or by ``add_process_set`` (dynamic mode). The runtime
owns the sets; this object only remembers the id the runtime gave it. Nothing here knows a framework:
``hpcdl.torch`` and ``hpcdl.tensorflow`` (and ``hpcdl.keras`` through them) share these very objects, as
Horovod's framework APIs share ``horovod.common.process_sets``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Optional, Union

from hpcdl.common import basics
from hpcdl.common.exceptions import HpcdlConfigError

_NOT_RANKS = "ProcessSet should be initialized with a list of process ranks or an mpi4py Comm object"


class ProcessSet:
    """A set of ranks that run collectives together; pass it as ``process_set=`` to any op.

    Note that ops like ``broadcast`` still take the root as a *global* rank, as in Horovod.
    """

    process_set_id: Optional[int] = None
    ranks: Optional[list[int]] = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        if _is_iterable(ranks_or_comm):
            ranks = sorted(ranks_or_comm)
            if any(not isinstance(r, int) for r in ranks):
                raise ValueError(_NOT_RANKS)
            self.ranks = ranks
        elif _is_communicator(ranks_or_comm):
            self.mpi_comm = ranks_or_comm
        else:
            raise ValueError(_NOT_RANKS)

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


def _is_communicator(x: Any) -> bool:
    return hasattr(x, "Get_group") and hasattr(x, "Get_size")


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def comm_world_ranks(comm: Any) -> list[int]:
    """World ranks of an mpi4py communicator (translated through MPI_COMM_WORLD's group), in the
    communicator's order."""
    from mpi4py import MPI

    group = comm.Get_group()
    world = MPI.COMM_WORLD.Get_group()
    return list(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world))


def ranks_of(process_set: ProcessSet) -> list[int]:
    """The ranks of a set given by ranks or by an mpi4py communicator."""
    if process_set.ranks is not None:
        return list(process_set.ranks)
    return sorted(comm_world_ranks(process_set.mpi_comm))


def job_members(comm: Union[Sequence[int], Any, None]) -> Optional[list[int]]:
    """The world ranks a framework's ``init(comm=...)`` makes a job of, in their order in the job: None
    (every rank the launcher started) for ``comm=None`` or an empty list."""
    if comm is None:
        return None
    if _is_communicator(comm):
        return comm_world_ranks(comm)
    try:
        ranks = [operator.index(r) for r in comm]
    except TypeError:
        raise HpcdlConfigError(
            "Invalid type of argument comm. Expected list of rank integers or mpi4py.MPI.Comm object."
        ) from None
    return ranks or None


def init(
    comm: Union[Sequence[int], Any, None] = None,
    process_sets: Union[Sequence[ProcessSet], str, None] = None,
) -> None:
    """Horovod's ``hvd.init()`` for every framework API: find the other ranks, connect, start the
    background engine. A second call is a no-op.

    Args:
        comm: None (the job is every rank the launcher started), or a list of world ranks or an mpi4py
            communicator: as in Horovod, the job is then those ranks only, ``rank()`` being this
            process's position among them (a process outside the list must pass the list of its own job).
            Every process the launcher started calls ``init``: they all meet once before splitting.
        process_sets: None, a list of ``ProcessSet`` to register now (every rank passes the same list),
            or ``"dynamic"`` to allow ``add_process_set``/``remove_process_set`` later.
    """
    if basics.is_initialized():
        return
    members = job_members(comm)
    sets: list[ProcessSet] = []
    ranks: list[list[int]] = []
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise HpcdlConfigError(
                f'process_sets must be a list of ProcessSet or "dynamic", got {process_sets!r}'
            )
        basics.init(process_sets="dynamic", members=members)
    else:
        sets = list(process_sets or [])
        for ps in sets:
            if not isinstance(ps, ProcessSet):
                raise HpcdlConfigError(f"process_sets must contain hpcdl ProcessSet objects, got {ps!r}")
        ranks = [ranks_of(ps) for ps in sets]
        basics.init(process_sets=ranks or None, members=members)
    _bind_registered(sets, ranks)


def _bind_registered(process_sets: Sequence[ProcessSet], ranks: Sequence[list[int]]) -> None:
    """After ``init``: give every ProcessSet object the id the runtime registered for its ranks.

    A second object with the same ranks as an earlier one is invalidated, as in Horovod.
    """
    by_ranks = {tuple(basics.process_set_ranks(i)): i for i in basics.process_set_ids()}
    seen = {0}
    for ps, its_ranks in zip(process_sets, ranks):
        ps.ranks = its_ranks
        ps.process_set_id = by_ranks.get(tuple(its_ranks))
        if ps.process_set_id is None or ps.process_set_id in seen:
            ps._invalidate()
        else:
            seen.add(ps.process_set_id)
    global_process_set.ranks = list(basics.process_set_ranks(0))


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a new process set after ``init`` (needs ``init(process_sets="dynamic")`` or
    ``HPCDL_DYNAMIC_PROCESS_SETS=1``); every rank of the job must call it. Returns the set."""
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
    """Unregister a dynamic process set (collective over the job); False for the global or an
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
