"""Direct collectives on NumPy arrays: blocking, on the caller's thread, no negotiation.

Every rank of the process set must call the same collectives in the same order with matching arguments;
the runtime checks that and raises :class:`HpcdlMismatchError` on every rank when they disagree. Ops on
bfloat16 data take a uint16 array and ``dtype=DType.BFLOAT16``.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np

from hpcdl.common import _hotpath, basics, library
from hpcdl.common.exceptions import HpcdlConfigError, HpcdlMismatchError
from hpcdl.common.memory import result_array, result_like
from hpcdl.common.types import DType, ReduceOp, dtype_of

_I64 = ctypes.POINTER(ctypes.c_int64)


_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


def _ptr(a: np.ndarray) -> int:
    """Address of an array's data (the fast path matters: small collectives take microseconds)."""
    if a.nbytes == 0:
        return 0
    try:
        return _addressof(_from_buffer(a))
    except (TypeError, ValueError):  # read-only arrays
        return int(a.ctypes.data)


def _contiguous(a: np.ndarray, what: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what} takes a numpy.ndarray, got {type(a).__name__}")
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _resolve_dtype(a: np.ndarray, dtype: Optional[DType]) -> DType:
    if dtype is None:
        return dtype_of(a)
    dtype = DType(dtype)
    if dtype.itemsize != a.dtype.itemsize:
        raise HpcdlConfigError(
            f"dtype {dtype.name} does not fit arrays of {a.dtype} ({a.dtype.itemsize} bytes)"
        )
    return dtype


def reducescatter_rows(rows: int, size: int, rank: int) -> int:
    """Rows of dim 0 that member `rank` of `size` gets from reducescatter (Horovod's split: the first
    ``rows % size`` members get one extra row)."""
    return rows // size + (1 if rank < rows % size else 0)


def _set_size(process_set: int) -> tuple[int, int]:
    """(size, my rank) of a process set."""
    if process_set == 0:
        return basics.size(), basics.rank()
    return basics.process_set_size(process_set), basics.process_set_rank(process_set)


def _counts(values: list[int]) -> ctypes.Array:
    return (ctypes.c_int64 * max(len(values), 1))(*values)


def allreduce(
    a: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    prescale: float = 1.0,
    postscale: float = 1.0,
    out: Optional[np.ndarray] = None,
    process_set: int = 0,
    dtype: Optional[DType] = None,
) -> np.ndarray:
    """Reduce ``a`` across the ranks; ``out=a`` reduces in place. Returns the result."""
    # Fast path (small allreduces take microseconds): one C call for an in-place allreduce of a writeable
    # C-contiguous array of a dtype the runtime has (bound by init); None for anything else.
    if out is a and dtype is None and _hotpath.allreduce_now(a, op, prescale, postscale, process_set):
        return a
    if out is a and isinstance(a, np.ndarray) and a.size and not (a.flags.writeable and a.flags.c_contiguous):
        raise HpcdlConfigError("allreduce in place needs a writeable C-contiguous array")
    src = _contiguous(a, "allreduce")
    kind = _resolve_dtype(src, dtype)
    if out is None:
        out = result_like(src)
    elif out is not a:
        if out.shape != src.shape or out.dtype != src.dtype or not out.flags.c_contiguous:
            raise HpcdlConfigError("allreduce: out must be a C-contiguous array of the input's shape, dtype")
    elif src is not a:
        raise HpcdlConfigError("allreduce in place needs a C-contiguous array")
    lib = library.load()
    src_ptr = _ptr(src)
    code = lib.hpcdl_allreduce(
        src_ptr, src_ptr if out is src else _ptr(out), src.size, kind, op, prescale, postscale, process_set
    )
    if code:
        library.check(code)
    return out


def _exchange_shapes(
    a: np.ndarray, size: int, process_set: int, what: str
) -> Optional[list[tuple[int, ...]]]:
    """Every rank's shape (first dimension may differ) of a process set of ``size``, checking ranks agree on
    the trailing ones; None when every rank's shape is this one's (the usual case, told apart from the raw
    rows without building them)."""
    if a.ndim > 8:
        raise HpcdlConfigError(f"{what}: arrays of more than 8 dimensions are not supported")
    mine = np.zeros(9, dtype=np.int64)
    mine[0] = a.ndim
    mine[1 : 1 + a.ndim] = a.shape
    everyone = np.empty(9 * size, dtype=np.int64)
    library.check(
        library.load().hpcdl_allgather(_ptr(mine), 9, _ptr(everyone), None, int(DType.INT64), process_set)
    )
    if a.ndim and everyone.tobytes() == mine.tobytes() * size:
        return None
    shapes = [tuple(int(x) for x in row[1 : 1 + int(row[0])]) for row in everyone.reshape(size, 9)]
    trailing = {s[1:] for s in shapes}
    if len(trailing) > 1 or any(len(s) == 0 for s in shapes):
        described = "; ".join(f"rank {i}: {s}" for i, s in enumerate(shapes))
        raise HpcdlMismatchError(
            f"{what}: ranks passed arrays whose shapes differ beyond the first dimension ({described}); "
            "only the first dimension may differ (and scalars cannot be gathered: reshape to (1,))"
        )
    return shapes


