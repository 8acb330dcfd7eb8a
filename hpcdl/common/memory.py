"""Host memory for large out-of-place results: kept warm between calls, on transparent huge pages.

An out-of-place collective writes its result into fresh memory. At tens of MiB, touching that memory for
the first time costs more than the collective: one page fault and one zeroed 4 KiB page at a time (a
64 MiB ``hvd.allreduce`` took 40 ms against the in-place call's 14 ms). Two things remove most of it:

- a result of :data:`POOL_FROM_BYTES` or more lives in a block of this module's pool. When the last
  reference to it goes (the tensor, its views, anything sharing its memory), the block comes back, already
  faulted in, for the next result of the same size: a training loop that reduces the same tensors every
  step touches fresh memory only in its first step. At most :data:`IDLE_BLOCKS_PER_SIZE` idle blocks per
  size and :data:`IDLE_BYTES_LIMIT` bytes in all are kept; the rest are unmapped.
- a new block is advised ``MADV_HUGEPAGE`` before its first touch, so the kernel faults it in 2 MiB at a
  time where the system's THP setting is ``madvise`` (most distributions' default). With ``always`` the
  advice changes nothing, and with ``never`` it is refused and ignored.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import sys
import threading
import weakref
from typing import Optional

import numpy as np

# Smaller buffers gain little: the allocator already reuses them warm, and a result of a few huge pages is
# mostly its partial pages at either end.
POOL_FROM_BYTES = 4 << 20
IDLE_BLOCKS_PER_SIZE = 2
IDLE_BYTES_LIMIT = 1 << 30
_MADV_HUGEPAGE = 14
_PAGE = mmap.PAGESIZE

_madvise: Optional[ctypes._CFuncPtr] = None  # type: ignore[name-defined]
if sys.platform.startswith("linux"):
    # The process's own symbols hold libc's: no library search (find_library runs ldconfig, a subprocess
    # at import, which an MPI rank should not fork).
    _madvise = ctypes.CDLL(None, use_errno=True).madvise
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    _madvise.restype = ctypes.c_int

# A block: the anonymous mapping and the one memoryview of all of it that results are sliced from.
_Block = tuple[mmap.mmap, memoryview]
_idle: dict[int, list[_Block]] = {}
_idle_bytes = 0
# Reentrant: a result may die (and its block come back) in this thread while it holds the lock.
_lock = threading.RLock()


def advise_huge_pages(address: int, nbytes: int) -> bool:
    """Ask for huge pages under the whole pages of ``[address, address + nbytes)``, memory not touched yet.
    True when the kernel took the advice; a refusal (THP off, not Linux) changes nothing."""
    if _madvise is None:
        return False
    start = (address + _PAGE - 1) & ~(_PAGE - 1)
    end = (address + nbytes) & ~(_PAGE - 1)
    return end > start and _madvise(start, end - start, _MADV_HUGEPAGE) == 0


def _take(nbytes: int) -> _Block:
    """An idle block of ``nbytes`` from the pool, or a new one (advised huge pages before its first touch)."""
    global _idle_bytes
    with _lock:
        blocks = _idle.get(nbytes)
        block = blocks.pop() if blocks else None
        if block is not None:
            _idle_bytes -= nbytes
    if block is None:
        mapping = mmap.mmap(-1, nbytes)
        advise_huge_pages(ctypes.addressof(ctypes.c_char.from_buffer(mapping)), nbytes)
        block = (mapping, memoryview(mapping))
    return block


def result_buffer(nbytes: int) -> memoryview:
    """A writable buffer of ``nbytes`` (at least :data:`POOL_FROM_BYTES`) for a result, from the pool, for
    ``torch.frombuffer``. Its block goes back to the pool when this memoryview object dies, which is when no
    tensor made from it holds it any more. (NumPy keeps the mapping under a memoryview, not the memoryview:
    use :func:`result_array` there.)"""
    block = _take(nbytes)
    result = block[1][:]  # an object of its own: its death, not the block's, gives the block back
    weakref.finalize(result, _give_back, nbytes, block).atexit = False
    return result


def result_array(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A new C-contiguous array for a result: on a block of the pool from :data:`POOL_FROM_BYTES` on (glibc
    maps an allocation of 32 MiB or more afresh each time, and a 16 MiB allgather at 2 ranks spent longer
    faulting its result in than gathering it), else NumPy's own. The block goes back when the array made
    over it dies: every view of it (and every tensor ``torch.from_numpy`` made of one) keeps that array.
    Like any array over a buffer, it cannot be resized in place."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < POOL_FROM_BYTES:
        return np.empty(shape, dtype)
    block = _take(nbytes)
    whole = np.frombuffer(block[1], dtype=np.uint8)
    weakref.finalize(whole, _give_back, nbytes, block).atexit = False
    return whole.view(dtype).reshape(shape)


def result_like(a: np.ndarray) -> np.ndarray:
    """:func:`result_array` of ``a``'s shape and dtype (a small one at ``numpy.empty_like``'s cost)."""
    return np.empty_like(a) if a.nbytes < POOL_FROM_BYTES else result_array(a.shape, a.dtype)


def _give_back(nbytes: int, block: _Block) -> None:
    global _idle_bytes
    with _lock:
        blocks = _idle.setdefault(nbytes, [])
        if len(blocks) < IDLE_BLOCKS_PER_SIZE and _idle_bytes + nbytes <= IDLE_BYTES_LIMIT:
            blocks.append(block)
            _idle_bytes += nbytes


def idle_bytes() -> int:
    """Bytes of the pool's blocks that no result holds now."""
    with _lock:
        return _idle_bytes
