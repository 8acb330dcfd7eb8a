"""The collectives of ``hpcdl.tensorflow`` on NumPy views of tensors, through hpcdl's engine.

TensorFlow hands these functions NumPy arrays: eagerly the tensors' own memory, inside a graph the
arguments of a ``tf.numpy_function``. Every function submits all of its operations (so the engine
negotiates and fuses them in one cycle) and returns them as a :class:`Started` batch without waiting:
eagerly the caller finishes it at once; in a graph the latch kernel's library waits for its handles while
TensorFlow's executor goes on (see ``mpi_ops._run``). Every wait has the runtime's deadline, whose error
names the ranks and the tensor that were missing, and every handle is released however the batch ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from hpcdl.common import basics, engine
from hpcdl.common.memory import POOL_FROM_BYTES, result_array
from hpcdl.common.ops import reducescatter_rows
from hpcdl.common.reduce_ops import runtime_op
from hpcdl.common.types import OpType
from hpcdl.tensorflow._dtypes import Wire

Names = Sequence[Optional[str]]


# TensorFlow adopts an array a tf.numpy_function returns without copying it when its data is 64-byte
# aligned (its kernels check that alignment); NumPy aligns large arrays to 16 bytes only.
ALIGNMENT = 64


def _empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary: a large one on a warm
    block of ``hpcdl.common.memory``'s pool (which starts on a page)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes >= POOL_FROM_BYTES:
        return result_array(shape, dtype)
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


Placed = Sequence[tuple[int, int]]


def place(sizes: Sequence[int], process_set: int) -> list[tuple[int, int]]:
    """(group id, group size) for each operation of consecutive groups of ``sizes`` operations that must
    run together; (0, 0) for an operation alone. In a graph this is called when the graph is built (the
    ranks build their graphs in the same order, while their executors may run them in any order), and the
    ids serve every run."""
    placed = []
    for size in sizes:
        group = (engine.new_group_id(process_set), size) if size > 1 else (0, 0)
        placed.extend([group] * size)
    return placed


def _submit_all(submit: Callable[[int], engine.Handle], count: int) -> list[engine.Handle]:
    """``submit(i)`` for every i; when one is refused, the handles already made are released (their
    buffers stay alive until the engine is done with them) and the refusal is raised."""
    handles: list[engine.Handle] = []
    try:
        for i in range(count):
            handles.append(submit(i))
    except BaseException:
        for handle in handles:
            handle.release()
        raise
    return handles


class Started:
    """Operations submitted together: :meth:`wait` for all of them (the first failure is kept, not raised),
    then :meth:`result` (their outputs, or that failure raised), which releases every handle."""

    def __init__(
        self, handles: list[engine.Handle], collect: Callable[[list[engine.Handle]], list[np.ndarray]]
    ) -> None:
        self._handles = handles
        self._collect = collect
        self.error: Optional[BaseException] = None

    def ids(self) -> list[int]:
        """The runtime's handles of the operations (for a waiter outside Python)."""
        return [handle.id for handle in self._handles]

    def wait(self) -> None:
        try:
            for handle in self._handles:
                handle.wait()
        except BaseException as exc:  # kept for result(), which raises it on the thread that reads
            self.error = exc

    def result(self) -> list[np.ndarray]:
        try:
            if self.error is not None:
                raise self.error
            return self._collect(self._handles)
        finally:
            self.release()

    def release(self) -> None:
        """Release every handle (idempotent; a running operation's buffers stay alive until it ends)."""
        for handle in self._handles:
            handle.release()

    def finish(self) -> list[np.ndarray]:
        """Wait, then the result (the eager path)."""
        self.wait()
        return self.result()


def _engine_output(handle: engine.Handle, wire: Wire, dtype: np.dtype, offered: np.ndarray) -> np.ndarray:
    """An allgather's or alltoall's result as an array of the tensor's dtype: ``offered`` itself when the
    engine wrote it there (the usual result, offered at submission, see c_api.h), else a copy of the
    engine's own buffer."""
    raw = engine.output_array(handle, wire.view, offered)
    return wire.receive(raw, dtype, raw.shape[:-1] if wire.pairs else raw.shape)


@dataclass(frozen=True)
class Reduction:
    """How a batch of reductions runs: the op, the scale factors, the process set, and ``groups``: the
    group of each operation (see :func:`place`)."""

    op: int
    prescale: float
    postscale: float
    process_set: int
    groups: Placed


def _reduce(
    op_type: OpType,
    sources: list[np.ndarray],
    outputs: list[np.ndarray],
    wires: Sequence[Wire],
    names: Names,
    how: Reduction,
) -> list[engine.Handle]:
    """Submit the reduction of every source into its output (allreduce or reducescatter)."""
    placed = how.groups
    reduce_op = runtime_op(how.op)

    def submit(i: int) -> engine.Handle:
        return engine.submit(
            op_type,
            names[i],
            how.process_set,
            wires[i].runtime,
            sources[i],
            outputs[i],
            sources[i].shape,
            reduce_op=reduce_op,
            prescale=how.prescale,
            postscale=how.postscale,
            group_id=placed[i][0],
            group_size=placed[i][1],
            keep=(sources[i], outputs[i]),
            value=outputs[i],
        )

    return _submit_all(submit, len(sources))


