"""CUDA tensors on the NCCL path in a job of one process: every collective, the ordering with the caller's
streams, several NCCL streams, and the NVTX switch. Needs a GPU (skipped elsewhere); one rank, because
NCCL refuses two ranks on one device (the multi-rank logic is tested with gloo standing in)."""

from __future__ import annotations

import pytest
import torch

import hpcdl.torch as hvd
from hpcdl.torch import _gpu

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not torch.distributed.is_nccl_available(),
        reason="needs a CUDA GPU and a PyTorch with NCCL; this machine has neither",
    ),
]


def _start(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for var in ("HPCDL_RANK", "HPCDL_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HPCDL_GPU_OPERATIONS", "nccl")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    hvd.init()


@pytest.fixture
def nccl(monkeypatch: pytest.MonkeyPatch):
    _start(monkeypatch)
    yield torch.device("cuda", torch.cuda.current_device())
    hvd.shutdown()


def test_every_collective_on_cuda_tensors(nccl: torch.device) -> None:
    assert _gpu.mode() == "nccl"
    x = torch.arange(12, dtype=torch.float32, device=nccl).reshape(3, 4)
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum), x)
    assert torch.equal(hvd.allreduce(x), x)  # Average over one rank
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5), x)
    for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
                  torch.int8, torch.uint8, torch.bool):  # fmt: skip
        t = x.to(dtype)
        out = hvd.allreduce(t, op=hvd.Max, name=f"dtype.{dtype}")
        assert out.is_cuda and out.dtype == dtype and torch.equal(out, t), dtype
    handles = [hvd.allreduce_async(x + i, op=hvd.Sum, name=f"fused.{i}") for i in range(20)]
    assert all(torch.equal(hvd.synchronize(h), x + i) for i, h in enumerate(handles))
    outs = hvd.grouped_allreduce([x, x.double()], op=hvd.Sum)
    assert torch.equal(outs[0], x) and torch.equal(outs[1], x.double())
    view = x.clone().t()
    assert hvd.allreduce_(view, op=hvd.Sum) is view and torch.equal(view, x.t())
    gathered = hvd.allgather(x)
    assert gathered.is_cuda and torch.equal(gathered, x)
    assert torch.equal(hvd.broadcast(x, root_rank=0), x)
    assert torch.equal(hvd.alltoall(x), x)
    out, received = hvd.alltoall(x, splits=[3])
    assert torch.equal(out, x) and received.tolist() == [3]
    assert torch.equal(hvd.reducescatter(x, op=hvd.Sum), x)
    assert torch.equal(hvd.grouped_allgather([x, x[:1]])[1], x[:1])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second GPU to submit from")
def test_other_devices_are_refused(nccl: torch.device) -> None:
    hvd.allreduce(torch.ones(2, device=nccl))
    other = torch.device("cuda", (nccl.index + 1) % torch.cuda.device_count())
    with pytest.raises(hvd.HpcdlError, match="one GPU per rank"):
        hvd.allreduce(torch.ones(2, device=other))


def test_the_executor_waits_for_the_callers_stream_and_the_caller_for_the_result(nccl: torch.device) -> None:
    """The tensor is written on a side stream that is still busy when it is submitted: the collective
    must read what that stream writes, and the caller's stream must see the result after synchronize,
    without the host waiting for either stream."""
    side = torch.cuda.Stream(device=nccl)
    x = torch.ones(1 << 20, device=nccl)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # keeps the side stream busy for a good while
        x.fill_(3.0)
        handle = hvd.allreduce_async(x, op=hvd.Sum, name="ordered")
        out = hvd.synchronize(handle)
        doubled = out * 2  # on the side stream, after the result
    side.synchronize()
    assert torch.equal(out, torch.full_like(x, 3.0))
    assert torch.equal(doubled, torch.full_like(x, 6.0))


def test_several_nccl_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    _start(monkeypatch, HPCDL_NUM_NCCL_STREAMS="3")
    try:
        device = torch.device("cuda", torch.cuda.current_device())
        handles = [
            hvd.allreduce_async(torch.full((1000,), float(i), device=device), op=hvd.Sum) for i in range(9)
        ]
        assert all(hvd.synchronize(h)[0].item() == i for i, h in enumerate(handles))
    finally:
        hvd.shutdown()


@pytest.mark.parametrize("disabled", [False, True])
def test_nvtx_ranges_mark_batches_unless_disabled(monkeypatch: pytest.MonkeyPatch, disabled: bool) -> None:
    ranges: list[str] = []
    started = torch.cuda.nvtx.range_start
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", lambda msg: ranges.append(msg) or started(msg))
    _start(monkeypatch, HPCDL_DISABLE_NVTX_RANGES="1" if disabled else "0")
    try:
        device = torch.device("cuda", torch.cuda.current_device())
        hvd.allreduce(torch.ones(4, device=device), name="marked")
        hvd.allgather(torch.ones(4, device=device), name="marked.gather")
    finally:
        hvd.shutdown()
    if disabled:
        assert ranges == []
    else:
        assert ranges == ["hpcdl ALLREDUCE (1 tensor)", "hpcdl ALLGATHER (1 tensor)"]
