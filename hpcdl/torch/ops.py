"""Blocking, differentiable collectives on tensors (Horovod's ``allreduce``, ``allgather``, ...).

Each is an autograd Function around the launcher of ``async_ops``; a call autograd need not record (its
tensor wants no gradient, or grad mode is off) on a contiguous host tensor is one submission instead, made
and waited for by ``async_ops``' ``*_now`` functions, on this thread when the engine is idle.

Gradients follow Horovod 0.28 exactly, so that models port unchanged: allreduce's gradient is the same
allreduce of the incoming gradient; allgather's is the Average-allreduce of the incoming gradient, narrowed
to this rank's rows; broadcast's is the Average-allreduce of the incoming gradient on the root and zero
elsewhere; alltoall's is the reverse alltoall; reducescatter's is the allgather of the incoming gradient
(times the set size for Sum, times the scale factors). Incoming gradients of any layout (autograd often
hands over an expanded one) are staged like any other tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch

from hpcdl.torch import async_ops as _a
from hpcdl.torch.async_ops import Reduction, check_group, check_name, check_rows, check_tensor, new_output
from hpcdl.torch.compression import Compression, Compressor
from hpcdl.torch.process_sets import ProcessSet, global_process_set
from hpcdl.torch.reduce_ops import Average, Sum, resolve_op

synchronize = _a.synchronize


def _differentiated(tensor: torch.Tensor) -> bool:
    """True when autograd must record the collective (the tensor wants a gradient, and grad mode is on);
    else a blocking call is the collective alone, one call into the runtime (a loss or metric, a batch of
    ids, an object's bytes)."""
    return tensor.requires_grad and torch.is_grad_enabled()


def _compressed(tensors: Sequence[torch.Tensor], compression: type[Compressor]) -> tuple[list, list]:
    pairs = [compression.compress(t) for t in tensors]
    return [t for t, _ in pairs], [c for _, c in pairs]


# ---- allreduce ----------------------------------------------------------------------------------------


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, how, name, tensor):  # type: ignore[override]
        ctx.how = how
        return synchronize(_a.allreduce_one(tensor, new_output(tensor), name, how))

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        return None, None, _Allreduce.apply(ctx.how, None, grad_output)


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
    check_tensor(tensor, "allreduce")
    reduce_op = resolve_op(op, average)
    if compression is Compression.none and not _differentiated(tensor):
        output = new_output(tensor)
        if _a.allreduce_now(
            tensor, output, check_name(name), reduce_op, prescale_factor, postscale_factor, process_set
        ):
            return output
    how = Reduction(reduce_op, prescale_factor, postscale_factor, process_set)
    compressed, ctx = compression.compress(tensor)
    return compression.decompress(_Allreduce.apply(how, check_name(name), compressed), ctx)


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
    reduce_op = resolve_op(op, average)
    if isinstance(tensor, torch.Tensor) and _a.allreduce_now(
        tensor, tensor, check_name(name), reduce_op, prescale_factor, postscale_factor, process_set
    ):
        return tensor
    return synchronize(
        _a.allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    )


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, how, name, *tensors):  # type: ignore[override]
        ctx.how = how
        return tuple(
            synchronize(_a.allreduce_launch(list(tensors), [new_output(t) for t in tensors], name, how))
        )

    @staticmethod
    def backward(ctx, *grad_output):  # type: ignore[override]
        return (None, None, *_GroupedAllreduce.apply(ctx.how, None, *grad_output))


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
    how = Reduction(resolve_op(op, average), prescale_factor, postscale_factor, process_set)
    compressed, ctxs = _compressed(check_group(tensors, "grouped_allreduce"), compression)
    reduced = _GroupedAllreduce.apply(how, check_name(name), *compressed)
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


def _rows_of_this_rank(rows: list[int], process_set: ProcessSet) -> list[tuple[int, int]]:
    """(offset, rows) of this rank's slice of each of a group of allgather outputs (rows differ per
    rank: one allgather of every member's row counts)."""
    counts = allgather(torch.tensor([rows], dtype=torch.int64), process_set=process_set)
    before = counts[: process_set.rank()].sum(dim=0).tolist()
    return list(zip(before, rows))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, process_set, name, *tensors):  # type: ignore[override]
        ctx.process_set, ctx.rows = process_set, [t.shape[0] for t in tensors]
        return tuple(synchronize(_a.allgather_launch(list(tensors), name, process_set, wait=True)))

    @staticmethod
    def backward(ctx, *grad_output):  # type: ignore[override]
        how = Reduction(Average, process_set=ctx.process_set)
        reduced = _GroupedAllreduce.apply(how, None, *grad_output)
        slices = _rows_of_this_rank(ctx.rows, ctx.process_set)
        return (None, None, *[g.narrow(0, start, rows) for g, (start, rows) in zip(reduced, slices)])


