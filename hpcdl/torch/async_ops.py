"""Asynchronous and in-place collectives on tensors (Horovod's ``*_async``, ``*_`` ops, ``poll``,
``synchronize``, ``join``, ``barrier``).

Each collective has one launcher (``allreduce_launch``, ``allgather_launch``, ...) that checks its
arguments, stages the tensors and submits them: to the engine for CPU tensors (zero-copy when a tensor is
contiguous, a contiguous copy of any other layout otherwise: see ``_tensors``), or to ``_gpu`` for the
tensors of the GPU path (negotiated by the same engine; NCCL moves them). The public ``*_async``
functions are Horovod-signature wrappers around the launchers; ``ops`` builds the blocking,
differentiable collectives on the same launchers, and on the ``*_now`` functions (one submission of a
contiguous host tensor, waited for at once, without the launcher's handle record) for calls autograd need
not record. What a launcher needs besides the tensors travels in one small record per collective shape
(:class:`Reduction`, ...), which the differentiable ops also keep for their gradients.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple, Optional

import torch

from hpcdl import common
from hpcdl.common import engine
from hpcdl.common.exceptions import HpcdlConfigError
from hpcdl.common.memory import POOL_FROM_BYTES
from hpcdl.common.ops import reducescatter_rows
from hpcdl.common.types import OpType
from hpcdl.torch import _adasum, _gpu, _handles
from hpcdl.torch._tensors import deliver as _deliver
from hpcdl.torch._tensors import (
    is_direct,
    new_result,
    overlaps_itself,
    readable,
    runtime_dtype,
    tensor_from_output,
    writable,
)
from hpcdl.torch.process_sets import ProcessSet, global_process_set, id_of
from hpcdl.torch.reduce_ops import Adasum, Average, check_op, resolve_op, runtime_op

poll = _handles.poll
synchronize = _handles.synchronize
# module globals: looking a member up on its enum class costs ~0.1 us
_ALLREDUCE, _ALLGATHER, _ALLTOALL = OpType.ALLREDUCE, OpType.ALLGATHER, OpType.ALLTOALL
_BROADCAST, _REDUCESCATTER = OpType.BROADCAST, OpType.REDUCESCATTER


class Reduction(NamedTuple):
    """How an allreduce or reducescatter combines the ranks' tensors (and so how its gradient does). A
    named tuple: built once per call, in 0.17 us against 0.39 us for a frozen dataclass."""

    op: int
    prescale: float = 1.0
    postscale: float = 1.0
    process_set: ProcessSet = global_process_set

    def request(self) -> dict[str, Any]:
        """The fields of an engine request that carry this reduction (the op is checked by the caller)."""
        return {
            "reduce_op": runtime_op(self.op),
            "prescale": float(self.prescale),
            "postscale": float(self.postscale),
        }


# ---- arguments ------------------------------------------------------------------------------------


def check_name(name: Optional[str]) -> Optional[str]:
    if name is not None and not isinstance(name, str):
        raise HpcdlConfigError(f"name must be a string or None, got {name!r}")
    return name or None


def _member_name(name: Optional[str], index: int) -> Optional[str]:
    return None if name is None else f"{name}.{index}"


def check_tensor(tensor: Any, what: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise HpcdlConfigError(f"{what} takes a torch.Tensor, got {type(tensor).__name__}")
    return tensor


def check_rows(tensor: Any, what: str) -> torch.Tensor:
    check_tensor(tensor, what)
    if tensor.dim() == 0:
        raise HpcdlConfigError(
            f"{what} works on the first dimension, but got a 0-d tensor; reshape it, e.g. tensor.reshape(1)"
        )
    return tensor


def check_group(tensors: Sequence[torch.Tensor], what: str) -> list[torch.Tensor]:
    tensors = list(tensors)
    if not tensors:
        raise HpcdlConfigError(f"{what} needs a non-empty list of tensors")
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise HpcdlConfigError(
                f"{what} takes a list of tensors, got an element of type {type(t).__name__}"
            )
    return tensors


def check_in_place(tensor: torch.Tensor, what: str) -> torch.Tensor:
    check_tensor(tensor, what)
    if overlaps_itself(tensor):
        raise HpcdlConfigError(
            f"{what} writes its result into the tensor, but several of its elements share memory (e.g. a "
            "view made by expand()); pass tensor.clone(), or use the out-of-place form"
        )
    return tensor


def new_output(tensor: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor of the input's shape, dtype and device, for an out-of-place result. A large
    one in host memory comes from ``hpcdl.common.memory``'s pool (warm, on huge pages); like any tensor
    made from a buffer, it cannot be resized beyond its size."""
    if tensor.nbytes >= POOL_FROM_BYTES and tensor.is_cpu:  # nbytes first: the cheaper look at a small one
        return new_result(tensor.shape, tensor.dtype)
    if tensor.is_contiguous():  # empty_like keeps its layout; naming the format costs 0.15 us more
        return torch.empty_like(tensor)
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


