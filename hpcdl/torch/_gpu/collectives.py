"""The data movement of the GPU path: how the executor runs one batch of each collective on a process group
(NCCL, or gloo standing in for it), once the engine decided it.

A runner starts the batch's collective and returns a :class:`Started`: the group's work and what must run
once the collective's data is there (scaling, the copies out of the fusion buffer, the rows of an uneven
allgather). On CUDA the executor runs that at once, ordered after the collective on the lane's stream; on
the CPU, once the work completed. Everything a runner needs that its own tensors do not tell (the other
members' rows, whether this rank stands in for a joined one) comes with the batch, so no collective runs
that the engine did not decide: no size exchanges.

Neither NCCL nor gloo reduces int16: it is reduced as int32 (whose wrap-around, truncated back, is
int16's), and moved as bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from hpcdl.common.engine import DeviceBatch
from hpcdl.common.ops import reducescatter_rows
from hpcdl.common.types import DType, OpType, ReduceOp
from hpcdl.torch._gpu.lanes import Lane, Marker

_TORCH_DTYPES = {
    DType.UINT8: torch.uint8,
    DType.INT8: torch.int8,
    DType.INT16: torch.int16,
    DType.INT32: torch.int32,
    DType.INT64: torch.int64,
    DType.FLOAT16: torch.float16,
    DType.BFLOAT16: torch.bfloat16,
    DType.FLOAT32: torch.float32,
    DType.FLOAT64: torch.float64,
    DType.BOOL: torch.bool,
}
_REDUCED_AS = {torch.int16: torch.int32}
_MOVED_AS_BYTES = frozenset(_REDUCED_AS)
_BACKEND_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.AVERAGE: dist.ReduceOp.SUM,  # then divided, as Horovod does (integers truncate)
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}


@dataclass(eq=False, slots=True)
class DeviceOp:
    """One operation of the GPU path from its submission to its batch's end.

    ``input`` and ``output`` are contiguous and on the operation's device; ``output`` is the caller's
    buffer for allreduce, broadcast and reducescatter, and the executor's (set when it runs) for allgather
    and alltoall. ``ready`` is the caller's stream at submission, ``done`` the lane's after the batch.
    """

    input: torch.Tensor
    output: Optional[torch.Tensor] = None
    ready: Optional[torch.cuda.Event] = None
    splits: Optional[list[int]] = None  # alltoall: rows sent to each member (None: even)
    received: Optional[list[int]] = None  # alltoall: rows received from each member
    done: Optional[torch.cuda.Event] = None
    output_on_lane: bool = False  # the executor allocated `output` on the lane's stream

    def hand_over(self) -> None:
        """Order the caller's current stream after the batch (no host wait) and let it own the output."""
        if self.done is None:
            return
        stream = torch.cuda.current_stream(self.input.device)
        stream.wait_event(self.done)
        if self.output_on_lane and self.output is not None:
            self.output.record_stream(stream)


@dataclass
class Started:
    work: Any  # the process group's Work
    after: Callable[[], None]  # what runs once the collective's data is there
    begin: Optional[Marker]  # when the collective itself started (after packing), for the timeline
    buffers: Sequence[torch.Tensor] = ()  # the lane's fusion buffers it holds until `after` ran


Runner = Callable[[DeviceBatch, Sequence[Optional[DeviceOp]], Lane, Any], Started]


def torch_dtype(dtype: DType) -> torch.dtype:
    return _TORCH_DTYPES[dtype]


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as the backend moves it: flat, and as bytes where it has no such dtype."""
    flat = t.reshape(-1)
    return flat.view(torch.uint8) if t.dtype in _MOVED_AS_BYTES else flat


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as rows of dim 0 the backend moves (as bytes where it has no such dtype)."""
    rows = t.reshape(t.shape[0], math.prod(t.shape[1:]))
    return rows.view(torch.uint8) if t.dtype in _MOVED_AS_BYTES else rows


