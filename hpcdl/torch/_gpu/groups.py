"""The ``torch.distributed`` process groups that move the GPU path's data: NCCL, or gloo standing in for it
(``HPCDL_GPU_OPERATIONS=gloo-standin``).

At ``init()`` world rank 0 opens a ``TCPStore``; its address reaches the other ranks through hpcdl's own
broadcast. A process set gets one group per lane (``--num-nccl-streams``), created when the set's first
batch runs on that lane: every member's executor reaches that batch in the same order, so the groups meet.
The engine holds the deadlines: the groups' own timeouts are set well past them, so that an overdue
collective is failed (and the groups aborted) with the engine's message, naming the tensor and the ranks,
before NCCL's watchdog or gloo gives up on its own.
"""

from __future__ import annotations

import contextlib
import socket
from datetime import timedelta
from typing import Any

import numpy as np
import torch.distributed as dist

from hpcdl import common

_ADDRESS_BYTES = 256


def backend_timeout(engine_timeout_s: float) -> timedelta:
    """The process groups' timeout: past the engine's deadline, which must fire first."""
    return timedelta(seconds=2 * engine_timeout_s + 30)


def _open_store(timeout: timedelta) -> Any:
    """Collective over the world: rank 0's TCPStore, reached by every rank."""
    address = np.zeros(_ADDRESS_BYTES, dtype=np.uint8)
    store = None
    if common.rank() == 0:
        # The store listens on every interface; the others resolve rank 0's fully qualified name (which,
        # unlike gethostbyname(gethostname()) on Debian, is not a loopback alias).
        host = socket.getfqdn()
        store = dist.TCPStore(host, 0, common.size(), True, timeout=timeout, wait_for_workers=False)
        text = f"{host}:{store.port}".encode()
        address[: len(text)] = np.frombuffer(text, dtype=np.uint8)
    common.broadcast(address, root=0)
    if store is None:
        host, port = bytes(address).rstrip(b"\0").decode().rsplit(":", 1)
        store = dist.TCPStore(host, int(port), common.size(), False, timeout=timeout)
    # Every rank has connected before any returns: rank 0 may otherwise shut the job down (and the store
    # with it) before a slower rank reached it.
    common.barrier()
    return store


class Groups:
    """The process groups of one job, by (process set, lane). Used by the executor's launcher thread only
    (``abort`` and ``close`` from whoever stops it)."""

    def __init__(self, backend: str, store: Any, timeout: timedelta) -> None:
        self.backend = backend  # "nccl" or "gloo"
        self._store = store
        self._timeout = timeout
        self._groups: dict[tuple[int, int], Any] = {}

    @staticmethod
    def open(backend: str, engine_timeout_s: float) -> Groups:
        """Collective over the world (``init()``)."""
        timeout = backend_timeout(engine_timeout_s)
        return Groups(backend, _open_store(timeout), timeout)

    def get(self, process_set: int, lane: int) -> Any:
        group = self._groups.get((process_set, lane))
        if group is None:
            store = dist.PrefixStore(f"hpcdl/set{process_set}/lane{lane}", self._store)
            rank, size = common.process_set_rank(process_set), common.process_set_size(process_set)
            group = self._new(store, rank, size)
            self._groups[(process_set, lane)] = group
        return group

    def _new(self, store: Any, rank: int, size: int) -> Any:
        if self.backend == "gloo":
            return dist.ProcessGroupGloo(store, rank, size, self._timeout)
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = self._timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)

    def abort(self) -> None:
        """Abort every group: NCCL ends the kernels still waiting for a peer (their works fail), so that the
        GPU and the executor's threads are free again. Gloo has nothing to end: a gloo collective waits
        for its own timeout; the engine has failed its operations already."""
        for group in self._groups.values():
            with contextlib.suppress(RuntimeError, AttributeError):  # already aborted, or no abort here
                group.abort()
        self._groups.clear()

    def close(self) -> None:
        """Shut the groups down after their last collective (``shutdown()``)."""
        for group in self._groups.values():
            with contextlib.suppress(RuntimeError, AttributeError):  # never ran anything, or no shutdown
                group.shutdown()
        self._groups.clear()
        self._store = None
