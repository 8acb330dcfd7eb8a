"""hpcdl.tensorflow and hpcdl.keras on real ranks started by ``hpcdl run``: every op and TensorFlow dtype
against NumPy truth, eagerly and in tf.function, gradients, errors, process sets, jobs of a subset of the
ranks (``init(comm=[...])``), and training that matches one process with the whole batch
(DistributedGradientTape and Keras' model.fit, at 3 and 2 ranks; Keras on the PyTorch backend too).

The checks live in ``tf_rank_checks.py`` and ``keras_rank_checks.py`` and run inside each rank; a job
runs many of them because starting ranks (importing TensorFlow takes seconds) is the slow part.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

NO_TENSORFLOW = "TensorFlow is not installed: pip install 'hpcdl[tensorflow]'"

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def run_checks(script: str, scenario: str, ranks: int, env: dict[str, str] | None = None) -> None:
    """Run one scenario of a checks script on `ranks` ranks; every rank must pass every check it announced
    (``EXPECT name,...``)."""
    env = {**os.environ, "HPCDL_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    program = [sys.executable, str(HERE / script), scenario]
    command = [sys.executable, "-m", "hpcdl", "run", "-np", str(ranks), *program]
    result = subprocess.run(command, capture_output=True, text=True, timeout=280, cwd=REPO, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    announced = set(re.findall(r"EXPECT ([\w,]+)", result.stdout))
    assert len(announced) == 1, f"every rank announces the same checks: {announced}\n{output[-3000:]}"
    passed = Counter(re.findall(r"PASS (\w+)", result.stdout))
    missing = {name: passed[name] for name in announced.pop().split(",") if passed[name] != ranks}
    assert not missing, f"checks not passed on all {ranks} ranks: {missing}\n{output[-3000:]}"


@pytest.mark.slow
def test_every_op_dtype_gradient_and_error_and_tape_training_on_three_ranks() -> None:
    pytest.importorskip("tensorflow", reason=NO_TENSORFLOW)
    run_checks("tf_rank_checks.py", "collectives", 3)


@pytest.mark.slow
def test_tape_and_keras_training_match_one_process_with_the_whole_batch() -> None:
    """DistributedGradientTape (eager and tf.function; SGD-momentum, Adam, 2 passes, fp16), model.fit
    with DistributedOptimizer and the callbacks, load_model, elastic state after failures."""
    pytest.importorskip("tensorflow", reason=NO_TENSORFLOW)
    run_checks("tf_rank_checks.py", "training", 2)


def test_init_with_comm_lists_forms_independent_jobs_as_in_torch() -> None:
    """hvd.init(comm=[...]) on 4 ranks: two jobs of two, as tests/parallel/test_torch_lifecycle.py runs
    them with hpcdl.torch."""
    pytest.importorskip("tensorflow", reason=NO_TENSORFLOW)
    run_checks("tf_rank_checks.py", "subsets", 4)


@pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="Keras 3 is not installed")
def test_keras_callbacks_and_optimizer_on_the_torch_backend() -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed: Keras' torch backend needs it")
    run_checks("keras_rank_checks.py", "keras", 2, {"KERAS_BACKEND": "torch"})
