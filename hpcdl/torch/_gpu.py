"""CUDA tensors: NCCL through ``torch.distributed`` when PyTorch has it, otherwise staged through host
memory (the CPU path of ``async_ops`` copies device tensors to host, runs the engine, copies back).

NCCL path: at ``hvd.init()`` world rank 0 opens a ``torch.distributed.TCPStore`` and its address travels
to the other ranks through hpcdl's own broadcast; one ``ProcessGroupNCCL`` per process set is created on
first use. NCCL needs every rank to issue its collectives in the same order (as DDP does): gradient
hooks fire in the same autograd order on every rank, so ``DistributedOptimizer`` satisfies this.
Single-tensor allreduces are fused DDP-style: they fill buckets (per process set, dtype, op and scaling;
up to the fusion threshold, at most 32 MiB) that start when full or at the next wait, poll or other
collective; grouped allreduces are fused into one flat buffer per dtype. The NCCL path has no timeline.
Set ``HPCDL_GPU_OPERATIONS=host`` to stage through the engine instead (negotiation by name, fusion and
timeline of the engine).

Without a GPU, tests run this module's torch.distributed logic with gloo standing in for NCCL on CPU
tensors; the CUDA tests themselves are marked ``gpu``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

from hpcdl import common
from hpcdl.common import config
from hpcdl.common.ops import reducescatter_rows
from hpcdl.torch import _handles
from hpcdl.torch.reduce_ops import Average, Max, Min, Product, Sum

_ADDRESS_BYTES = 256


@dataclass
class _NcclState:
    store: Any
    bucket_bytes: int
    groups: dict[int, Any] = field(default_factory=dict)


_state: Optional[_NcclState] = None


def gpu_operations() -> str:
    """``nccl`` or ``host`` (setting ``gpu_operations``; auto: nccl when PyTorch has NCCL and a GPU)."""
    choice = config.resolve().get("gpu_operations")
    if choice == "host":
        return "host"
    if dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available():
        return "nccl"
    return "host"


def on_init() -> None:
    """Collective over the world, called by ``hvd.init()``: set up the NCCL store when it will be used."""
    global _state
    _state = None
    if gpu_operations() != "nccl" or common.size() == 1:
        return
    timeout = timedelta(seconds=float(config.resolve().get("timeout_s")))
    address = np.zeros(_ADDRESS_BYTES, dtype=np.uint8)
    store = None
    if common.rank() == 0:
        # The store listens on every interface; the others resolve rank 0's fully qualified name (which,
        # unlike gethostbyname(gethostname()) on Debian, is not a loopback alias).
        host = socket.getfqdn()
        store = dist.TCPStore(host, 0, common.size(), True, timeout=timeout, wait_for_workers=False)
        text = f"{host}:{store.port}".encode()
        address[: len(text)] = np.frombuffer(text, dtype=np.uint8)
    common.broadcast(address, root=0)
    if store is None:
        host, port = bytes(address).rstrip(b"\0").decode().rsplit(":", 1)
        store = dist.TCPStore(host, int(port), common.size(), False, timeout=timeout)
    _state = _NcclState(store=store, bucket_bytes=_bucket_bytes())


def _bucket_bytes() -> int:
    """Bucket size of the NCCL path: the fusion threshold, at most 32 MiB so that buckets fill (and
    start) while backward is still running, as DDP's 25 MiB buckets do."""
    threshold = int(config.resolve().get("fusion_threshold"))
    return min(threshold, 32 << 20) if threshold > 0 else 1


def on_shutdown() -> None:
    global _state
    _state = None
    with _bucket_lock:
        _open_buckets.clear()


def uses_nccl(tensors: Sequence[torch.Tensor]) -> bool:
    """True when these tensors go through NCCL (all on CUDA and the NCCL store is set up)."""
    return _state is not None and all(t.is_cuda for t in tensors)


def _new_group(store: Any, rank: int, size: int) -> Any:
    return dist.ProcessGroupNCCL(store, rank, size)


def _group(ps_id: int) -> Any:
    assert _state is not None
    group = _state.groups.get(ps_id)
    if group is None:
        ranks = common.process_set_ranks(ps_id)
        store = dist.PrefixStore(f"hpcdl/process_set/{ps_id}", _state.store)
        group = _new_group(store, common.process_set_rank(ps_id), len(ranks))
        _state.groups[ps_id] = group
    return group


class _Chained:
    """A handle that is done when another entry of the handle table is (its result is taken in finish)."""

    def __init__(self, inner: int) -> None:
        self._inner = inner

    def poll(self) -> bool:
        return _handles.poll(self._inner)

    def wait(self, timeout: Optional[float] = None) -> None:
        return None

    def release(self) -> None:
        return None


