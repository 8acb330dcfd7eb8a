"""The GPU path's settings and the pieces of it that need no ranks: which path a job takes, the layout of a
device batch, and the timeline's phase times."""

from __future__ import annotations

import struct

import pytest
import torch
import torch.distributed as dist

from hpcdl.common import config
from hpcdl.common.engine import DeviceBatch
from hpcdl.common.exceptions import HpcdlConfigError
from hpcdl.common.types import DType, OpType, ReduceOp
from hpcdl.runner.tunables import TUNABLES
from hpcdl.torch import _gpu
from hpcdl.torch._gpu.lanes import phase_times


def test_gpu_operations_offers_the_gloo_stand_in() -> None:
    assert config.resolve({}, {}).get("gpu_operations") == "auto"
    assert (
        config.resolve({}, {"HPCDL_GPU_OPERATIONS": "GLOO-STANDIN"}).get("gpu_operations") == "gloo-standin"
    )
    with pytest.raises(HpcdlConfigError, match="one of auto, nccl, host, gloo-standin"):
        config.resolve({}, {"HPCDL_GPU_OPERATIONS": "mpi"})


def test_nccl_streams_and_nvtx_take_horovods_variables() -> None:
    assert config.resolve({}, {}).get("num_nccl_streams") == 1
    assert config.resolve({}, {"HOROVOD_NUM_NCCL_STREAMS": "4"}).get("num_nccl_streams") == 4
    both = {"HOROVOD_NUM_NCCL_STREAMS": "4", "HPCDL_NUM_NCCL_STREAMS": "2"}
    assert config.resolve({}, both).get("num_nccl_streams") == 2
    with pytest.raises(HpcdlConfigError, match="at least 1"):
        config.resolve({}, {"HPCDL_NUM_NCCL_STREAMS": "0"})
    assert config.resolve({}, {}).get("disable_nvtx_ranges") is False
    assert config.resolve({}, {"HOROVOD_DISABLE_NVTX_RANGES": "1"}).get("disable_nvtx_ranges") is True


def test_hpcdl_run_flags_set_the_variables() -> None:
    flags = {t.flag: t.env for t in TUNABLES}
    assert flags["--num-nccl-streams"] == "HPCDL_NUM_NCCL_STREAMS"
    assert flags["--disable-nvtx-ranges"] == "HPCDL_DISABLE_NVTX_RANGES"
    assert "gloo-standin" in next(t for t in TUNABLES if t.key == "gpu_operations").choices


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the choice on a machine without a GPU")
def test_without_a_gpu_auto_stages_through_host_memory_and_nccl_says_why_not() -> None:
    assert _gpu.resolve_mode("auto") == "host"
    assert _gpu.resolve_mode("host") == "host"
    assert _gpu.resolve_mode("gloo-standin") == "gloo-standin"
    reason = "no CUDA GPU is visible" if dist.is_nccl_available() else "this PyTorch has no NCCL"
    with pytest.raises(HpcdlConfigError, match=f"HPCDL_GPU_OPERATIONS=nccl, but {reason}.*=host"):
        _gpu.resolve_mode("nccl")


def test_a_device_batch_decodes_the_engine_layout() -> None:
    scales = struct.unpack("<2q", struct.pack("<2d", 0.5, 3.0))
    header = [
        17,
        2,
        int(OpType.ALLGATHER),
        int(DType.BFLOAT16),
        int(ReduceOp.AVERAGE),
        1,
        2,
        3,
        1,
        3,
        *scales,
        3,
    ]
    batch = DeviceBatch.decode([*header, 5, 12, 0, 4, 2, 1, 3])
    assert (batch.id, batch.process_set, batch.op_type, batch.dtype) == (
        17,
        2,
        OpType.ALLGATHER,
        DType.BFLOAT16,
    )
    assert (batch.reduce_op, batch.root, batch.set_size, batch.set_rank) == (ReduceOp.AVERAGE, 1, 3, 1)
    assert batch.fused and batch.timed and (batch.prescale, batch.postscale) == (0.5, 3.0)
    assert batch.tags == (5, 0) and batch.counts == (12, 4) and batch.table == (2, 1, 3)


def test_phase_times_from_host_times_or_none_when_untimed() -> None:
    assert phase_times([1, 5, 9, 12], 0) == [1, 5, 9, 12]
    assert phase_times([None, None, None, None], 99) is None