def allgather(a: np.ndarray, process_set: int = 0, dtype: Optional[DType] = None) -> np.ndarray:
    """Concatenate every rank's ``a`` along the first dimension (which may differ per rank)."""
    src = _contiguous(a, "allgather")
    kind = _resolve_dtype(src, dtype)
    size, _ = _set_size(process_set)
    shapes = _exchange_shapes(src, size, process_set, "allgather")
    if shapes is None:  # every rank's shape is this one's
        counts = None
        out = result_array((size * src.shape[0], *src.shape[1:]), src.dtype)
    else:
        row = int(np.prod(src.shape[1:], dtype=np.int64))
        counts = _counts([s[0] * row for s in shapes])
        out = result_array((sum(s[0] for s in shapes), *src.shape[1:]), src.dtype)
    code = library.load().hpcdl_allgather(_ptr(src), src.size, _ptr(out), counts, int(kind), process_set)
    library.check(code)
    return out


def broadcast(
    a: np.ndarray, root: int = 0, process_set: int = 0, dtype: Optional[DType] = None
) -> np.ndarray:
    """Overwrite ``a`` on every rank with root's ``a`` (root is a rank of the process set); returns ``a``."""
    if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or not a.flags.writeable:
        raise HpcdlConfigError("broadcast works in place: pass a writeable C-contiguous numpy array")
    kind = _resolve_dtype(a, dtype)
    library.check(library.load().hpcdl_broadcast(_ptr(a), a.size, int(kind), int(root), process_set))
    return a


def alltoall(
    a: np.ndarray, splits: Optional[list[int]] = None, process_set: int = 0, dtype: Optional[DType] = None
) -> tuple[np.ndarray, list[int]]:
    """Send ``splits[i]`` rows of ``a`` (first dim) to rank i; returns (received rows, splits received)."""
    src = _contiguous(a, "alltoall")
    kind = _resolve_dtype(src, dtype)
    size, _ = _set_size(process_set)
    rows = src.shape[0] if src.ndim else 1
    if splits is None:
        if rows % size:
            raise HpcdlConfigError(
                f"alltoall: {rows} rows cannot be split evenly over {size} ranks; pass splits explicitly"
            )
        splits = [rows // size] * size
    splits = [int(s) for s in splits]
    if len(splits) != size or any(s < 0 for s in splits) or sum(splits) != rows:
        raise HpcdlConfigError(
            f"alltoall: splits {splits} must have one non-negative entry per rank ({size}) summing to the "
            f"first dimension ({rows})"
        )
    lib = library.load()
    received = np.empty(size, dtype=np.int64)
    ones = _counts([1] * size)
    library.check(
        lib.hpcdl_alltoall(
            _ptr(np.asarray(splits, dtype=np.int64)),
            ones,
            _ptr(received),
            ones,
            int(DType.INT64),
            process_set,
        )
    )
    got = [int(x) for x in received]
    row = int(np.prod(src.shape[1:], dtype=np.int64)) if src.ndim else 1
    out = result_array((sum(got), *src.shape[1:]), src.dtype)
    library.check(
        lib.hpcdl_alltoall(
            _ptr(src),
            _counts([s * row for s in splits]),
            _ptr(out),
            _counts([g * row for g in got]),
            int(kind),
            process_set,
        )
    )
    return out, got


def reducescatter(
    a: np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    prescale: float = 1.0,
    postscale: float = 1.0,
    process_set: int = 0,
    dtype: Optional[DType] = None,
) -> np.ndarray:
    """Reduce ``a`` across ranks and give each rank its rows: the first ``rows % size`` get one extra."""
    src = _contiguous(a, "reducescatter")
    kind = _resolve_dtype(src, dtype)
    if src.ndim == 0:
        raise HpcdlConfigError("reducescatter needs at least one dimension to split")
    size, me = _set_size(process_set)
    rows = src.shape[0]
    per = [reducescatter_rows(rows, size, i) for i in range(size)]
    row = int(np.prod(src.shape[1:], dtype=np.int64))
    out = result_array((per[me], *src.shape[1:]), src.dtype)
    code = library.load().hpcdl_reducescatter(
        _ptr(src),
        _ptr(out),
        _counts([p * row for p in per]),
        int(kind),
        int(op),
        float(prescale),
        float(postscale),
        process_set,
    )
    library.check(code)
    return out


def barrier(process_set: int = 0) -> None:
    """Wait until every rank of the process set has called barrier."""
    library.check(library.load().hpcdl_barrier(process_set))