# ---- submitting -----------------------------------------------------------------------------------


def _enqueue(
    op_type: OpType,
    sources: list[torch.Tensor],
    results: Optional[list[torch.Tensor]],
    name: Optional[str],
    ps_id: int,
    wait: bool = False,
    **request: Any,
) -> list[engine.Handle]:
    """Submit one operation per source (an atomic group when there are several). ``results[i]`` is the
    caller-owned buffer the engine writes (None where the engine allocates the output). Each handle keeps
    the tensors it refers to alive until the engine is done with them. ``wait``: the caller synchronizes
    next, so a lone operation is run at once, on this thread when the engine is idle (see
    ``engine.enqueue``); a group is submitted whole first."""
    grouped = len(sources) > 1
    group_id = engine.new_group_id(ps_id) if grouped else 0
    group_size = len(sources) if grouped else 0
    handles = []
    # engine.submit takes the addresses themselves: no Buffer per tensor (a group of 64 small tensors
    # spent a third of its time building and unpacking them).
    for i, src in enumerate(sources):
        out = results[i] if results is not None else None
        handles.append(
            engine.submit(
                op_type,
                _member_name(name, i) if grouped else name,
                ps_id,
                runtime_dtype(src),
                src.data_ptr(),
                None if out is None else out.data_ptr(),
                tuple(src.shape) or (1,),  # a 0-d tensor travels as one element
                group_id=group_id,
                group_size=group_size,
                keep=(src, out),
                wait=wait and not grouped,
                **request,
            )
        )
    return handles


def _single(handle: int) -> int:
    """For a launcher run on one tensor: ``synchronize`` returns that tensor, not a one-element list."""
    return _handles.unwrap_single(handle)


# ---- allreduce ------------------------------------------------------------------------------------


def allreduce_launch(
    tensors: list[torch.Tensor], outputs: list[torch.Tensor], name: Optional[str], how: Reduction
) -> int:
    """Submit one allreduce or an atomic group; ``outputs[i]`` may be ``tensors[i]`` (in place).
    ``synchronize`` returns the list of outputs."""
    op = check_op(how.op)
    ps_id = id_of(how.process_set)
    for t in tensors:
        runtime_dtype(t)
    if op == Adasum:
        return _adasum.allreduce_launch(tensors, outputs, name, how.process_set)
    if _gpu.takes(tensors):
        return _gpu.allreduce(tensors, outputs, name, ps_id, how.request())
    sources = [readable(t) for t in tensors]
    # In place on a staged copy: the engine reduces the copy, which is then delivered into the tensor.
    results = [src if out is t else writable(out) for t, out, src in zip(tensors, outputs, sources)]
    handles = _enqueue(OpType.ALLREDUCE, sources, results, name, ps_id, **how.request())

    def finish() -> list[torch.Tensor]:
        return [_deliver(r, out) for r, out in zip(results, outputs)]

    return _handles.register(handles, finish, keep_alive=(tensors, outputs))


def allreduce_one(tensor: torch.Tensor, output: torch.Tensor, name: Optional[str], how: Reduction) -> int:
    """Submit one allreduce; ``synchronize`` returns ``output``. A contiguous CPU tensor (every gradient a
    DistributedOptimizer hook hands over) goes to the engine in one call, its result written into
    ``output`` itself; anything else through :func:`allreduce_launch`."""
    if (
        how.op == Adasum
        or _gpu.takes((tensor,))
        or not is_direct(tensor)
        or not (output is tensor or is_direct(output))
    ):
        return _single(allreduce_launch([tensor], [output], name, how))
    address = tensor.data_ptr()
    handle = engine.submit(
        _ALLREDUCE,
        name,
        id_of(how.process_set),
        runtime_dtype(tensor),
        address,
        address if output is tensor else output.data_ptr(),
        tensor.shape or (1,),  # a 0-d tensor travels as one element
        runtime_op(check_op(how.op)),
        float(how.prescale),
        float(how.postscale),
        keep=(tensor, output),
        value=output,
    )
    return _handles.register_engine_handle(handle)


