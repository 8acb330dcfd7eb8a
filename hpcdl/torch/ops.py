"""Blocking, differentiable collectives on tensors (Horovod's ``allreduce``, ``allgather``, ...).

Gradients follow Horovod 0.28 exactly, so that models port unchanged:
allreduce's gradient is the same allreduce of the incoming gradient; allgather's is the Average-allreduce
of the incoming gradient, sliced to this rank's rows; broadcast's is the Average-allreduce of the incoming
gradient on the root and zero elsewhere; alltoall's is the reverse alltoall; reducescatter's is the
allgather of the incoming gradient (times the set size for Sum, times the scale factors).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch

from hpcdl.torch import async_ops as _a
from hpcdl.torch.compression import Compression, Compressor
from hpcdl.torch.process_sets import ProcessSet, global_process_set
from hpcdl.torch.reduce_ops import Average, Sum, resolve_op

synchronize = _a.synchronize


# ---- allreduce ----------------------------------------------------------------------------------------


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):  # type: ignore[override]
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return synchronize(
            _a.allreduce_async(
                tensor,
                name=name,
                op=op,
                prescale_factor=prescale_factor,
                postscale_factor=postscale_factor,
                process_set=process_set,
            )
        )

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = allreduce(
            grad_output,
            op=ctx.op,
            prescale_factor=ctx.prescale_factor,
            postscale_factor=ctx.postscale_factor,
            process_set=ctx.process_set,
        )
        return grad, None, None, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression: type[Compressor] = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce ``tensor`` over the ranks of ``process_set`` and return the result (default op Average).

    ``compression`` (e.g. ``hvd.Compression.fp16``) shrinks what travels; the result has the input's dtype.
    Differentiable: the gradient is the same allreduce of the incoming gradient.
    """
    op = resolve_op(op, average)
    _a.check_tensor(tensor, "allreduce")
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def allreduce_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """In-place ``allreduce``: ``tensor`` receives the result and is returned."""
    return synchronize(
        _a.allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    )


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):  # type: ignore[override]
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return tuple(
            synchronize(
                _a.grouped_allreduce_async(
                    list(tensors),
                    name=name,
                    op=op,
                    prescale_factor=prescale_factor,
                    postscale_factor=postscale_factor,
                    process_set=process_set,
                )
            )
        )

    @staticmethod
    def backward(ctx, *grad_output):  # type: ignore[override]
        grads = grouped_allreduce(
            list(grad_output),
            op=ctx.op,
            prescale_factor=ctx.prescale_factor,
            postscale_factor=ctx.postscale_factor,
            process_set=ctx.process_set,
        )
        return (None, None, None, None, None, *grads)


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression: type[Compressor] = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reduce a list of tensors as one fused, atomic group; returns the list of results."""
    op = resolve_op(op, average)
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    reduced = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set, *compressed)
    return [compression.decompress(t, c) for t, c in zip(reduced, ctxs)]


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """In-place ``grouped_allreduce``."""
    return synchronize(
        _a.grouped_allreduce_async_(
            tensors, average, name, op, prescale_factor, postscale_factor, process_set
        )
    )


# ---- allgather ----------------------------------------------------------------------------------------


def _offset_of_rank(rows: int, process_set: ProcessSet) -> int:
    """Where this rank's rows start in an allgather's output (rows may differ per rank)."""
    all_rows = allgather(torch.tensor([rows], dtype=torch.int64), process_set=process_set)
    return int(all_rows[: process_set.rank()].sum().item())


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):  # type: ignore[override]
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return synchronize(_a.allgather_async(tensor, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        offset = _offset_of_rank(ctx.rows, ctx.process_set)
        return reduced.narrow(0, offset, ctx.rows), None, None


def allgather(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Concatenate ``tensor`` from every rank of the set along dim 0 (its size may differ per rank)."""
    _a.check_rows(tensor, "allgather")
    return _Allgather.apply(tensor, name, process_set)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):  # type: ignore[override]
        ctx.rows, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(
            synchronize(_a.grouped_allgather_async(list(tensors), name=name, process_set=process_set))
        )

    @staticmethod
    def backward(ctx, *grad_output):  # type: ignore[override]
        reduced = grouped_allreduce(list(grad_output), op=Average, process_set=ctx.process_set)
        grads = [
            g.narrow(0, _offset_of_rank(rows, ctx.process_set), rows) for g, rows in zip(reduced, ctx.rows)
        ]
        return (None, None, *grads)


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> list[torch.Tensor]:
    """Allgather a list of tensors as one group."""
    for t in tensors:
        _a.check_rows(t, "grouped_allgather")
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


# ---- broadcast ----------------------------------------------------------------------------------------


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):  # type: ignore[override]
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(_a.broadcast_async(tensor, root_rank, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        from hpcdl.torch.basics import rank

        reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Return the tensor of global rank ``root_rank`` on every rank of the set (input unchanged)."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """In-place ``broadcast``: ``tensor`` receives the root's values and is returned."""
    return synchronize(_a.broadcast_async_(tensor, root_rank, name=name, process_set=process_set))


# ---- alltoall -----------------------------------------------------------------------------------------


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):  # type: ignore[override]
        output, received = synchronize(_a.alltoall_async(tensor, splits, name=name, process_set=process_set))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *unused):  # type: ignore[override]
        grad, _ = alltoall(grad_output, splits=ctx.received, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(
    tensor: torch.Tensor,
    splits: Any = None,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Send ``splits[i]`` rows of dim 0 to rank i of the set (an even split when None) and return the rows
    received, in rank order; with ``splits`` given, also the tensor of rows received from each rank."""
    _a.check_rows(tensor, "alltoall")
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    if splits is None:
        return output
    return output, received


# ---- reducescatter -------------------------------------------------------------------------------------


def _reducescatter_grad(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    factor = (ctx.process_set.size() if ctx.op == Sum else 1) * ctx.prescale_factor * ctx.postscale_factor
    return grad * factor if factor != 1 else grad


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):  # type: ignore[override]
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return synchronize(
            _a.reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor)
        )

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = allgather(_reducescatter_grad(ctx, grad_output), process_set=ctx.process_set)
        return grad, None, None, None, None, None


def reducescatter(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    compression: type[Compressor] = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce ``tensor`` over the set and return this rank's slice of dim 0 (the first ``rows % size``
    ranks get one extra row)."""
    _a.check_rows(tensor, "reducescatter")
    compressed, cctx = compression.compress(tensor)
    reduced = _Reducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(reduced, cctx)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):  # type: ignore[override]
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return tuple(
            synchronize(
                _a.grouped_reducescatter_async(
                    list(tensors), name, op, process_set, prescale_factor, postscale_factor
                )
            )
        )

    @staticmethod
    def backward(ctx, *grad_output):  # type: ignore[override]
        grads = grouped_allgather(
            [_reducescatter_grad(ctx, g) for g in grad_output], process_set=ctx.process_set
        )
        return (None, None, None, None, None, *grads)


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    compression: type[Compressor] = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Reducescatter a list of tensors as one group."""
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    reduced = _GroupedReducescatter.apply(
        name, op, process_set, prescale_factor, postscale_factor, *compressed
    )
    return [compression.decompress(t, c) for t, c in zip(reduced, ctxs)]
