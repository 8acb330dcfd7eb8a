"""A job of one process on the GPU path with gloo standing in for NCCL: every collective runs through the
engine's device batches and the executor's threads, which init() starts and shutdown() stops."""

from __future__ import annotations

import threading

import pytest
import torch

import hpcdl.torch as hvd
from hpcdl.torch import _gpu


def _executor_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("hpcdl-gpu-")]


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch):
    for var in ("HPCDL_RANK", "HPCDL_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HPCDL_GPU_OPERATIONS", "gloo-standin")
    monkeypatch.setenv("HPCDL_TIMEOUT", "10")
    hvd.init()
    yield
    hvd.shutdown()


def test_every_collective_of_one_rank_takes_the_gpu_path(standin) -> None:
    assert _gpu.mode() == "gloo-standin"
    assert sorted(_executor_threads()) == ["hpcdl-gpu-completer", "hpcdl-gpu-launcher"]
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum), x)
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25), x * 0.5)
    handles = [hvd.allreduce_async(x + i, op=hvd.Average, name=f"one.{i}") for i in range(5)]
    assert all(torch.equal(hvd.synchronize(h), x + i) for i, h in enumerate(handles))
    assert torch.equal(hvd.allgather(x), x)
    assert torch.equal(hvd.broadcast(x, root_rank=0), x)
    assert torch.equal(hvd.alltoall(x), x)
    assert torch.equal(hvd.reducescatter(x, op=hvd.Sum), x)
    y = x.t().clone().t()  # not contiguous
    assert hvd.allreduce_(y, op=hvd.Max) is y and torch.equal(y, x)
    assert hvd.join() == 0


def test_shutdown_stops_the_executor(standin) -> None:
    hvd.allreduce(torch.ones(2))
    hvd.shutdown()
    assert _executor_threads() == []
    assert _gpu.mode() == "host"
