"""CUDA tensors through the engine (the GPU path).

The engine decides, NCCL moves the data. A CUDA tensor is submitted to the same engine, by name, as a host
tensor (``Placement.DEVICE``): the same negotiation across ranks, response cache, validation of shape,
dtype, op, root and collective, stall inspector, join, process sets, groups and fusion by the fusion
threshold. The engine never touches device memory: it hands each decided batch, in the order every rank
agrees on, to this process's executor (``executor``), which runs it through ``torch.distributed``'s
``ProcessGroupNCCL`` and reports its end. So every rank starts its NCCL calls in the same order whatever
order its threads submitted in, and a rank that submits another shape, skips a tensor or calls another
collective gets ``HpcdlMismatchError`` or a stall report instead of a hang or a wrong result.

NCCL comes through ``torch.distributed`` rather than being loaded directly: PyTorch already holds the
communicators' life cycle, its caching allocator's stream bookkeeping and the NCCL build matching its own
CUDA, which a second copy of NCCL in the same process would have to duplicate (and could conflict with).

``HPCDL_GPU_OPERATIONS`` (``--gpu-operations``) chooses who moves the data: ``nccl`` (CUDA tensors; the
default when PyTorch has NCCL and a GPU is visible), ``host`` (CUDA tensors staged through host memory into
the engine's own data plane; the default otherwise) or ``gloo-standin``: every tensor, CPU ones included,
takes exactly this path with gloo process groups in place of NCCL, so that a script can exercise the GPU
path's logic on a machine without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from hpcdl import common
from hpcdl.common import config, engine
from hpcdl.common.exceptions import HpcdlConfigError
from hpcdl.common.ops import reducescatter_rows
from hpcdl.common.types import OpType, Placement
from hpcdl.torch import _handles
from hpcdl.torch._gpu.collectives import DeviceOp
from hpcdl.torch._gpu.executor import Executor
from hpcdl.torch._gpu.groups import Groups
from hpcdl.torch._gpu.lanes import Nvtx, caller_event
from hpcdl.torch._tensors import deliver, runtime_dtype


@dataclass
class _Path:
    mode: str  # "nccl" or "gloo-standin"
    executor: Executor
    device: Optional[torch.device] = None  # the one CUDA device of this rank's NCCL path, once used


_path: Optional[_Path] = None


def resolve_mode(setting: str) -> str:
    """``nccl``, ``host`` or ``gloo-standin`` for the ``gpu_operations`` setting."""
    nccl = dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available()
    if setting == "auto":
        return "nccl" if nccl else "host"
    if setting == "nccl" and not nccl:
        raise HpcdlConfigError(
            "HPCDL_GPU_OPERATIONS=nccl, but "
            + ("no CUDA GPU is visible" if dist.is_available() and dist.is_nccl_available() else
               "this PyTorch has no NCCL")
            + "; use HPCDL_GPU_OPERATIONS=host (CUDA tensors staged through host memory) or auto"
        )  # fmt: skip
    if setting == "gloo-standin" and not (dist.is_available() and dist.is_gloo_available()):
        raise HpcdlConfigError(
            "HPCDL_GPU_OPERATIONS=gloo-standin needs PyTorch's gloo backend, which is missing"
        )
    return setting


def mode() -> str:
    """Who moves the data of this job's CUDA tensors: ``nccl``, ``host`` or ``gloo-standin``."""
    return _path.mode if _path is not None else "host"


def on_init() -> None:
    """Collective over the world, called by ``hvd.init()``: open the process groups' store and start the
    executor when the GPU path is in use."""
    global _path
    _path = None
    settings = config.resolve()
    chosen = resolve_mode(settings.get("gpu_operations"))
    if chosen == "host":
        return
    nccl = chosen == "nccl"
    groups = Groups.open("nccl" if nccl else "gloo", float(settings.get("timeout_s")))
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    nvtx = Nvtx(nccl and not settings.get("disable_nvtx_ranges"))
    _path = _Path(chosen, Executor(groups, int(settings.get("num_nccl_streams")), device, nvtx))


def on_shutdown() -> None:
    global _path
    path, _path = _path, None
    if path is not None:
        path.executor.stop()


def takes(tensors: Sequence[torch.Tensor]) -> bool:
    """True when these tensors go through the GPU path (CUDA tensors with NCCL; any with the stand-in)."""
    path = _path
    if path is None:
        return False
    return path.mode == "gloo-standin" or all(t.is_cuda for t in tensors)


# ---- submitting -----------------------------------------------------------------------------------


def _detached(tensor: torch.Tensor) -> torch.Tensor:
    # A gradient (what the optimizer's hooks submit) needs no detaching: one object less per tensor.
    return tensor.detach() if tensor.requires_grad else tensor


def _staged(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's values as a contiguous tensor on its device (a copy on the caller's stream for any
    other layout; the caller's stream event recorded after it covers the copy)."""
    t = _detached(tensor)
    return t if t.is_contiguous() else t.contiguous()


def _result_buffer(target: torch.Tensor) -> torch.Tensor:
    """Where the executor writes a result meant for ``target``: itself, or a contiguous buffer that
    :func:`deliver` copies from."""
    t = _detached(target)
    return t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)


