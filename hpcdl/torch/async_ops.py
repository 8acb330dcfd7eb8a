"""Asynchronous and in-place collectives on tensors (Horovod's ``*_async``, ``*_`` ops, ``poll``,
``synchronize``, ``join``, ``barrier``).

CPU tensors go to the engine zero-copy: the engine reads the tensor's memory and writes the result
straight into the output tensor. Non-contiguous tensors are copied to a contiguous buffer first. CUDA
tensors go through ``_gpu`` (NCCL through torch.distributed, or staged through host memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch

from hpcdl import common
from hpcdl.common import engine
from hpcdl.common.ops import reducescatter_rows
from hpcdl.common.types import OpType
from hpcdl.torch import _adasum, _gpu, _handles
from hpcdl.torch._tensors import buffer_of, runtime_dtype, tensor_from_bytes
from hpcdl.torch.process_sets import ProcessSet, global_process_set, id_of
from hpcdl.torch.reduce_ops import Adasum, Average, check_op, resolve_op, runtime_op

poll = _handles.poll
synchronize = _handles.synchronize
_ALLREDUCE = OpType.ALLREDUCE  # a module global: looking a member up on its enum class costs ~0.1 us


# ---- staging helpers -------------------------------------------------------------------------------


def _host_input(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with the input's data: the tensor itself when it already is one."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    return t.contiguous()


def _host_output(target: torch.Tensor) -> torch.Tensor:
    """Where the engine writes a result meant for ``target``: ``target`` itself when it can."""
    t = target.detach()
    if t.device.type == "cpu" and t.is_contiguous():
        return t
    return torch.empty(tuple(t.shape), dtype=t.dtype)


def _deliver(result: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Copy a host result into ``target`` unless the engine already wrote there."""
    if result.data_ptr() != target.data_ptr() or result.device != target.device:
        with torch.no_grad():
            target.copy_(result)
    return target


def _check_name(name: Optional[str]) -> Optional[str]:
    if name is not None and not isinstance(name, str):
        raise ValueError(f"name must be a string or None, got {name!r}")
    return name or None


def _member_name(name: Optional[str], index: int) -> Optional[str]:
    return None if name is None else f"{name}.{index}"