def allreduce(arrays: Sequence[np.ndarray], wires: Sequence[Wire], names: Names, how: Reduction) -> Started:
    """Reduce each array over the process set."""
    sources = [w.send(a) for a, w in zip(arrays, wires)]
    outputs = [_empty(src.shape, src.dtype) for src in sources]
    handles = _reduce(OpType.ALLREDUCE, sources, outputs, wires, names, how)
    return Started(
        handles, lambda _: [w.receive(out, a.dtype, a.shape) for out, a, w in zip(outputs, arrays, wires)]
    )


def allgather(
    arrays: Sequence[np.ndarray], wires: Sequence[Wire], names: Names, process_set: int, placed: Placed
) -> Started:
    """Concatenate every member's arrays along dimension 0 (``placed``: their groups, see :func:`place`)."""
    sources = [w.send(a) for a, w in zip(arrays, wires)]
    # The usual result (every member's rows alike), offered to the engine: written there, it is returned
    # without a copy, aligned for TensorFlow to adopt.
    size = basics.process_set_size(process_set)
    offered = [_empty((size * src.shape[0], *src.shape[1:]), src.dtype) for src in sources]

    def submit(i: int) -> engine.Handle:
        src, wire = sources[i], wires[i]
        return engine.submit(
            OpType.ALLGATHER,
            names[i],
            process_set,
            wire.runtime,
            src,
            offered[i],
            src.shape,
            group_id=placed[i][0],
            group_size=placed[i][1],
            keep=(src, offered[i]),
        )

    return Started(
        _submit_all(submit, len(arrays)),
        lambda handles: [
            _engine_output(h, w, a.dtype, o) for h, w, a, o in zip(handles, wires, arrays, offered)
        ],
    )


def broadcast(
    arrays: Sequence[np.ndarray], wires: Sequence[Wire], names: Names, root: int, process_set: int
) -> Started:
    """World rank ``root``'s arrays on every member (the inputs are left alone)."""
    buffers = []
    for a, w in zip(arrays, wires):
        sent = w.send(a)
        buffers.append(_empty(sent.shape, sent.dtype))
        np.copyto(buffers[-1], sent)

    def submit(i: int) -> engine.Handle:
        buffer, wire = buffers[i], wires[i]
        return engine.submit(
            OpType.BROADCAST,
            names[i],
            process_set,
            wire.runtime,
            buffer,
            buffer,
            buffer.shape,
            root=root,
            keep=(buffer,),
            value=buffer,
        )

    return Started(
        _submit_all(submit, len(arrays)),
        lambda _: [w.receive(b, a.dtype, a.shape) for b, a, w in zip(buffers, arrays, wires)],
    )


def alltoall(
    array: np.ndarray, wire: Wire, splits: Optional[list[int]], name: Optional[str], process_set: int
) -> Started:
    """Send ``splits[i]`` rows to member i (even split when None); the result is (rows received, rows
    received from each member as int32)."""
    src = wire.send(array)
    offered = _empty(src.shape, src.dtype)  # the usual result: as many rows as sent (see allgather)

    def submit(_: int) -> engine.Handle:
        return engine.submit(
            OpType.ALLTOALL, name, process_set, wire.runtime, src, offered, src.shape, splits=splits,
            keep=(src, offered),
        )  # fmt: skip

    def collect(handles: list[engine.Handle]) -> list[np.ndarray]:
        [h] = handles
        splits = h.received_splits()
        received = _empty((len(splits),), np.int32)  # aligned: TensorFlow adopts it
        received[:] = splits
        return [_engine_output(h, wire, array.dtype, offered), received]

    return Started(_submit_all(submit, 1), collect)


def reducescatter(
    arrays: Sequence[np.ndarray], wires: Sequence[Wire], names: Names, how: Reduction
) -> Started:
    """Reduce each array over the set and keep this member's block of rows (the first ``rows % size``
    members get one row more, as in Horovod)."""
    size, me = basics.process_set_size(how.process_set), basics.process_set_rank(how.process_set)
    if me < 0:
        raise ValueError(f"this rank ({basics.rank()}) is not a member of process set {how.process_set}")
    sources = [w.send(a) for a, w in zip(arrays, wires)]
    outputs = [
        _empty((reducescatter_rows(src.shape[0], size, me), *src.shape[1:]), src.dtype) for src in sources
    ]
    handles = _reduce(OpType.REDUCESCATTER, sources, outputs, wires, names, how)
    return Started(
        handles,
        lambda _: [
            w.receive(out, a.dtype, (out.shape[0], *a.shape[1:])) for out, a, w in zip(outputs, arrays, wires)
        ],
    )


def barrier(process_set: int) -> Started:
    """Every member waits for the others (the result: a 0 int32 scalar)."""
    return Started([engine.barrier_async(process_set=process_set)], lambda _: [np.zeros((), dtype=np.int32)])


def join(process_set: int) -> Started:
    """Declare this rank out of data; the result is the last rank to join (an int32 scalar)."""
    handle = engine.enqueue(OpType.JOIN, None, process_set=process_set)
    return Started([handle], lambda handles: [np.asarray(handles[0].join_result(), dtype=np.int32)])