def allgather(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Concatenate ``tensor`` from every rank of the set along dim 0 (its size may differ per rank)."""
    check_rows(tensor, "allgather")
    if not _differentiated(tensor):
        gathered = _a.allgather_now(tensor, check_name(name), process_set)
        if gathered is not None:
            return gathered
    (gathered,) = _Allgather.apply(process_set, check_name(name), tensor)
    return gathered


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> list[torch.Tensor]:
    """Allgather a list of tensors as one group."""
    tensors = [check_rows(t, "grouped_allgather") for t in check_group(tensors, "grouped_allgather")]
    return list(_Allgather.apply(process_set, check_name(name), *tensors))


# ---- broadcast ----------------------------------------------------------------------------------------


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, root_rank, process_set, name, tensor):  # type: ignore[override]
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(
            _a.broadcast_launch(tensor, new_output(tensor), root_rank, name, process_set, wait=True)
        )

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        from hpcdl.torch.basics import rank

        reduced = _Allreduce.apply(Reduction(Average, process_set=ctx.process_set), None, grad_output)
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return None, None, None, reduced


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Return the tensor of global rank ``root_rank`` on every rank of the set (input unchanged)."""
    check_tensor(tensor, "broadcast")
    if not _differentiated(tensor):
        output = _a.broadcast_now(tensor, root_rank, check_name(name), process_set, in_place=False)
        if output is not None:
            return output
    return _Broadcast.apply(root_rank, process_set, check_name(name), tensor)


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """In-place ``broadcast``: ``tensor`` receives the root's values and is returned."""
    _a.check_in_place(tensor, "broadcast_")
    if _a.broadcast_now(tensor, root_rank, check_name(name), process_set, in_place=True) is not None:
        return tensor
    return synchronize(
        _a.broadcast_launch(tensor, tensor, root_rank, check_name(name), process_set, wait=True)
    )


# ---- alltoall -----------------------------------------------------------------------------------------


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, splits, process_set, name, tensor):  # type: ignore[override]
        output, received = synchronize(_a.alltoall_launch(tensor, splits, name, process_set, wait=True))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *unused):  # type: ignore[override]
        grad, _ = _Alltoall.apply(ctx.received, ctx.process_set, None, grad_output)
        return None, None, None, grad


def alltoall(
    tensor: torch.Tensor,
    splits: Any = None,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Send ``splits[i]`` rows of dim 0 to rank i of the set (an even split when None) and return the rows
    received, in rank order; with ``splits`` given, also the tensor of rows received from each rank."""
    check_rows(tensor, "alltoall")
    name = check_name(name)
    exchanged = None if _differentiated(tensor) else _a.alltoall_now(tensor, splits, name, process_set)
    if exchanged is not None:
        output, received = exchanged
    else:
        output, received = _Alltoall.apply(splits, process_set, name, tensor)
    if splits is None:
        return output
    return output, received


# ---- reducescatter -------------------------------------------------------------------------------------


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, how, name, *tensors):  # type: ignore[override]
        ctx.how = how
        return tuple(synchronize(_a.reducescatter_launch(list(tensors), name, how, wait=True)))

    @staticmethod
    def backward(ctx, *grad_output):  # type: ignore[override]
        how = ctx.how
        factor = (how.process_set.size() if how.op == Sum else 1) * how.prescale * how.postscale
        gathered = _Allgather.apply(how.process_set, None, *grad_output)
        return (None, None, *[g * factor if factor != 1 else g for g in gathered])


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
    how = Reduction(op, prescale_factor, postscale_factor, process_set)
    compressed, ctx = compression.compress(check_rows(tensor, "reducescatter"))
    reduced = None if _differentiated(compressed) else _a.reducescatter_now(compressed, check_name(name), how)
    if reduced is None:
        (reduced,) = _Reducescatter.apply(how, check_name(name), compressed)
    return compression.decompress(reduced, ctx)


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
    how = Reduction(op, prescale_factor, postscale_factor, process_set)
    tensors = [check_rows(t, "grouped_reducescatter") for t in check_group(tensors, "grouped_reducescatter")]
    compressed, ctxs = _compressed(tensors, compression)
    reduced = _Reducescatter.apply(how, check_name(name), *compressed)
    return [compression.decompress(t, c) for t, c in zip(reduced, ctxs)]