def check_tensor(tensor: Any, what: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{what} takes a torch.Tensor, got {type(tensor).__name__}")
    return tensor


def _check_group(tensors: Sequence[torch.Tensor], what: str) -> list[torch.Tensor]:
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{what} needs a non-empty list of tensors")
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{what} takes a list of tensors, got an element of type {type(t).__name__}")
    return tensors


def check_rows(tensor: torch.Tensor, what: str) -> None:
    check_tensor(tensor, what)
    if tensor.dim() == 0:
        raise ValueError(
            f"{what} works on the first dimension, but got a 0-d tensor; reshape it, e.g. tensor.reshape(1)"
        )


# ---- allreduce ---------------------------------------------------------------------------------------


def _allreduce_launch(
    tensors: list[torch.Tensor],
    outputs: list[torch.Tensor],
    name: Optional[str],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    """Submit one allreduce (one tensor) or one atomic group; outputs[i] may be tensors[i] (in place)."""
    op = check_op(op)
    ps_id = id_of(process_set)
    for t in tensors:
        runtime_dtype(t)
    if op == Adasum:
        return _adasum.allreduce_launch(tensors, outputs, name, process_set)
    if _gpu.uses_nccl(tensors):
        return _gpu.allreduce(tensors, outputs, op, prescale_factor, postscale_factor, ps_id)
    group_id, group_size = (engine.new_group_id(), len(tensors)) if len(tensors) > 1 else (0, 0)
    handles, results = [], []
    for i, (t, out) in enumerate(zip(tensors, outputs)):
        src = _host_input(t)
        dst = src if out is t else _host_output(out)
        results.append(dst)
        handles.append(
            engine.enqueue(
                OpType.ALLREDUCE,
                buffer_of(src),
                buffer_of(dst),
                name=name if len(tensors) == 1 else _member_name(name, i),
                process_set=ps_id,
                reduce_op=runtime_op(op),
                prescale=float(prescale_factor),
                postscale=float(postscale_factor),
                group_id=group_id,
                group_size=group_size,
            )
        )

    def finish() -> list[torch.Tensor]:
        return [_deliver(r, out) for r, out in zip(results, outputs)]

    return _handles.register(handles, finish, keep_alive=(tensors, outputs, results))


def _allreduce_one(
    tensor: torch.Tensor,
    output: torch.Tensor,
    name: Optional[str],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    """Submit one allreduce. A contiguous CPU tensor (every gradient a DistributedOptimizer hook hands
    over) goes to the engine in one call, its result being ``output`` itself; anything else (Adasum, CUDA,
    non-contiguous tensors) through :func:`_allreduce_launch`."""
    direct = (
        op != Adasum
        and tensor.is_cpu
        and tensor.is_contiguous()
        and (output is tensor or (output.is_cpu and output.is_contiguous()))
    )
    if not direct:
        return _single(
            lambda: _allreduce_launch(
                [tensor], [output], name, op, prescale_factor, postscale_factor, process_set
            )
        )
    address = tensor.data_ptr()
    handle = engine.submit(
        _ALLREDUCE,
        name,
        id_of(process_set),
        runtime_dtype(tensor),
        address,
        address if output is tensor else output.data_ptr(),
        tensor.shape or (1,),  # a 0-d tensor travels as one element
        runtime_op(op),
        float(prescale_factor),
        float(postscale_factor),
        keep=(tensor, output),
        value=output,
    )
    return _handles.register_engine_handle(handle)


def _single(launch: Callable[[], int]) -> int:
    """Run a launcher for one tensor; ``synchronize`` then returns that tensor, not a one-element list."""
    return _handles.unwrap_single(launch())


def allreduce_async(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start reducing ``tensor`` over the ranks of ``process_set`` (default op Average); the input is not
    modified. Returns a handle for ``poll``/``synchronize``."""
    check_tensor(tensor, "allreduce")
    op = resolve_op(op, average)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_one(
        tensor, output, _check_name(name), op, prescale_factor, postscale_factor, process_set
    )


def allreduce_async_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """In-place ``allreduce_async``: the result replaces ``tensor``'s contents."""
    check_tensor(tensor, "allreduce_")
    op = resolve_op(op, average)
    return _allreduce_one(
        tensor, tensor, _check_name(name), op, prescale_factor, postscale_factor, process_set
    )


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Reduce a list of tensors as one atomic, fused group; ``synchronize`` returns the list of results."""
    op = resolve_op(op, average)
    tensors = _check_group(tensors, "grouped_allreduce")
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _allreduce_launch(
        tensors, outputs, _check_name(name), op, prescale_factor, postscale_factor, process_set
    )


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """In-place ``grouped_allreduce_async``."""
    op = resolve_op(op, average)
    tensors = _check_group(tensors, "grouped_allreduce_")
    return _allreduce_launch(
        tensors, tensors, _check_name(name), op, prescale_factor, postscale_factor, process_set
    )


def sparse_allreduce_async(
    tensor: torch.Tensor, name: Optional[str], op: int, process_set: ProcessSet = global_process_set
) -> Callable[[], torch.Tensor]:
    """Reduce a sparse COO tensor by allgathering its indices and values (Horovod's approach).

    Returns a callable that waits and gives the reduced sparse tensor (``DistributedOptimizer`` calls it).
    """
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    base = name or "sparse_allreduce"
    indices_handle = allgather_async(
        t.indices().transpose(0, 1).contiguous(), name=f"{base}.indices", process_set=process_set
    )
    values_handle = allgather_async(t.values(), name=f"{base}.values", process_set=process_set)

    def result() -> torch.Tensor:
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        if op == Average:
            values = values / process_set.size()
        if indices.dim() == 0 or values.dim() == 0:
            return t.new().resize_as_(t)
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(), check_invariants=True)

    return result


# ---- allgather --------------------------------------------------------------------------------------


def _allgather_launch(tensors: list[torch.Tensor], name: Optional[str], process_set: ProcessSet) -> int:
    ps_id = id_of(process_set)
    for t in tensors:
        check_rows(t, "allgather")
        runtime_dtype(t)
    if _gpu.uses_nccl(tensors):
        return _gpu.allgather(tensors, ps_id)
    group_id, group_size = (engine.new_group_id(), len(tensors)) if len(tensors) > 1 else (0, 0)
    handles, inputs = [], []
    for i, t in enumerate(tensors):
        src = _host_input(t)
        inputs.append(src)
        handles.append(
            engine.enqueue(
                OpType.ALLGATHER,
                buffer_of(src),
                None,
                name=name if len(tensors) == 1 else _member_name(name, i),
                process_set=ps_id,
                group_id=group_id,
                group_size=group_size,
            )
        )

    def finish() -> list[torch.Tensor]:
        return [
            tensor_from_bytes(h.output(), t.dtype, tuple(h.output_shape())).to(t.device)
            for h, t in zip(handles, tensors)
        ]

    return _handles.register(handles, finish, keep_alive=(tensors, inputs))


def allgather_async(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> int:
    """Start concatenating ``tensor`` from every rank of the set along dim 0 (sizes of dim 0 may differ)."""
    return _single(lambda: _allgather_launch([tensor], _check_name(name), process_set))


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> int:
    """Allgather a list of tensors as one group; ``synchronize`` returns the list of results."""
    return _allgather_launch(_check_group(tensors, "grouped_allgather"), _check_name(name), process_set)


# ---- broadcast --------------------------------------------------------------------------------------


def _check_root(root_rank: int, process_set: ProcessSet) -> int:
    if not isinstance(root_rank, int) or isinstance(root_rank, bool):
        raise ValueError(f"root_rank must be an int (a global rank), got {root_rank!r}")
    members = common.process_set_ranks(id_of(process_set))
    if root_rank not in members:
        raise ValueError(
            f"root_rank {root_rank} is not a member of {process_set} (ranks {members}); "
            "broadcast roots are global ranks, as in Horovod"
        )
    return root_rank


def _broadcast_launch(
    tensor: torch.Tensor, output: torch.Tensor, root_rank: int, name: Optional[str], process_set: ProcessSet
) -> int:
    ps_id = id_of(process_set)
    runtime_dtype(tensor)
    _check_root(root_rank, process_set)
    if _gpu.uses_nccl([tensor]):
        return _gpu.broadcast(tensor, output, root_rank, ps_id)
    if output is tensor:
        buf = _host_output(tensor)
        if buf.data_ptr() != tensor.data_ptr() or tensor.device.type != "cpu":
            buf.copy_(tensor.detach())
    else:
        buf = torch.empty(tuple(tensor.shape), dtype=tensor.dtype)
        buf.copy_(tensor.detach())
    handle = engine.enqueue(
        OpType.BROADCAST, buffer_of(buf), buffer_of(buf), name=name, process_set=ps_id, root=root_rank
    )

    def finish() -> torch.Tensor:
        return _deliver(buf, output)

    return _handles.register([handle], finish, keep_alive=(tensor, output, buf))


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start sending ``tensor`` from global rank ``root_rank`` to every rank of the set; the input is not
    modified, ``synchronize`` returns a new tensor."""
    check_tensor(tensor, "broadcast")
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _broadcast_launch(tensor, output, root_rank, _check_name(name), process_set)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """In-place ``broadcast_async``: non-root ranks' ``tensor`` receives the root's values."""
    check_tensor(tensor, "broadcast_")
    return _broadcast_launch(tensor, tensor, root_rank, _check_name(name), process_set)


# ---- alltoall -------------------------------------------------------------------------------------


def _splits_list(splits: Any, rows: int, set_size: int) -> Optional[list[int]]:
    if splits is None:
        if rows % set_size != 0:
            raise ValueError(
                f"alltoall without splits divides dim 0 evenly, but {rows} rows do not divide among "
                f"{set_size} ranks; pass splits=[rows for each rank]"
            )
        return None
    values = splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
    values = [int(v) for v in values]
    if len(values) != set_size or any(v < 0 for v in values) or sum(values) != rows:
        raise ValueError(
            f"alltoall splits {values} must have one non-negative entry per rank of the set ({set_size}) "
            f"and sum to the tensor's first dimension ({rows})"
        )
    return values


def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start sending ``splits[i]`` rows of ``tensor`` to rank i of the set (even split when None);
    ``synchronize`` returns ``(output, received_splits)``."""
    ps_id = id_of(process_set)
    check_rows(tensor, "alltoall")
    runtime_dtype(tensor)
    split_rows = _splits_list(splits, tensor.shape[0], common.process_set_size(ps_id))
    splits_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
    if _gpu.uses_nccl([tensor]):
        return _gpu.alltoall(tensor, split_rows, splits_dtype, ps_id)
    src = _host_input(tensor)
    handle = engine.enqueue(
        OpType.ALLTOALL, buffer_of(src), None, name=_check_name(name), process_set=ps_id, splits=split_rows
    )

    def finish() -> tuple[torch.Tensor, torch.Tensor]:
        out = tensor_from_bytes(handle.output(), tensor.dtype, tuple(handle.output_shape()))
        received = torch.tensor(handle.received_splits(), dtype=splits_dtype)
        return out.to(tensor.device), received

    return _handles.register([handle], finish, keep_alive=(tensor, src))


# ---- reducescatter --------------------------------------------------------------------------------


def _reducescatter_launch(
    tensors: list[torch.Tensor],
    name: Optional[str],
    op: int,
    process_set: ProcessSet,
    prescale_factor: float,
    postscale_factor: float,
) -> int:
    op = check_op(op)
    if op == Adasum:
        raise ValueError("reducescatter does not support Adasum; use hvd.Average or hvd.Sum")
    ps_id = id_of(process_set)
    set_size, set_rank = common.process_set_size(ps_id), common.process_set_rank(ps_id)
    if set_rank < 0:
        raise ValueError(f"this rank ({common.rank()}) is not a member of {process_set}")
    for t in tensors:
        check_rows(t, "reducescatter")
        runtime_dtype(t)
    if _gpu.uses_nccl(tensors):
        return _gpu.reducescatter(tensors, op, prescale_factor, postscale_factor, ps_id)
    group_id, group_size = (engine.new_group_id(), len(tensors)) if len(tensors) > 1 else (0, 0)
    handles, inputs, outputs = [], [], []
    for i, t in enumerate(tensors):
        src = _host_input(t)
        out = torch.empty((reducescatter_rows(t.shape[0], set_size, set_rank), *t.shape[1:]), dtype=t.dtype)
        inputs.append(src)
        outputs.append(out)
        handles.append(
            engine.enqueue(
                OpType.REDUCESCATTER,
                buffer_of(src),
                buffer_of(out),
                name=name if len(tensors) == 1 else _member_name(name, i),
                process_set=ps_id,
                reduce_op=runtime_op(op),
                prescale=float(prescale_factor),
                postscale=float(postscale_factor),
                group_id=group_id,
                group_size=group_size,
            )
        )

    def finish() -> list[torch.Tensor]:
        return [out.to(t.device) for out, t in zip(outputs, tensors)]

    return _handles.register(handles, finish, keep_alive=(tensors, inputs, outputs))


def reducescatter_async(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Start reducing ``tensor`` over the set and keep this rank's slice of dim 0."""
    return _single(
        lambda: _reducescatter_launch(
            [tensor], _check_name(name), op, process_set, prescale_factor, postscale_factor
        )
    )


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Reducescatter a list of tensors as one group; ``synchronize`` returns the list of slices."""
    return _reducescatter_launch(
        _check_group(tensors, "grouped_reducescatter"),
        _check_name(name),
        op,
        process_set,
        prescale_factor,
        postscale_factor,
    )


# ---- join, barrier --------------------------------------------------------------------------------


def join(device: int = -1) -> int:
    """Declare that this rank has no more data. Until every rank has joined, this rank keeps taking part
    in the others' allreduces with zeros. Blocks until all ranks joined; returns the last rank to join."""
    handle = engine.enqueue(OpType.JOIN, None)
    try:
        handle.wait()
        return int(handle.join_result())
    finally:
        handle.release()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of the set has reached this barrier."""
    handle = engine.enqueue(OpType.BARRIER, None, process_set=id_of(process_set))
    try:
        handle.wait()
    finally:
        handle.release()