def allreduce_now(
    tensor: torch.Tensor,
    output: torch.Tensor,
    name: Optional[str],
    op: int,
    prescale: float,
    postscale: float,
    process_set: ProcessSet,
) -> bool:
    """The blocking allreduce of a contiguous CPU tensor into ``output`` (a fresh contiguous tensor, or the
    tensor itself): one call into the runtime, which runs the collective on this thread when the engine is
    idle (its direct path). False, with nothing submitted, where the general launcher must
    take the call (another layout or device, the GPU path, Adasum)."""
    # _direct, written out: a call costs 0.1 us of a 4-byte allreduce's 3.8
    if op == Adasum or not tensor.is_contiguous() or not tensor.is_cpu or _gpu.takes((tensor,)):
        return False
    address = tensor.data_ptr()
    engine.run(
        _ALLREDUCE,
        name,
        id_of(process_set),
        runtime_dtype(tensor),
        address,
        address if output is tensor else output.data_ptr(),
        tensor.shape or (1,),  # a 0-d tensor travels as one element
        runtime_op(op),
        float(prescale),
        float(postscale),
        0,
        (tensor, output),
    )
    return True


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
    how = Reduction(resolve_op(op, average), prescale_factor, postscale_factor, process_set)
    check_tensor(tensor, "allreduce")
    return allreduce_one(tensor, new_output(tensor), check_name(name), how)


def allreduce_async_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """In-place ``allreduce_async``: the result replaces ``tensor``'s contents (through any view)."""
    how = Reduction(resolve_op(op, average), prescale_factor, postscale_factor, process_set)
    check_in_place(tensor, "allreduce_")
    return allreduce_one(tensor, tensor, check_name(name), how)


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
    how = Reduction(resolve_op(op, average), prescale_factor, postscale_factor, process_set)
    tensors = check_group(tensors, "grouped_allreduce")
    return allreduce_launch(tensors, [new_output(t) for t in tensors], check_name(name), how)


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
    how = Reduction(resolve_op(op, average), prescale_factor, postscale_factor, process_set)
    tensors = [check_in_place(t, "grouped_allreduce_") for t in check_group(tensors, "grouped_allreduce_")]
    return allreduce_launch(tensors, tensors, check_name(name), how)