class _Work:
    """A torch.distributed Work seen through the handle protocol of ``_handles``."""

    def __init__(self, works: list[Any]) -> None:
        self._works = works

    def poll(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def wait(self, timeout: Optional[float] = None) -> None:
        for w in self._works:
            w.wait()

    def release(self) -> None:
        self._works = []


_NCCL_OPS = {Sum: "SUM", Average: "SUM", Min: "MIN", Max: "MAX", Product: "PRODUCT"}


def _scale(t: torch.Tensor, factor: float) -> None:
    if factor == 1.0:
        return
    if t.dtype.is_floating_point:
        t.mul_(factor)
    else:
        t.copy_((t.to(torch.float64) * factor).trunc().to(t.dtype))


def _launch_allreduce(
    group: Any, tensors: list[torch.Tensor], op: int, prescale: float
) -> tuple[Any, torch.Tensor]:
    """One NCCL allreduce of the tensors (one dtype) packed into a flat buffer."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    _scale(flat, prescale)
    opts = dist.AllreduceOptions()
    opts.reduceOp = getattr(dist.ReduceOp, _NCCL_OPS[op])
    return group.allreduce([flat], opts), flat


def _unpack(flat: torch.Tensor, op: int, postscale: float, set_size: int, pairs: list[tuple]) -> None:
    """Finish a reduced flat buffer (postscale, average) and copy each slice into its output."""
    _scale(flat, postscale)
    if op == Average:
        if flat.dtype.is_floating_point:
            flat.div_(set_size)
        else:
            flat.copy_(torch.div(flat, set_size, rounding_mode="trunc"))
    offset = 0
    for tensor, output in pairs:
        n = tensor.numel()
        with torch.no_grad():
            output.copy_(flat[offset : offset + n].view(tensor.shape))
        offset += n


@dataclass
class _Bucket:
    """Single-tensor allreduces of one process set, dtype, device, op and scaling, fused into one NCCL
    call (DDP-style bucketing: launched when full, or at the next wait/poll/other collective)."""

    key: tuple
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    nbytes: int = 0
    work: Any = None
    flat: Optional[torch.Tensor] = None
    unpacked: bool = False


_bucket_lock = threading.RLock()
_open_buckets: dict[tuple, _Bucket] = {}


def _launch_bucket(bucket: _Bucket) -> None:
    ps_id, _, _, op, prescale, _ = bucket.key
    bucket.work, bucket.flat = _launch_allreduce(_group(ps_id), [t for t, _ in bucket.pairs], op, prescale)


def flush() -> None:
    """Launch every open bucket, oldest first. Every rank reaches the same flush points in the same
    order (they follow the program's submissions), so the NCCL calls match across ranks."""
    with _bucket_lock:
        for bucket in list(_open_buckets.values()):
            _launch_bucket(bucket)
        _open_buckets.clear()


class _BucketMember:
    """The handle of one tensor in a bucket: waiting or polling launches the open buckets first."""

    def __init__(self, bucket: _Bucket) -> None:
        self._bucket = bucket

    def poll(self) -> bool:
        flush()
        return bool(self._bucket.work.is_completed())

    def wait(self, timeout: Optional[float] = None) -> None:
        flush()
        self._bucket.work.wait()

    def release(self) -> None:
        return None


def allreduce(
    tensors: list[torch.Tensor],
    outputs: list[torch.Tensor],
    op: int,
    prescale: float,
    postscale: float,
    ps_id: int,
) -> int:
    """Allreduce over NCCL; outputs[i] may be tensors[i]. A single tensor joins a bucket; a group is
    launched at once as one fused call per dtype."""
    set_size = common.process_set_size(ps_id)
    if len(tensors) == 1:
        return _bucketed_allreduce(tensors[0], outputs[0], op, prescale, postscale, ps_id, set_size)
    flush()
    group = _group(ps_id)
    launched = []
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        pairs = [(t, o) for t, o in zip(tensors, outputs) if t.dtype == dtype]
        work, flat = _launch_allreduce(group, [t for t, _ in pairs], op, prescale)
        launched.append((work, flat, pairs))

    def finish() -> list[torch.Tensor]:
        for _, flat, pairs in launched:
            _unpack(flat, op, postscale, set_size, pairs)
        return list(outputs)

    return _handles.register(
        [_Work([w for w, _, _ in launched])], finish, keep_alive=(tensors, outputs, launched)
    )


def _bucketed_allreduce(
    tensor: torch.Tensor,
    output: torch.Tensor,
    op: int,
    prescale: float,
    postscale: float,
    ps_id: int,
    set_size: int,
) -> int:
    assert _state is not None
    key = (ps_id, tensor.dtype, tensor.device, op, float(prescale), float(postscale))
    with _bucket_lock:
        bucket = _open_buckets.get(key)
        if bucket is None:
            bucket = _open_buckets[key] = _Bucket(key)
        bucket.pairs.append((tensor, output))
        bucket.nbytes += tensor.numel() * tensor.element_size()
        if bucket.nbytes >= _state.bucket_bytes:
            _launch_bucket(_open_buckets.pop(key))

    def finish() -> list[torch.Tensor]:
        with _bucket_lock:
            if not bucket.unpacked:
                assert bucket.flat is not None
                _unpack(bucket.flat, op, postscale, set_size, bucket.pairs)
                bucket.unpacked = True
        return [output]

    return _handles.register([_BucketMember(bucket)], finish, keep_alive=(tensor, output, bucket))


def _exchange_rows(group: Any, rows: int, set_size: int, device: torch.device) -> list[int]:
    mine = torch.tensor([rows], dtype=torch.int64, device=device)
    everyone = [torch.empty(1, dtype=torch.int64, device=device) for _ in range(set_size)]
    group.allgather([everyone], [mine]).wait()
    return [int(t.item()) for t in everyone]


def allgather(tensors: list[torch.Tensor], ps_id: int) -> int:
    """Allgather with per-rank first dimensions: sizes first, then the rows padded to the largest."""
    flush()
    group = _group(ps_id)
    set_size = common.process_set_size(ps_id)
    works, pieces = [], []
    for t in tensors:
        src = t.detach().contiguous()
        rows = _exchange_rows(group, src.shape[0], set_size, src.device)
        padded = torch.zeros((max(rows), *src.shape[1:]), dtype=src.dtype, device=src.device)
        padded[: src.shape[0]] = src
        slots = [torch.empty_like(padded) for _ in range(set_size)]
        works.append(group.allgather([slots], [padded]))
        pieces.append((rows, slots))

    def finish() -> list[torch.Tensor]:
        return [torch.cat([s[:r] for r, s in zip(rows, slots)]) for rows, slots in pieces]

    return _handles.register([_Work(works)], finish, keep_alive=(tensors, pieces))


def broadcast(tensor: torch.Tensor, output: torch.Tensor, root_rank: int, ps_id: int) -> int:
    flush()
    group = _group(ps_id)
    buf = output if (output is tensor and tensor.is_contiguous()) else tensor.detach().contiguous().clone()
    opts = dist.BroadcastOptions()
    opts.rootRank = common.process_set_ranks(ps_id).index(root_rank)
    opts.rootTensor = 0
    work = group.broadcast([buf], opts)

    def finish() -> torch.Tensor:
        if buf.data_ptr() != output.data_ptr():
            with torch.no_grad():
                output.copy_(buf)
        return output

    return _handles.register([_Work([work])], finish, keep_alive=(tensor, output, buf))


def alltoall(tensor: torch.Tensor, splits: Optional[list[int]], splits_dtype: torch.dtype, ps_id: int) -> int:
    flush()
    group = _group(ps_id)
    set_size = common.process_set_size(ps_id)
    src = tensor.detach().contiguous()
    send = splits if splits is not None else [src.shape[0] // set_size] * set_size
    send_t = torch.tensor(send, dtype=torch.int64, device=src.device)
    recv_t = torch.empty(set_size, dtype=torch.int64, device=src.device)
    group.alltoall_base(recv_t, send_t, [1] * set_size, [1] * set_size, dist.AllToAllOptions()).wait()
    recv = [int(x) for x in recv_t.tolist()]
    out = torch.empty((sum(recv), *src.shape[1:]), dtype=src.dtype, device=src.device)
    work = group.alltoall_base(out, src, recv, send, dist.AllToAllOptions())

    def finish() -> tuple[torch.Tensor, torch.Tensor]:
        return out, torch.tensor(recv, dtype=splits_dtype)

    return _handles.register([_Work([work])], finish, keep_alive=(tensor, src, out))


def reducescatter(tensors: list[torch.Tensor], op: int, prescale: float, postscale: float, ps_id: int) -> int:
    """Reducescatter as a fused allreduce followed by this rank's slice (first ``rows % size`` ranks get
    one extra row, as in Horovod)."""
    set_size, set_rank = common.process_set_size(ps_id), common.process_set_rank(ps_id)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    inner = allreduce(tensors, outputs, op, prescale, postscale, ps_id)

    def finish() -> list[torch.Tensor]:
        reduced = _handles.synchronize(inner)
        results = []
        for t in reduced:
            rows = t.shape[0]
            start = sum(reducescatter_rows(rows, set_size, r) for r in range(set_rank))
            results.append(t[start : start + reducescatter_rows(rows, set_size, set_rank)].clone())
        return results

    return _handles.register([_Chained(inner)], finish, keep_alive=(tensors, outputs))
