"""hpcdl.tensorflow.keras with both Keras flavours ``tf.keras`` can be, on real ranks
(``tf_keras_checks.py``): tf-keras (Keras 2, ``TF_USE_LEGACY_KERAS=1``) and Keras 3. model.fit with
DistributedOptimizer (current and legacy optimizers, two backward passes) matches one process training on
the concatenated batch; PartialDistributedOptimizer, the callbacks, load_model, elastic KerasState,
broadcast_global_variables and SyncBatchNormalization behave as Horovod's."""

from __future__ import annotations

import importlib.util

import pytest
from test_tensorflow_ranks import NO_TENSORFLOW, run_checks

NO_TF_KERAS = "tf-keras is not installed: pip install --no-deps tf-keras==2.21.0 (scripts/setup.sh does)"


def _run(legacy: bool, ranks: int) -> None:
    pytest.importorskip("tensorflow", reason=NO_TENSORFLOW)
    if legacy and importlib.util.find_spec("tf_keras") is None:
        pytest.skip(NO_TF_KERAS)
    run_checks("tf_keras_checks.py", "keras", ranks, {"TF_USE_LEGACY_KERAS": "1" if legacy else "0"})


def test_tf_keras_on_two_ranks() -> None:
    _run(legacy=True, ranks=2)


def test_keras3_on_three_ranks() -> None:
    _run(legacy=False, ranks=3)


@pytest.mark.slow
def test_tf_keras_on_three_ranks() -> None:
    _run(legacy=True, ranks=3)


@pytest.mark.slow
def test_keras3_on_two_ranks() -> None:
    _run(legacy=False, ranks=2)