def sparse_allreduce_async(
    tensor: torch.Tensor, name: Optional[str], op: int, process_set: ProcessSet = global_process_set
) -> Callable[[], torch.Tensor]:
    """Reduce a sparse COO tensor by allgathering its indices and values (Horovod's approach).

    Returns a callable that waits and gives the reduced sparse tensor (``DistributedOptimizer`` calls it).
    """
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    base = name or "sparse_allreduce"
    indices_handle = allgather_async(
        t.indices().transpose(0, 1), name=f"{base}.indices", process_set=process_set
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


# ---- allgather ------------------------------------------------------------------------------------


def allgather_launch(
    tensors: list[torch.Tensor], name: Optional[str], process_set: ProcessSet, wait: bool = False
) -> int:
    """Submit one allgather or a group; ``synchronize`` returns the list of gathered tensors. ``wait``: the
    caller synchronizes next (see ``_enqueue``)."""
    ps_id = id_of(process_set)
    for t in tensors:
        check_rows(t, "allgather")
        runtime_dtype(t)
    if _gpu.takes(tensors):
        return _gpu.allgather(tensors, name, ps_id)
    sources = [readable(t) for t in tensors]
    # The usual result (every rank's rows alike), offered to the engine: written there, it needs no copy.
    size = common.process_set_size(ps_id)
    offered = [new_result((size * s.shape[0], *s.shape[1:]), s.dtype) for s in sources]
    handles = _enqueue(OpType.ALLGATHER, sources, offered, name, ps_id, wait)

    def finish() -> list[torch.Tensor]:
        return [tensor_from_output(h, t.dtype, o).to(t.device) for h, t, o in zip(handles, tensors, offered)]

    return _handles.register(handles, finish, keep_alive=(tensors,))


def _direct(tensor: torch.Tensor) -> bool:
    """True for a tensor a blocking call hands to the runtime as it is: contiguous, in host memory, not taken
    by the GPU path."""
    return tensor.is_contiguous() and tensor.is_cpu and not _gpu.takes((tensor,))


def _gathered(
    op_type: OpType,
    tensor: torch.Tensor,
    offered: torch.Tensor,
    name: Optional[str],
    ps_id: int,
    splits: Optional[list[int]] = None,
) -> tuple[torch.Tensor, Optional[list[int]]]:
    """One allgather or alltoall of a direct tensor, submitted and waited for at once (run on this thread
    when the engine is idle), into ``offered`` when the result fits it: the result, and for an alltoall given
    ``splits`` the rows received from each member."""
    handle = engine.submit(
        op_type, name, ps_id, runtime_dtype(tensor), tensor.data_ptr(), offered.data_ptr(), tensor.shape,
        splits=splits, keep=(tensor, offered), wait=True,
    )  # fmt: skip
    try:
        handle.wait()
        received = handle.received_splits() if splits is not None else None
        return tensor_from_output(handle, tensor.dtype, offered), received
    finally:
        handle.release()


def allgather_now(
    tensor: torch.Tensor, name: Optional[str], process_set: ProcessSet
) -> Optional[torch.Tensor]:
    """The blocking allgather of one tensor (checked by the caller), without the launcher's handle record:
    most of a small allgather's time was Python. None, with nothing submitted, where the launcher must take
    the call (another layout or device, the GPU path)."""
    if not _direct(tensor):
        return None
    ps_id = id_of(process_set)
    shape = tensor.shape
    offered = new_result((common.process_set_size(ps_id) * shape[0], *shape[1:]), tensor.dtype)
    return _gathered(_ALLGATHER, tensor, offered, name, ps_id)[0]


def allgather_async(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> int:
    """Start concatenating ``tensor`` from every rank of the set along dim 0 (sizes of dim 0 may differ)."""
    return _single(allgather_launch([check_rows(tensor, "allgather")], check_name(name), process_set))


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> int:
    """Allgather a list of tensors as one group; ``synchronize`` returns the list of results."""
    return allgather_launch(check_group(tensors, "grouped_allgather"), check_name(name), process_set)


# ---- broadcast ------------------------------------------------------------------------------------


def _check_root(root_rank: Any, process_set: ProcessSet) -> int:
    if not isinstance(root_rank, int) or isinstance(root_rank, bool):
        raise HpcdlConfigError(f"root_rank must be an int (a global rank), got {root_rank!r}")
    ps_id = id_of(process_set)
    if ps_id == 0 and 0 <= root_rank < common.size():  # the whole job: no list of its ranks to build
        return root_rank
    members = common.process_set_ranks(ps_id)
    if root_rank not in members:
        raise HpcdlConfigError(
            f"root_rank {root_rank} is not a member of {process_set} (ranks {members}); "
            "broadcast roots are global ranks, as in Horovod"
        )
    return root_rank


def broadcast_launch(
    tensor: torch.Tensor,
    output: torch.Tensor,
    root_rank: int,
    name: Optional[str],
    process_set: ProcessSet,
    wait: bool = False,
) -> int:
    """Submit one broadcast; ``output`` may be ``tensor`` (in place). ``synchronize`` returns ``output``.
    ``wait``: the caller synchronizes next (see ``_enqueue``)."""
    ps_id = id_of(process_set)
    runtime_dtype(tensor)
    _check_root(root_rank, process_set)
    if _gpu.takes((tensor,)):
        return _gpu.broadcast(tensor, output, root_rank, name, ps_id)
    source = readable(tensor)
    result = source if output is tensor else writable(output)
    handles = _enqueue(OpType.BROADCAST, [source], [result], name, ps_id, wait, root=root_rank)

    def finish() -> torch.Tensor:
        return _deliver(result, output)

    return _handles.register(handles, finish, keep_alive=(tensor, output))


def broadcast_now(
    tensor: torch.Tensor, root_rank: int, name: Optional[str], process_set: ProcessSet, in_place: bool
) -> Optional[torch.Tensor]:
    """The blocking broadcast of one tensor (checked by the caller) into a fresh tensor, or into itself
    (``in_place``): one call into the runtime, which runs it on this thread when the engine is idle; the
    result. None, with nothing submitted, where the launcher must take the call (another layout or device,
    the GPU path)."""
    if not _direct(tensor):
        return None
    dtype = runtime_dtype(tensor)
    _check_root(root_rank, process_set)
    output = tensor if in_place else new_output(tensor)
    address = tensor.data_ptr()
    result = address if in_place else output.data_ptr()
    shape = tensor.shape or (1,)  # a 0-d tensor travels as one element
    engine.run(
        _BROADCAST,
        name,
        id_of(process_set),
        dtype,
        address,
        result,
        shape,
        root=root_rank,
        keep=(tensor, output),
    )
    return output


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start sending ``tensor`` from global rank ``root_rank`` to every rank of the set; the input is not
    modified, ``synchronize`` returns a new tensor."""
    check_tensor(tensor, "broadcast")
    return broadcast_launch(tensor, new_output(tensor), root_rank, check_name(name), process_set)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """In-place ``broadcast_async``: non-root ranks' ``tensor`` receives the root's values."""
    check_in_place(tensor, "broadcast_")
    return broadcast_launch(tensor, tensor, root_rank, check_name(name), process_set)


# ---- alltoall -------------------------------------------------------------------------------------


def _splits_list(splits: Any, rows: int, set_size: int) -> Optional[list[int]]:
    if splits is None:
        if rows % set_size != 0:
            raise HpcdlConfigError(
                f"alltoall without splits divides dim 0 evenly, but {rows} rows do not divide among "
                f"{set_size} ranks; pass splits=[rows for each rank]"
            )
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dtype == torch.bool:
            raise HpcdlConfigError(
                f"alltoall splits must hold integers (e.g. torch.int32), got {splits.dtype}"
            )
        values = splits.tolist()
    else:
        values = list(splits)
    if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in values):
        raise HpcdlConfigError(f"alltoall splits must be integers, got {values}")
    values = [int(v) for v in values]
    if len(values) != set_size or any(v < 0 for v in values) or sum(values) != rows:
        raise HpcdlConfigError(
            f"alltoall splits {values} must have one non-negative entry per rank of the set ({set_size}) "
            f"and sum to the tensor's first dimension ({rows})"
        )
    return values


def _splits_dtype(splits: Any) -> torch.dtype:
    """The dtype of the received splits an alltoall returns: the given splits' own, else int32 (Horovod's)."""
    return splits.dtype if isinstance(splits, torch.Tensor) else torch.int32


def alltoall_now(
    tensor: torch.Tensor, splits: Any, name: Optional[str], process_set: ProcessSet
) -> Optional[tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """The blocking alltoall of one tensor (checked by the caller), without the launcher's handle record: the
    rows received, and when ``splits`` was given the tensor of rows received from each member. None, with
    nothing submitted, where the launcher must take the call (another layout or device, the GPU path)."""
    if not _direct(tensor):
        return None
    ps_id = id_of(process_set)
    split_rows = _splits_list(splits, tensor.shape[0], common.process_set_size(ps_id))
    offered = new_result(tuple(tensor.shape), tensor.dtype)  # the usual result: as many rows as sent
    output, received = _gathered(_ALLTOALL, tensor, offered, name, ps_id, split_rows)
    if received is None:
        return output, None
    return output, torch.tensor(received, dtype=_splits_dtype(splits))


def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start sending ``splits[i]`` rows of ``tensor`` to rank i of the set (even split when None);
    ``synchronize`` returns ``(output, received_splits)``."""
    return alltoall_launch(tensor, splits, name, process_set)


def alltoall_launch(
    tensor: torch.Tensor, splits: Any, name: Optional[str], process_set: ProcessSet, wait: bool = False
) -> int:
    """``alltoall_async``; ``wait``: the caller synchronizes next (see ``_enqueue``)."""
    ps_id = id_of(process_set)
    check_rows(tensor, "alltoall")
    runtime_dtype(tensor)
    split_rows = _splits_list(splits, tensor.shape[0], common.process_set_size(ps_id))
    splits_dtype = _splits_dtype(splits)
    if _gpu.takes((tensor,)):
        return _gpu.alltoall(tensor, split_rows, splits_dtype, check_name(name), ps_id)
    source = readable(tensor)
    offered = new_result(tuple(source.shape), source.dtype)  # the usual result: as many rows as sent
    name = check_name(name)
    (handle,) = _enqueue(OpType.ALLTOALL, [source], [offered], name, ps_id, wait, splits=split_rows)

    def finish() -> tuple[torch.Tensor, torch.Tensor]:
        out = tensor_from_output(handle, tensor.dtype, offered)
        received = torch.tensor(handle.received_splits(), dtype=splits_dtype)
        return out.to(tensor.device), received

    return _handles.register([handle], finish, keep_alive=(tensor,))


# ---- reducescatter --------------------------------------------------------------------------------


def _checked_reducescatter(tensors: Sequence[torch.Tensor], how: Reduction) -> tuple[int, int, int]:
    """A reducescatter's checks; the process set's id and size and this rank's place in it."""
    if check_op(how.op) == Adasum:
        raise HpcdlConfigError("reducescatter does not support Adasum; use hvd.Average or hvd.Sum")
    ps_id = id_of(how.process_set)
    set_size, set_rank = common.process_set_size(ps_id), common.process_set_rank(ps_id)
    if set_rank < 0:
        raise HpcdlConfigError(f"this rank ({common.rank()}) is not a member of {how.process_set}")
    for t in tensors:
        check_rows(t, "reducescatter")
        runtime_dtype(t)
    return ps_id, set_size, set_rank


def _reducescatter_output(tensor: torch.Tensor, set_size: int, set_rank: int) -> torch.Tensor:
    """This rank's slice of a reducescatter of ``tensor``, to be written (Horovod's split of dim 0)."""
    rows = reducescatter_rows(tensor.shape[0], set_size, set_rank)
    return torch.empty((rows, *tensor.shape[1:]), dtype=tensor.dtype)


def reducescatter_launch(
    tensors: list[torch.Tensor], name: Optional[str], how: Reduction, wait: bool = False
) -> int:
    """Submit one reducescatter or a group; ``synchronize`` returns the list of this rank's slices.
    ``wait``: the caller synchronizes next (see ``_enqueue``)."""
    ps_id, set_size, set_rank = _checked_reducescatter(tensors, how)
    if _gpu.takes(tensors):
        return _gpu.reducescatter(tensors, name, ps_id, how.request())
    results = [_reducescatter_output(t, set_size, set_rank) for t in tensors]
    handles = _enqueue(
        OpType.REDUCESCATTER, [readable(t) for t in tensors], results, name, ps_id, wait, **how.request()
    )

    def finish() -> list[torch.Tensor]:
        return [out.to(t.device) for out, t in zip(results, tensors)]

    return _handles.register(handles, finish, keep_alive=(tensors,))


def reducescatter_now(tensor: torch.Tensor, name: Optional[str], how: Reduction) -> Optional[torch.Tensor]:
    """The blocking reducescatter of one tensor: one call into the runtime, which runs it on this thread when
    the engine is idle; this rank's slice. None, with nothing submitted, where the launcher must take the
    call (another layout or device, the GPU path)."""
    ps_id, set_size, set_rank = _checked_reducescatter((tensor,), how)
    if not _direct(tensor):
        return None
    output = _reducescatter_output(tensor, set_size, set_rank)
    dtype, address = runtime_dtype(tensor), tensor.data_ptr()
    engine.run(
        _REDUCESCATTER,
        name,
        ps_id,
        dtype,
        address,
        output.data_ptr(),
        tensor.shape,
        keep=(tensor, output),
        **how.request(),
    )
    return output


def reducescatter_async(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Start reducing ``tensor`` over the set and keep this rank's slice of dim 0."""
    how = Reduction(op, prescale_factor, postscale_factor, process_set)
    return _single(reducescatter_launch([check_rows(tensor, "reducescatter")], check_name(name), how))


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Reducescatter a list of tensors as one group; ``synchronize`` returns the list of slices."""
    how = Reduction(op, prescale_factor, postscale_factor, process_set)
    return reducescatter_launch(check_group(tensors, "grouped_reducescatter"), check_name(name), how)


# ---- join, barrier --------------------------------------------------------------------------------


def _wait(op_type: OpType, process_set: ProcessSet) -> engine.Handle:
    handle = engine.enqueue(op_type, None, process_set=id_of(process_set))
    try:
        handle.wait()
    except BaseException:
        handle.release()
        raise
    return handle


def join(device: int = -1) -> int:
    """Declare that this rank has no more data. Until every rank has joined, this rank keeps taking part
    in the others' allreduces with zeros (their allgathers, broadcasts, alltoalls and reducescatters fail,
    as in Horovod). Blocks until all ranks joined; returns the last rank to join."""
    handle = _wait(OpType.JOIN, global_process_set)
    try:
        return int(handle.join_result())
    finally:
        handle.release()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of the set has reached this barrier."""
    _wait(OpType.BARRIER, process_set).release()
