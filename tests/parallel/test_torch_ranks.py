"""hpcdl.torch on real ranks started by ``hpcdl run``: every collective against NumPy truth, gradients,
objects, process sets, the optimizer's errors and the N-ranks-equals-one-big-batch property.

The checks themselves live in ``torch_rank_checks.py`` and run inside each rank; many checks share one
job because starting ranks (importing torch) is the slow part.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CHECKS = HERE / "torch_rank_checks.py"


def _checks_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("torch_rank_checks", CHECKS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_scenario(scenario: str, ranks: int, extra_env: dict[str, str] | None = None) -> str:
    """Run one scenario on `ranks` ranks; assert that every rank passed every check; return the output."""
    env = dict(os.environ, HPCDL_TIMEOUT="60", **(extra_env or {}))
    command = [sys.executable, "-m", "hpcdl", "run", "-np", str(ranks), sys.executable, str(CHECKS), scenario]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    passed = Counter(re.findall(r"PASS (\w+)", result.stdout))
    expected = [check.__name__ for check in _checks_module().SCENARIOS[scenario]]
    missing = {name: passed[name] for name in expected if passed[name] != ranks}
    assert not missing, f"checks not passed on all {ranks} ranks: {missing}\n{output[-3000:]}"
    return output


def test_collectives_process_sets_gradients_and_errors_on_three_ranks() -> None:
    run_scenario("collectives", 3)


def test_training_matches_one_rank_with_the_whole_batch() -> None:
    """SGD-momentum and Adam, 1 and 2 backward passes per step, fp16 compression; also Adasum, join with
    uneven batches and SyncBatchNorm against BatchNorm on the concatenated batch."""
    run_scenario("training", 2)


def test_torch_distributed_path_with_gloo_standing_in_for_nccl() -> None:
    """The GPU path (the engine negotiates, the executor moves the data through torch.distributed) run on
    CPU tensors with gloo in place of NCCL: only NCCL's kernels and CUDA streams are not exercised."""
    run_scenario("distributed_path", 2, {"HPCDL_GPU_OPERATIONS": "gloo-standin"})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
def test_cuda_tensors_staged_through_host_memory() -> None:
    run_scenario("cuda", 2, {"HPCDL_GPU_OPERATIONS": "host"})


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="NCCL needs one GPU per rank: this test wants 2 CUDA GPUs",
)
def test_cuda_tensors_through_nccl() -> None:
    run_scenario("cuda", 2, {"HPCDL_GPU_OPERATIONS": "nccl"})