def _scale(t: torch.Tensor, factor: float, dtype: torch.dtype) -> None:
    """Multiply in place, the result stored in ``dtype`` (integers truncate, float16 rounds): Horovod's rule
    for prescaling, and its postscaling on GPUs. Booleans are not scaled."""
    if factor == 1.0 or dtype == torch.bool:
        return
    if dtype.is_floating_point:
        t.mul_(factor)
    else:
        t.copy_((t.to(torch.float64) * factor).trunc().to(dtype))


def _reduce_options(batch: DeviceBatch, options: Any) -> Any:
    options.reduceOp = _BACKEND_OPS[batch.reduce_op]
    return options


def _finish_reduction(t: torch.Tensor, batch: DeviceBatch, dtype: torch.dtype) -> None:
    """Postscale, and divide an average by the set's size (joined ranks count: they contributed zeros)."""
    _scale(t, batch.postscale, dtype)
    if batch.reduce_op != ReduceOp.AVERAGE or dtype == torch.bool:
        return
    if dtype.is_floating_point:
        t.div_(batch.set_size)
    else:
        t.div_(batch.set_size, rounding_mode="trunc")


def _pack(
    ops: Sequence[Optional[DeviceOp]], counts: Sequence[int], buffer: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copy the inputs into the fusion buffer (zeros where this rank stands in for a joined one); returns
    the (output, piece of the buffer) pairs to copy back."""
    pieces = buffer.split(list(counts))
    if all(op is not None for op in ops) and buffer.dtype == ops[0].input.dtype:  # type: ignore[union-attr]
        torch.cat([op.input.reshape(-1) for op in ops], out=buffer)  # type: ignore[union-attr]
    else:
        for op, piece in zip(ops, pieces):
            if op is None:
                piece.zero_()
            else:
                piece.copy_(op.input.reshape(-1))
    return [
        (op.output.reshape(-1), piece)
        for op, piece in zip(ops, pieces)
        if op is not None and op.output is not None
    ]


def _unpack(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    if not pairs:
        return
    if all(target.dtype == piece.dtype for target, piece in pairs):
        torch._foreach_copy_([t for t, _ in pairs], [p for _, p in pairs])  # one launch for them all
    else:
        for target, piece in pairs:
            target.copy_(piece)


def allreduce(batch: DeviceBatch, ops: Sequence[Optional[DeviceOp]], lane: Lane, group: Any) -> Started:
    """One allreduce in place in its output, or several (and stand-ins for a joined rank) through the
    lane's fusion buffer: packed on the device, one collective, unpacked."""
    dtype = torch_dtype(batch.dtype)
    wire = _REDUCED_AS.get(dtype, dtype)
    lane.use([t for op in ops if op is not None for t in (op.input, op.output) if t is not None])
    only = ops[0] if len(ops) == 1 else None
    held: list[torch.Tensor] = []
    if only is not None and only.output is not None and not batch.fused and wire == dtype:
        buffer = only.output.reshape(-1)
        if only.output.data_ptr() != only.input.data_ptr():
            buffer.copy_(only.input.reshape(-1))  # the backend reduces in place
        unpack: list[tuple[torch.Tensor, torch.Tensor]] = []
    else:
        held.append(lane.fusion_buffer(wire, sum(batch.counts)))
        buffer = held[0][: sum(batch.counts)]
        unpack = _pack(ops, batch.counts, buffer)
    begin = lane.mark(batch.timed)
    _scale(buffer, batch.prescale, dtype)
    work = group.allreduce([buffer], _reduce_options(batch, dist.AllreduceOptions()))

    def after() -> None:
        _finish_reduction(buffer, batch, dtype)
        _unpack(unpack)

    return Started(work, after, begin, held)


def allgather(batch: DeviceBatch, ops: Sequence[Optional[DeviceOp]], lane: Lane, group: Any) -> Started:
    """Every member's rows in rank order. Members with fewer rows than the widest are padded (their rows
    are known from the negotiation) and the result compacted after the collective."""
    (op,) = ops
    assert op is not None
    rows = list(batch.table)
    widest, mine, n = max(rows), rows[batch.set_rank], batch.set_size
    source = op.input
    lane.use([source])
    tail = tuple(source.shape[1:])
    send = source
    if widest != mine:
        send = torch.empty((widest, *tail), dtype=source.dtype, device=source.device)
        send[:mine].copy_(source)
    gathered = torch.empty((n * widest, *tail), dtype=source.dtype, device=source.device)
    begin = lane.mark(batch.timed)
    work = group._allgather_base(_flat(gathered), _flat(send))

    def after() -> None:
        if all(r == widest for r in rows):
            op.output = gathered
        else:
            parts = [gathered[m * widest : m * widest + rows[m]] for m in range(n)]
            op.output = torch.cat(parts)
        op.output_on_lane = True

    return Started(work, after, begin)


def broadcast(batch: DeviceBatch, ops: Sequence[Optional[DeviceOp]], lane: Lane, group: Any) -> Started:
    (op,) = ops
    assert op is not None and op.output is not None
    lane.use([op.input, op.output])
    if batch.set_rank == batch.root and op.output.data_ptr() != op.input.data_ptr():
        op.output.copy_(op.input)
    options = dist.BroadcastOptions()
    options.rootRank = batch.root
    options.rootTensor = 0
    begin = lane.mark(batch.timed)
    return Started(group.broadcast([_flat(op.output)], options), lambda: None, begin)


def alltoall(batch: DeviceBatch, ops: Sequence[Optional[DeviceOp]], lane: Lane, group: Any) -> Started:
    """Rows to each member; how many come from each is known from the negotiation."""
    (op,) = ops
    assert op is not None
    source = op.input
    lane.use([source])
    n = batch.set_size
    send = op.splits if op.splits is not None else [source.shape[0] // n] * n
    received = list(batch.table)
    out = torch.empty((sum(received), *source.shape[1:]), dtype=source.dtype, device=source.device)
    begin = lane.mark(batch.timed)
    work = group.alltoall_base(_rows(out), _rows(source), received, send, dist.AllToAllOptions())

    def after() -> None:
        op.output, op.received, op.output_on_lane = out, received, True

    return Started(work, after, begin)


def reducescatter(batch: DeviceBatch, ops: Sequence[Optional[DeviceOp]], lane: Lane, group: Any) -> Started:
    """The reduction's rows for this member (the first ``rows % size`` members get one more, as in
    Horovod); equal shares take the backend's flat reduce-scatter, uneven ones its list form."""
    (op,) = ops
    assert op is not None and op.output is not None
    dtype = torch_dtype(batch.dtype)
    wire = _REDUCED_AS.get(dtype, dtype)
    lane.use([op.input, op.output])
    source = op.input
    if wire != dtype or batch.prescale != 1.0:
        source = source.to(wire, copy=True)  # the caller's input stays as it was
        _scale(source, batch.prescale, dtype)
    out = op.output if wire == dtype else torch.empty(op.output.shape, dtype=wire, device=op.output.device)
    n = batch.set_size
    shares = [reducescatter_rows(source.shape[0], n, m) for m in range(n)]
    options = _reduce_options(batch, dist.ReduceScatterOptions())
    begin = lane.mark(batch.timed)
    if len(set(shares)) == 1:
        work = group._reduce_scatter_base(out.reshape(-1), source.reshape(-1), options)
    else:
        work = group.reduce_scatter([out], [list(source.split(shares))], options)

    def after() -> None:
        _finish_reduction(out, batch, dtype)
        if out is not op.output:
            op.output.copy_(out)

    return Started(work, after, begin)


RUNNERS: dict[OpType, Runner] = {
    OpType.ALLREDUCE: allreduce,
    OpType.ALLGATHER: allgather,
    OpType.BROADCAST: broadcast,
    OpType.ALLTOALL: alltoall,
    OpType.REDUCESCATTER: reducescatter,
}
