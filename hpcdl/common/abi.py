"""The C ABI of hpcdl's compiled runtime as Python binds it: every function's signature, every enum and
constant of ``collectives/include/hpcdl/c_api.h``, in this one place.

:func:`hpcdl.common.library.load` declares every function from :data:`FUNCTIONS`; ``_hotpath`` (C, compiled
against c_api.h) calls the functions of :data:`HOTPATH` through the addresses the loaded library gives;
:mod:`hpcdl.common.types` and :mod:`hpcdl.common.exceptions` take their enums from here.
``tests/unit/test_abi.py`` parses c_api.h and fails when a function, an argument, a field of the request or
an enum value here differs from it: a drift would otherwise corrupt memory instead of failing to import.
"""

from __future__ import annotations

import ctypes
from enum import IntEnum
from typing import Any

VERSION = 3  # HPCDL_ABI_VERSION


class Status(IntEnum):
    """hpcdl_status: what every function returns (``PENDING``: hpcdl_poll, not finished yet)."""

    OK = 0
    ERR_INVALID = 1
    ERR_NOT_INITIALIZED = 2
    ERR_TIMEOUT = 3
    ERR_PEER_LOST = 4
    ERR_MISMATCH = 5
    ERR_AUTH = 6
    ERR_UNSUPPORTED = 7
    ERR_SHUTDOWN = 8
    ERR_INTERNAL = 9
    PENDING = 10
    ERR_JOINED = 11


class DType(IntEnum):
    """hpcdl_dtype."""

    UINT8 = 0
    INT8 = 1
    INT16 = 2
    INT32 = 3
    INT64 = 4
    FLOAT16 = 5
    BFLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BOOL = 9

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]


_ITEMSIZE = {
    DType.UINT8: 1,
    DType.INT8: 1,
    DType.INT16: 2,
    DType.INT32: 4,
    DType.INT64: 8,
    DType.FLOAT16: 2,
    DType.BFLOAT16: 2,
    DType.FLOAT32: 4,
    DType.FLOAT64: 8,
    DType.BOOL: 1,
}


class ReduceOp(IntEnum):
    """hpcdl_reduce_op."""

    SUM = 0
    AVERAGE = 1
    MIN = 2
    MAX = 3
    PRODUCT = 4


class OpType(IntEnum):
    """hpcdl_op_type."""

    ALLREDUCE = 0
    ALLGATHER = 1
    BROADCAST = 2
    ALLTOALL = 3
    REDUCESCATTER = 4
    BARRIER = 5
    JOIN = 6


class Placement(IntEnum):
    """hpcdl_placement: where an engine operation's data lives: HOST, moved by the engine's data plane;
    DEVICE, moved by the caller's executor from the batches the engine hands over (hpcdl_device_next)."""

    HOST = 0
    DEVICE = 1


# Each enum of c_api.h: its Python class and the prefix its C names add to the member names.
ENUMS: dict[str, tuple[type[IntEnum], str]] = {
    "hpcdl_status": (Status, "HPCDL_"),
    "hpcdl_dtype": (DType, "HPCDL_"),
    "hpcdl_reduce_op": (ReduceOp, "HPCDL_"),
    "hpcdl_op_type": (OpType, "HPCDL_OP_"),
    "hpcdl_placement": (Placement, "HPCDL_PLACEMENT_"),
}

# The device executor's batches (hpcdl_device_next): header flags and length.
DEVICE_FUSED = 1
DEVICE_TIMED = 2
DEVICE_HEADER_WORDS = 13

# The #defines of c_api.h.
DEFINES = {
    "HPCDL_ABI_VERSION": VERSION,
    "HPCDL_DEVICE_FUSED": DEVICE_FUSED,
    "HPCDL_DEVICE_TIMED": DEVICE_TIMED,
    "HPCDL_DEVICE_HEADER_WORDS": DEVICE_HEADER_WORDS,
}

_c = ctypes
_i32p = _c.POINTER(_c.c_int32)
_i64p = _c.POINTER(_c.c_int64)


class Request(ctypes.Structure):
    """hpcdl_request: one operation submitted to the engine (hpcdl_enqueue)."""

    _fields_ = [
        ("op_type", _c.c_int32),
        ("name", _c.c_char_p),
        ("process_set", _c.c_int32),
        ("dtype", _c.c_int32),
        ("ndim", _c.c_int32),
        ("shape", _i64p),
        ("input", _c.c_void_p),
        ("output", _c.c_void_p),
        ("reduce_op", _c.c_int32),
        ("prescale", _c.c_double),
        ("postscale", _c.c_double),
        ("root", _c.c_int32),
        ("splits", _i64p),
        ("nsplits", _c.c_int32),
        ("group_id", _c.c_int32),
        ("group_size", _c.c_int32),
        ("placement", _c.c_int32),
        ("tag", _c.c_int64),
    ]


