"""The framework-free Python face of hpcdl's compiled runtime."""

from __future__ import annotations

from hpcdl.common.basics import (
    add_process_set,
    cross_rank,
    cross_size,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_enabled,
    mpi_threads_supported,
    process_set_ids,
    process_set_rank,
    process_set_ranks,
    process_set_size,
    rank,
    remove_process_set,
    shutdown,
    size,
    tcp_congestion,
    transport_name,
)
from hpcdl.common.build import Capability, built
from hpcdl.common.exceptions import (
    HostsUpdatedInterrupt,
    HpcdlAuthError,
    HpcdlConfigError,
    HpcdlError,
    HpcdlIntegrityError,
    HpcdlInternalError,
    HpcdlJoinError,
    HpcdlMismatchError,
    HpcdlNotInitializedError,
    HpcdlShutdownError,
    HpcdlTimeoutError,
    HpcdlUnsupportedError,
    LibraryNotFoundError,
)
from hpcdl.common.ops import allgather, allreduce, alltoall, barrier, broadcast, reducescatter
from hpcdl.common.rendezvous import RendezvousServer, make_secret
from hpcdl.common.types import Buffer, DType, OpType, ReduceOp, dtype_of

__all__ = [
    "Buffer",
    "Capability",
    "DType",
    "HostsUpdatedInterrupt",
    "HpcdlAuthError",
    "HpcdlConfigError",
    "HpcdlError",
    "HpcdlIntegrityError",
    "HpcdlInternalError",
    "HpcdlJoinError",
    "HpcdlMismatchError",
    "HpcdlNotInitializedError",
    "HpcdlShutdownError",
    "HpcdlTimeoutError",
    "HpcdlUnsupportedError",
    "LibraryNotFoundError",
    "OpType",
    "ReduceOp",
    "RendezvousServer",
    "add_process_set",
    "allgather",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "built",
    "cross_rank",
    "cross_size",
    "dtype_of",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "make_secret",
    "mpi_enabled",
    "mpi_threads_supported",
    "process_set_ids",
    "process_set_rank",
    "process_set_ranks",
    "process_set_size",
    "rank",
    "reducescatter",
    "remove_process_set",
    "shutdown",
    "size",
    "tcp_congestion",
    "transport_name",
]

# The engine's asynchronous, named operations: every name engine.__all__ lists.
from hpcdl.common import engine as _engine
from hpcdl.common.engine import *  # noqa: F403

__all__ += _engine.__all__
