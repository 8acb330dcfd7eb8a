"""Asynchronous, named operations through the runtime's background engine.

Every operation is identified by a name (unnamed ones get deterministic names like
``allreduce.noname.3``). Ranks may submit names in any order and from several threads; the engine runs a
name once every member of the process set has submitted it, fuses small allreduces into one buffer, and
fails every rank's handle with the same message when the submissions disagree.

``enqueue`` is the low-level entry point (``hpcdl.torch`` builds on it with raw ``Buffer`` views); the
``*_async`` helpers wrap NumPy arrays. A buffer handed to the engine must stay alive and untouched until its
handle completes: the helpers keep references on the :class:`Handle` for that reason.

The NumPy helpers default to ``ReduceOp.AVERAGE`` like Horovod's ``allreduce_async``/``reducescatter``;
the blocking direct functions of :mod:`hpcdl.common` default to ``SUM``.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from hpcdl.common import _hotpath, abi, binding
from hpcdl.common.abi import Status
from hpcdl.common.exceptions import HpcdlError
from hpcdl.common.memory import result_array, result_like
from hpcdl.common.ops import reducescatter_rows
from hpcdl.common.types import Buffer, DType, OpType, Placement, ReduceOp, dtype_of

# hpcdl.common exports these (DeviceBatch and DeviceQueue serve the GPU path's executor only).
__all__ = [
    "Handle",
    "allgather_async",
    "allreduce_async",
    "alltoall_async",
    "barrier_async",
    "broadcast_async",
    "dump_flight_recorder",
    "engine_knob",
    "enqueue",
    "grouped_allreduce_async",
    "join",
    "new_group_id",
    "poll",
    "reducescatter_async",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]

_OK = int(Status.OK)
_ALLREDUCE = OpType.ALLREDUCE  # a module global: looking a member up on its enum class costs ~0.1 us


_bound = False  # this module's copy of binding's flag: a module global is the cheapest look on the hot path
_raise = binding.raise_status


def _lib() -> ctypes.CDLL:
    """The runtime, with ``_hotpath`` bound to it (once)."""
    global _bound
    lib = binding.runtime()
    _bound = True
    return lib


class Handle(_hotpath.HandleBase):
    """One submitted operation. Keeps the buffers it refers to alive until it is released.

    ``poll()`` (True when finished; raises if it failed), ``wait(timeout=None)`` (blocks; None: the
    runtime's timeout), ``release()`` (idempotent; a running operation's buffers stay alive until it
    finishes), ``result()`` (what the NumPy helper that created it promises, after ``wait``), and an
    allgather's or alltoall's ``output_bytes()`` (address, bytes and shape of the result: the output offered
    at submission when the result fitted it, c_api.h, else the engine's own buffer, valid until the handle
    is released) and an alltoall's ``received_splits()`` (rows from each member) are implemented in C
    (``hpcdl/common/_hotpath.c``), like the handle's creation by :func:`enqueue`: they run once per tensor
    per training step.
    """

    __slots__ = ()

    def output(self) -> np.ndarray:
        """The bytes of an allgather's or alltoall's result (:meth:`output_bytes`), copied into a uint8
        array."""
        address, nbytes, _ = self.output_bytes()
        out = result_array((nbytes,), np.uint8)
        if nbytes:
            ctypes.memmove(out.ctypes.data, address, nbytes)
        return out

    def join_result(self) -> int:
        """join: the last rank to join."""
        self._check_live()
        result = _lib().hpcdl_join_result(self.id)
        if result < 0:
            _raise(-result)
        return int(result)


def enqueue(
    op_type: OpType,
    input: Optional[Buffer],
    output: Optional[Buffer] = None,
    *,
    name: Optional[str] = None,
    process_set: int = 0,
    reduce_op: ReduceOp = ReduceOp.SUM,
    prescale: float = 1.0,
    postscale: float = 1.0,
    root: int = 0,
    splits: Optional[Sequence[int]] = None,
    group_id: int = 0,
    group_size: int = 0,
    keep: tuple[Any, ...] = (),
    result: Optional[Callable[[Handle], Any]] = None,
    value: Any = None,
    wait: bool = False,
) -> Handle:
    """Submit one operation to the engine and return its handle.

    ``input`` (and ``output`` for allreduce/broadcast/reducescatter, where it may be the same buffer; for
    allgather and alltoall an offered output, see c_api.h) must stay valid until the handle completes; pass
    the objects owning them in ``keep``. ``root`` is a world rank. ``handle.result()`` is ``value`` when
    given (a result known at submission, such as the output array), else ``result(handle)`` (one made from
    the engine's output), else None. ``wait=True`` is for a caller that would wait for it next: it returns
    once the operation has finished (raising its error), having run it on the calling thread when the
    engine was idle, without waking the engine thread.
    """
    return submit(
        op_type,
        name,
        process_set,
        input.dtype if input is not None else DType.UINT8,
        input.ptr if input is not None else None,
        output.ptr if output is not None else None,
        input.shape if input is not None else (),
        reduce_op,
        prescale,
        postscale,
        root,
        splits,
        group_id,
        group_size,
        keep,
        result,
        value,
        wait=wait,
    )


def submit(
    op_type: OpType,
    name: Optional[str],
    process_set: int,
    dtype: DType,
    input_ptr: Optional[int],
    output_ptr: Optional[int],
    shape: Sequence[int],
    reduce_op: ReduceOp = ReduceOp.SUM,
    prescale: float = 1.0,
    postscale: float = 1.0,
    root: int = 0,
    splits: Optional[Sequence[int]] = None,
    group_id: int = 0,
    group_size: int = 0,
    keep: Any = None,
    result: Optional[Callable[[Handle], Any]] = None,
    value: Any = None,
    placement: Placement = Placement.HOST,
    tag: int = 0,
    wait: bool = False,
) -> Handle:
    """:func:`enqueue` with the buffers as raw addresses (no Buffer objects), as a framework hands over its
    own tensors; whoever owns them keeps them alive until the handle completes (or passes them in
    ``keep``). ``placement=Placement.DEVICE`` submits device data, which the engine only negotiates: the
    batch comes back through :class:`DeviceQueue` with ``tag`` (> 0) naming the operation. ``wait``: see
    :func:`enqueue`."""
    if not _bound:
        _lib()
    return _hotpath.submit(
        Handle, op_type, name, process_set, dtype, input_ptr, output_ptr, shape, reduce_op, prescale,
        postscale, root, splits, group_id, group_size, keep, result, value, placement, tag, wait,
    )  # fmt: skip


def run(
    op_type: OpType,
    name: Optional[str],
    process_set: int,
    dtype: DType,
    input_ptr: int,
    output_ptr: int,
    shape: Sequence[int],
    reduce_op: ReduceOp = ReduceOp.SUM,
    prescale: float = 1.0,
    postscale: float = 1.0,
    root: int = 0,
    keep: Any = None,
) -> None:
    """Submit an operation whose output the caller owns (allreduce, broadcast, reducescatter) and wait for
    it: a blocking collective, with no handle (``hpcdl_run``: the engine thread is not woken for it). When the
    engine is idle, the runtime negotiates and runs it on the calling thread (the direct path of c_api.h's
    engine).
    ``keep`` owns the buffers; it stays alive past a timeout, while the operation may still run."""
    if not _bound:
        _lib()
    _hotpath.run(
        op_type,
        name,
        process_set,
        dtype,
        input_ptr,
        output_ptr,
        shape,
        reduce_op,
        prescale,
        postscale,
        root,
        keep,
    )


def new_group_id(process_set: int = 0) -> int:
    """A fresh id for a group of operations on ``process_set`` that must run together. The members of the
    set allocate their group ids in the same order (as unnamed operations get the same names); a joined
    rank skips the ids of the groups it stood in for."""
    group_id = _lib().hpcdl_new_group_id(int(process_set))
    if group_id < 0:
        _raise(-group_id)
    return int(group_id)


# ---- NumPy helpers --------------------------------------------------------------------------------------


def _contiguous(a: np.ndarray) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise HpcdlError(f"expected a numpy.ndarray, got {type(a).__name__}")
    if not a.dtype.isnative:
        raise HpcdlError("hpcdl needs arrays in native byte order; use a.astype(a.dtype.newbyteorder('='))")
    return np.ascontiguousarray(a)


def _buffer(a: np.ndarray, dtype: DType) -> Buffer:
    """A view of a C-contiguous, native-order array (checked by the caller); cheaper than
    ``Buffer.from_numpy`` on the per-tensor hot path."""
    return Buffer(a.__array_interface__["data"][0], dtype, a.shape)


# Allgathers and alltoalls of inputs this large offer the engine their usual result (c_api.h), which it
# writes straight into; smaller ones copy theirs out of the engine's buffer, which costs less than making the
# offer (1 us at 8 bytes; a 1 MiB allgather at 2 ranks gains 25 us by it, 16 MiB 1.7 ms).
OFFER_FROM_BYTES = 16 << 10


def output_array(handle: Handle, dtype: np.dtype, offered: Optional[np.ndarray]) -> np.ndarray:
    """A finished allgather's or alltoall's result as an array of ``dtype``: ``offered`` itself when the
    engine wrote it there (the usual result, offered at submission), else a copy of the engine's own
    buffer."""
    address, _, shape = handle.output_bytes()
    if offered is not None and offered.size and address == offered.ctypes.data:
        return offered if offered.shape == shape else offered.reshape(shape)
    return handle.output().view(dtype).reshape(shape)


def _offer(a: np.ndarray, rows: int) -> np.ndarray:
    """The usual result of an allgather or alltoall of ``a``, ``rows`` rows of its row shape, to offer."""
    return result_array((rows, *a.shape[1:]), a.dtype)


def allreduce_async(
    a: np.ndarray,
    name: Optional[str] = None,
    op: ReduceOp = ReduceOp.AVERAGE,
    prescale: float = 1.0,
    postscale: float = 1.0,
    out: Optional[np.ndarray] = None,
    process_set: int = 0,
) -> Handle:
    """Allreduce ``a`` into ``out`` (a new array when None; ``out=a`` reduces in place)."""
    # The hot path of a training step, run once per gradient: reducing into an array the caller gave is
    # one C call, which returns None for whatever needs the checks below (and before the first _lib()).
    handle = _hotpath.allreduce(Handle, _ALLREDUCE, a, name, op, prescale, postscale, out, process_set)
    if handle is not None:
        return handle
    a = _contiguous(a)
    if out is None:
        out = result_like(a)
    elif out is not a and (out.shape != a.shape or out.dtype != a.dtype or not out.flags.c_contiguous):
        raise HpcdlError("out must be a C-contiguous array with the input's shape and dtype")
    if not _bound:
        _lib()
    return _hotpath.submit(
        Handle,
        _ALLREDUCE,
        name,
        process_set,
        dtype_of(a),
        a,
        out,
        a.shape,
        op,
        prescale,
        postscale,
        0,
        None,
        0,
        0,
        a if out is a else (a, out),
        None,
        out,
        Placement.HOST,
        0,
        False,
    )


def grouped_allreduce_async(
    arrays: Sequence[np.ndarray],
    names: Optional[Sequence[str]] = None,
    op: ReduceOp = ReduceOp.AVERAGE,
    prescale: float = 1.0,
    postscale: float = 1.0,
    process_set: int = 0,
) -> list[Handle]:
    """Allreduce several arrays as one group: none of them runs before all of them are ready everywhere."""
    if names is not None and len(names) != len(arrays):
        raise HpcdlError(f"got {len(arrays)} arrays but {len(names)} names")
    group = new_group_id(process_set)
    handles = []
    for i, a in enumerate(arrays):
        a = _contiguous(a)
        out = result_like(a)
        dtype = dtype_of(a)
        handles.append(
            enqueue(
                OpType.ALLREDUCE,
                _buffer(a, dtype),
                _buffer(out, dtype),
                name=names[i] if names is not None else None,
                process_set=process_set,
                reduce_op=op,
                prescale=prescale,
                postscale=postscale,
                group_id=group,
                group_size=len(arrays),
                keep=(a, out),
                value=out,
            )
        )
    return handles


def allgather_async(a: np.ndarray, name: Optional[str] = None, process_set: int = 0) -> Handle:
    """Concatenate every rank's ``a`` along dimension 0 (first dimensions may differ per rank)."""
    a = _contiguous(a)
    if a.ndim == 0:
        a = a.reshape(1)
    dtype = dtype_of(a)
    offered = None
    if a.nbytes >= OFFER_FROM_BYTES:
        offered = _offer(a, max(_lib().hpcdl_process_set_size(process_set), 0) * a.shape[0])
    return enqueue(
        OpType.ALLGATHER,
        _buffer(a, dtype),
        None if offered is None else _buffer(offered, dtype),
        name=name,
        process_set=process_set,
        keep=(a, offered),
        result=lambda h: output_array(h, a.dtype, offered),
    )


def broadcast_async(a: np.ndarray, root: int = 0, name: Optional[str] = None, process_set: int = 0) -> Handle:
    """Broadcast ``a`` from world rank ``root`` in place."""
    if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
        raise HpcdlError("broadcast_async works in place and needs a C-contiguous numpy.ndarray")
    buffer = _buffer(_contiguous(a), dtype_of(a))
    return enqueue(
        OpType.BROADCAST,
        buffer,
        buffer,
        name=name,
        process_set=process_set,
        root=root,
        keep=(a,),
        value=a,
    )


def alltoall_async(
    a: np.ndarray, splits: Optional[Sequence[int]] = None, name: Optional[str] = None, process_set: int = 0
) -> Handle:
    """Send ``splits[i]`` rows of ``a`` to member i (even split when None); ``handle.received_splits()``
    tells how many rows came from each member."""
    a = _contiguous(a)
    dtype = dtype_of(a)
    offered = _offer(a, a.shape[0]) if a.nbytes >= OFFER_FROM_BYTES else None  # as many rows as sent
    return enqueue(
        OpType.ALLTOALL,
        _buffer(a, dtype),
        None if offered is None else _buffer(offered, dtype),
        name=name,
        process_set=process_set,
        splits=list(splits) if splits is not None else None,
        keep=(a, offered),
        result=lambda h: output_array(h, a.dtype, offered),
    )


def reducescatter_async(
    a: np.ndarray,
    name: Optional[str] = None,
    op: ReduceOp = ReduceOp.AVERAGE,
    prescale: float = 1.0,
    postscale: float = 1.0,
    process_set: int = 0,
) -> Handle:
    """Reduce ``a`` and give each member its block of dim 0 (the first ``rows % size`` members get one
    extra row, as in Horovod)."""
    a = _contiguous(a)
    if a.ndim == 0:
        raise HpcdlError("reducescatter needs an array with at least one dimension")
    lib = _lib()
    size = lib.hpcdl_process_set_size(process_set)
    me = lib.hpcdl_process_set_rank(process_set)
    if size <= 0 or me < 0:
        raise HpcdlError(f"this rank is not a member of process set {process_set}")
    out = result_array((reducescatter_rows(a.shape[0], size, me), *a.shape[1:]), a.dtype)
    dtype = dtype_of(a)
    return enqueue(
        OpType.REDUCESCATTER,
        _buffer(a, dtype),
        _buffer(out, dtype),
        name=name,
        process_set=process_set,
        reduce_op=op,
        prescale=prescale,
        postscale=postscale,
        keep=(a, out),
        value=out,
    )


def barrier_async(name: Optional[str] = None, process_set: int = 0) -> Handle:
    return enqueue(OpType.BARRIER, None, name=name, process_set=process_set)


def synchronize(handle: Handle, timeout: Optional[float] = None) -> Any:
    """Wait for ``handle`` and return its result (the output array of the helper that created it)."""
    handle.wait(timeout)
    return handle.result()


def poll(handle: Handle) -> bool:
    return handle.poll()


def join(process_set: int = 0, timeout: Optional[float] = None) -> int:
    """Declare that this rank has no more data. Until every rank joined, the others' allreduces get zeros
    from this rank and their allgathers nothing. Returns the last rank to join."""
    handle = enqueue(OpType.JOIN, None, process_set=process_set)
    handle.wait(timeout)
    result = handle.join_result()
    handle.release()
    return result


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a Chrome-trace timeline of the engine's operations to ``file_path`` (world rank 0
    writes it)."""
    if not file_path:
        raise ValueError("start_timeline needs a file path, e.g. hvd.start_timeline('/tmp/timeline.json')")
    status = _lib().hpcdl_start_timeline(str(file_path).encode(), 1 if mark_cycles else 0)
    if status != _OK:
        _raise(status)


def stop_timeline() -> None:
    """Stop the timeline started by ``start_timeline`` (or ``HPCDL_TIMELINE``) and close the file."""
    status = _lib().hpcdl_stop_timeline()
    if status != _OK:
        _raise(status)


def dump_flight_recorder(message: str = "") -> None:
    """Write this rank's flight recorder (its recent operations and its stacks) to
    ``<debug dir>/flight.rank<R>.json`` now (see :mod:`hpcdl.common.debug_dir`); nothing in a job of one
    process without ``HPCDL_DEBUG_DIR``."""
    status = _lib().hpcdl_flight_dump(b"request", message.encode(errors="replace"))
    if status != _OK:
        _raise(status)


def engine_knob(name: str) -> float:
    """Current value of an engine knob: fusion_threshold, cycle_time_ms, small_message_bytes,
    cache_capacity (changes over time under autotune)."""
    value = _lib().hpcdl_get_knob(name.encode())
    if value != value:  # NaN: unknown knob or not initialised
        raise HpcdlError(
            f"unknown engine knob {name!r} (or hpcdl is not initialised); "
            "known: fusion_threshold, cycle_time_ms, small_message_bytes, cache_capacity"
        )
    return float(value)


# ---- the device executor's end --------------------------------------------------------------------------

_HEADER_WORDS = abi.DEVICE_HEADER_WORDS


@dataclass(frozen=True)
class DeviceBatch:
    """Device operations the engine decided to run together (the layout of c_api.h's hpcdl_device_next).

    ``tags[i]`` is the tag the caller submitted entry i with (0: this rank joined, and stands in with
    ``counts[i]`` zeros); ``table`` holds, for an allgather, every member's rows and, for an alltoall, the
    rows each member sends to this rank.
    """

    id: int
    process_set: int
    op_type: OpType
    dtype: DType
    reduce_op: ReduceOp
    root: int  # broadcast: the root's index in the process set
    set_size: int
    set_rank: int
    fused: bool
    timed: bool  # the timeline records it: report its phase times
    prescale: float
    postscale: float
    tags: tuple[int, ...]
    counts: tuple[int, ...]
    table: tuple[int, ...]

    @staticmethod
    def decode(words: Sequence[int]) -> DeviceBatch:
        entries, table = words[6], words[12]
        body = words[_HEADER_WORDS : _HEADER_WORDS + 2 * entries]
        scales = struct.unpack("<2d", struct.pack("<2q", words[10], words[11]))
        return DeviceBatch(
            id=words[0],
            process_set=words[1],
            op_type=OpType(words[2]),
            dtype=DType(words[3]),
            reduce_op=ReduceOp(words[4]),
            root=words[5],
            set_size=words[7],
            set_rank=words[8],
            fused=bool(words[9] & abi.DEVICE_FUSED),
            timed=bool(words[9] & abi.DEVICE_TIMED),
            prescale=scales[0],
            postscale=scales[1],
            tags=tuple(body[0::2]),
            counts=tuple(body[1::2]),
            table=tuple(words[_HEADER_WORDS + 2 * entries : _HEADER_WORDS + 2 * entries + table]),
        )


class DeviceQueue:
    """Where an executor takes the engine's device batches, in the order every rank agrees on, and reports
    their ends. One executor thread per process calls :meth:`next`; any thread may call :meth:`done`."""

    def __init__(self, capacity: int = 4096) -> None:
        self._words = (ctypes.c_int64 * capacity)()

    def next(self, timeout: float) -> Optional[DeviceBatch]:
        """The next batch, or None when none came within ``timeout`` seconds (or :meth:`interrupt` was
        called). Raises the engine's error once it failed or shut down: every operation it held has
        failed, and whatever the executor still runs must be aborted."""
        lib = _lib()
        while True:
            length = lib.hpcdl_device_next(float(timeout), self._words, len(self._words))
            if length >= 0:
                return DeviceBatch.decode(self._words[:length]) if length else None
            if -length == Status.ERR_INVALID and self._words[0] > len(self._words):
                self._words = (ctypes.c_int64 * int(self._words[0]))()  # a batch longer than the buffer
                continue
            _raise(-length)

    @staticmethod
    def done(
        batch: DeviceBatch, error: Optional[str] = None, times_ns: Optional[Sequence[int]] = None
    ) -> None:
        """Complete the batch's operations, or fail them (and the engine, whose collectives cannot go on
        after a failed one) with ``error``. ``times_ns``: the ``time.monotonic_ns()`` of its start, the
        collective's start and end, and its end, for the timeline."""
        times = (ctypes.c_int64 * 4)(*times_ns) if times_ns is not None else None
        status = Status.ERR_INTERNAL if error is not None else _OK
        message = error.encode(errors="replace") if error is not None else None
        code = _lib().hpcdl_device_done(batch.id, status, message, times)
        if code != _OK:
            _raise(code)

    @staticmethod
    def interrupt() -> None:
        """Make a :meth:`next` that waits return None at once."""
        _lib().hpcdl_device_interrupt()