# Every function: (return type, argument types), in the order of c_api.h.
FUNCTIONS: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "hpcdl_abi_version": (_c.c_int, ()),
    "hpcdl_last_error": (_c.c_char_p, ()),
    "hpcdl_build_info": (_c.c_char_p, ()),
    "hpcdl_init": (_c.c_int, (_c.c_char_p,)),
    "hpcdl_shutdown": (_c.c_int, ()),
    "hpcdl_is_initialized": (_c.c_int, ()),
    "hpcdl_rank": (_c.c_int, ()),
    "hpcdl_size": (_c.c_int, ()),
    "hpcdl_local_rank": (_c.c_int, ()),
    "hpcdl_local_size": (_c.c_int, ()),
    "hpcdl_cross_rank": (_c.c_int, ()),
    "hpcdl_cross_size": (_c.c_int, ()),
    "hpcdl_is_homogeneous": (_c.c_int, ()),
    "hpcdl_transport_name": (_c.c_char_p, (_c.c_int,)),
    "hpcdl_tcp_congestion": (_c.c_char_p, ()),
    "hpcdl_mpi_enabled": (_c.c_int, ()),
    "hpcdl_mpi_threads_supported": (_c.c_int, ()),
    "hpcdl_rendezvous_server_start": (_c.c_int64, (_c.c_char_p, _c.c_int, _c.c_char_p, _c.c_int)),
    "hpcdl_rendezvous_server_port": (_c.c_int, (_c.c_int64,)),
    "hpcdl_rendezvous_server_arrived": (_c.c_int, (_c.c_int64, _i32p, _c.c_int)),
    "hpcdl_rendezvous_server_stop": (_c.c_int, (_c.c_int64,)),
    "hpcdl_object_key": (_c.c_int, (_c.POINTER(_c.c_uint8),)),
    "hpcdl_object_sequence": (_c.c_int64, (_c.c_int, _c.c_char_p)),
    "hpcdl_allreduce": (
        _c.c_int,
        (_c.c_void_p, _c.c_void_p, _c.c_int64, _c.c_int, _c.c_int, _c.c_double, _c.c_double, _c.c_int),
    ),
    "hpcdl_allgather": (_c.c_int, (_c.c_void_p, _c.c_int64, _c.c_void_p, _i64p, _c.c_int, _c.c_int)),
    "hpcdl_broadcast": (_c.c_int, (_c.c_void_p, _c.c_int64, _c.c_int, _c.c_int, _c.c_int)),
    "hpcdl_alltoall": (_c.c_int, (_c.c_void_p, _i64p, _c.c_void_p, _i64p, _c.c_int, _c.c_int)),
    "hpcdl_reducescatter": (
        _c.c_int,
        (_c.c_void_p, _c.c_void_p, _i64p, _c.c_int, _c.c_int, _c.c_double, _c.c_double, _c.c_int),
    ),
    "hpcdl_barrier": (_c.c_int, (_c.c_int,)),
    "hpcdl_add_process_set": (_c.c_int, (_i32p, _c.c_int)),
    "hpcdl_remove_process_set": (_c.c_int, (_c.c_int,)),
    "hpcdl_process_set_rank": (_c.c_int, (_c.c_int,)),
    "hpcdl_process_set_size": (_c.c_int, (_c.c_int,)),
    "hpcdl_process_set_ranks": (_c.c_int, (_c.c_int, _i32p, _c.c_int)),
    "hpcdl_process_set_ids": (_c.c_int, (_i32p, _c.c_int)),
    "hpcdl_enqueue": (_c.c_int64, (_c.POINTER(Request),)),
    "hpcdl_poll": (_c.c_int, (_c.c_int64,)),
    "hpcdl_wait": (_c.c_int, (_c.c_int64, _c.c_double)),
    "hpcdl_run": (_c.c_int, (_c.POINTER(Request), _c.c_double, _i64p)),
    "hpcdl_output": (_c.c_int, (_c.c_int64, _c.POINTER(_c.c_void_p), _i64p, _i64p)),
    "hpcdl_received_splits": (_c.c_int, (_c.c_int64, _i64p, _c.c_int)),
    "hpcdl_join_result": (_c.c_int, (_c.c_int64,)),
    "hpcdl_release": (_c.c_int, (_c.c_int64,)),
    "hpcdl_new_group_id": (_c.c_int, (_c.c_int,)),
    "hpcdl_device_next": (_c.c_int, (_c.c_double, _i64p, _c.c_int)),
    "hpcdl_device_done": (_c.c_int, (_c.c_int64, _c.c_int, _c.c_char_p, _i64p)),
    "hpcdl_device_interrupt": (_c.c_int, ()),
    "hpcdl_start_timeline": (_c.c_int, (_c.c_char_p, _c.c_int)),
    "hpcdl_stop_timeline": (_c.c_int, ()),
    "hpcdl_get_knob": (_c.c_double, (_c.c_char_p,)),
    "hpcdl_flight_dump": (_c.c_int, (_c.c_char_p, _c.c_char_p)),
}

# What _hotpath calls, by address, in this order (see hpcdl/common/_hotpath.c: bind()).
HOTPATH = (
    "hpcdl_enqueue",
    "hpcdl_wait",
    "hpcdl_poll",
    "hpcdl_release",
    "hpcdl_allreduce",
    "hpcdl_run",
    "hpcdl_output",
    "hpcdl_received_splits",
)


def declare(lib: ctypes.CDLL) -> None:
    """Give every function of the loaded runtime its ctypes signature."""
    for name, (restype, argtypes) in FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = list(argtypes)


def addresses(lib: ctypes.CDLL, names: tuple[str, ...]) -> list[int]:
    """The addresses of these functions in the loaded runtime (for a C caller that binds them)."""
    return [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0 for name in names]