def _check_device(path: _Path, tensors: Sequence[torch.Tensor]) -> None:
    if path.mode != "nccl":
        return
    for t in tensors:
        if path.device is None:
            path.device = t.device
        elif t.device != path.device:
            raise HpcdlConfigError(
                f"hpcdl's NCCL path runs one GPU per rank: this rank submitted tensors on {path.device}, now "
                f"one on {t.device}; move it there, or call torch.cuda.set_device(hvd.local_rank()) before "
                "creating tensors"
            )


def _submit(
    op_type: OpType, ops: list[DeviceOp], name: Optional[str], process_set: int, **request: Any
) -> list[engine.Handle]:
    """Submit one device operation per entry of ``ops`` (an atomic group when there are several), after
    the caller's stream has reached them: each handle completes when its batch ended on the device."""
    path = _path
    assert path is not None
    _check_device(path, [op.input for op in ops])
    events: dict[torch.device, Optional[torch.cuda.Event]] = {}
    for op in ops:  # one event per device and call: they are all on the caller's current stream
        device = op.input.device
        op.ready = events[device] if device in events else events.setdefault(device, caller_event(device))
    grouped = len(ops) > 1
    group_id = engine.new_group_id(process_set) if grouped else 0
    handles = []
    for i, op in enumerate(ops):
        tag = path.executor.register(op)
        try:
            handles.append(
                engine.submit(
                    op_type,
                    f"{name}.{i}" if grouped and name is not None else name,
                    process_set,
                    runtime_dtype(op.input),
                    op.input.data_ptr(),
                    op.output.data_ptr() if op.output is not None else None,
                    tuple(op.input.shape) or (1,),  # a 0-d tensor travels as one element
                    group_id=group_id,
                    group_size=len(ops) if grouped else 0,
                    keep=op,
                    placement=Placement.DEVICE,
                    tag=tag,
                    **request,
                )
            )
        except BaseException:
            path.executor.forget(tag)
            raise
    return handles


def allreduce(
    tensors: list[torch.Tensor],
    outputs: list[torch.Tensor],
    name: Optional[str],
    process_set: int,
    request: dict[str, Any],
) -> int:
    """Submit one allreduce or an atomic group; ``outputs[i]`` may be ``tensors[i]`` (in place).
    ``synchronize`` returns the list of outputs."""
    ops = []
    for t, out in zip(tensors, outputs):
        source = _staged(t)
        ops.append(DeviceOp(source, source if out is t else _result_buffer(out)))
    handles = _submit(OpType.ALLREDUCE, ops, name, process_set, **request)

    def finish() -> list[torch.Tensor]:
        results = []
        for op, out in zip(ops, outputs):
            op.hand_over()
            assert op.output is not None
            results.append(deliver(op.output, out))
        return results

    return _handles.register(handles, finish, keep_alive=(tensors, outputs))


def allgather(tensors: list[torch.Tensor], name: Optional[str], process_set: int) -> int:
    """Submit one allgather or a group; ``synchronize`` returns the list of gathered tensors."""
    ops = [DeviceOp(_staged(t)) for t in tensors]
    handles = _submit(OpType.ALLGATHER, ops, name, process_set)

    def finish() -> list[torch.Tensor]:
        for op in ops:
            op.hand_over()
        return [op.output for op in ops]  # type: ignore[misc]

    return _handles.register(handles, finish, keep_alive=(tensors,))


def broadcast(
    tensor: torch.Tensor, output: torch.Tensor, root_rank: int, name: Optional[str], process_set: int
) -> int:
    """Submit one broadcast; ``output`` may be ``tensor`` (in place). ``synchronize`` returns ``output``."""
    source = _staged(tensor)
    op = DeviceOp(source, source if output is tensor else _result_buffer(output))
    handles = _submit(OpType.BROADCAST, [op], name, process_set, root=root_rank)

    def finish() -> torch.Tensor:
        op.hand_over()
        assert op.output is not None
        return deliver(op.output, output)

    return _handles.register(handles, finish, keep_alive=(tensor, output))


def alltoall(
    tensor: torch.Tensor,
    splits: Optional[list[int]],
    splits_dtype: torch.dtype,
    name: Optional[str],
    process_set: int,
) -> int:
    """Submit one alltoall; ``synchronize`` returns ``(output, received_splits)``."""
    op = DeviceOp(_staged(tensor), splits=splits)
    handles = _submit(OpType.ALLTOALL, [op], name, process_set, splits=splits)

    def finish() -> tuple[torch.Tensor, torch.Tensor]:
        op.hand_over()
        assert op.output is not None and op.received is not None
        return op.output, torch.tensor(op.received, dtype=splits_dtype)

    return _handles.register(handles, finish, keep_alive=(tensor,))


def reducescatter(
    tensors: list[torch.Tensor], name: Optional[str], process_set: int, request: dict[str, Any]
) -> int:
    """Submit one reducescatter or a group; ``synchronize`` returns the list of this rank's slices."""
    size, me = common.process_set_size(process_set), common.process_set_rank(process_set)
    ops = []
    for t in tensors:
        source = _staged(t)
        rows = (reducescatter_rows(t.shape[0], size, me), *t.shape[1:])
        ops.append(DeviceOp(source, torch.empty(rows, dtype=t.dtype, device=t.device)))
    handles = _submit(OpType.REDUCESCATTER, ops, name, process_set, **request)

    def finish() -> list[torch.Tensor]:
        for op in ops:
            op.hand_over()
        return [op.output for op in ops]  # type: ignore[misc]

    return _handles.register(handles, finish, keep_alive=(tensors,))
