"""Rank-side checks of hpcdl.keras that hold on every Keras backend hpcdl serves (TensorFlow, PyTorch).

``python keras_rank_checks.py keras`` runs them on this rank under the backend KERAS_BACKEND names and
prints ``PASS <check>`` for each (tests/parallel/test_tensorflow_ranks.py runs it with KERAS_BACKEND=torch);
``tf_rank_checks.py`` runs them too, on the TensorFlow backend. Every reference is one process training on
the whole batch with a plain Keras optimizer; the distributed run gives each rank its rows of that batch.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

import hpcdl.keras as hvd
from hpcdl._keras.optimizer import is_distributed
from hpcdl.keras import _backend

Check = Callable[[], None]
# Keras' torch backend loses precision in float64 (in one process, the gradient of 8 rows and the mean of
# the gradients of its two halves differ by 2e-7 there, by 1e-16 in plain torch); a wrong reduction is off
# by 1e-2.
TOLERANCE = 1e-9 if keras.backend.backend() == "tensorflow" else 1e-6
PER_RANK = 4  # rows of each batch a rank trains on
STEPS = 6


def assert_close(actual: np.ndarray, expected: np.ndarray, what: str, tol: float) -> None:
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert np.allclose(actual, expected, rtol=tol, atol=tol), (
        f"{what}: {actual.ravel()[:6]} != {expected.ravel()[:6]}"
    )


def make_model(seed: int = 1234, dtype: str = "float64") -> keras.Model:
    """The same model on every rank (seeded), unless a check perturbs it."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((6,), dtype=dtype),
            keras.layers.Dense(8, activation="tanh", dtype=dtype),
            keras.layers.Dense(2, dtype=dtype),
        ]
    )


def dataset(steps: int = STEPS) -> tuple[np.ndarray, np.ndarray]:
    """``steps`` whole batches of size × PER_RANK rows."""
    rng = np.random.RandomState(99)
    rows = steps * hvd.size() * PER_RANK
    return rng.randn(rows, 6), rng.randn(rows, 2)


def my_rows(a: np.ndarray) -> np.ndarray:
    """This rank's PER_RANK rows of every whole batch, in order."""
    n, r = hvd.size(), hvd.rank()
    batches = a.reshape(-1, n * PER_RANK, *a.shape[1:])
    return batches[:, r * PER_RANK : (r + 1) * PER_RANK].reshape(-1, *a.shape[1:])


def weights(model: keras.Model) -> list[np.ndarray]:
    return [np.array(w.numpy()) for w in model.weights]


def compiled(model: keras.Model, optimizer: keras.optimizers.Optimizer) -> keras.Model:
    model.compile(optimizer=optimizer, loss="mse")
    return model


def fit(model: keras.Model, distributed: bool, warmup_lr: float | None = None) -> dict:
    """One epoch of model.fit on the whole batches (one process) or on this rank's rows with the broadcast
    and metric-average callbacks (distributed); with a learning-rate warmup to ``warmup_lr`` if given."""
    x, y = dataset()
    callbacks: list[keras.callbacks.Callback] = []
    if warmup_lr is not None:
        callbacks.append(
            hvd.callbacks.LearningRateWarmupCallback(warmup_lr, warmup_epochs=1, steps_per_epoch=STEPS)
        )
    if distributed:
        callbacks = [
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),
            *callbacks,
        ]
        x, y = my_rows(x), my_rows(y)
    batch = PER_RANK if distributed else hvd.size() * PER_RANK
    return model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=callbacks).history


def _equivalence(
    name: str, make_optimizer: Callable[..., keras.optimizers.Optimizer], lr: float, passes: int = 1
) -> None:
    """The distributed fit (ranks other than 0 start from other weights: the broadcast fixes that) gives
    the weights, the averaged loss and the learning rates of one process fitting the whole batches."""
    accumulate = passes if passes > 1 else None
    single = compiled(make_model(), make_optimizer(lr, gradient_accumulation_steps=accumulate))
    single_logs = fit(single, distributed=False, warmup_lr=lr)
    distributed = hvd.DistributedOptimizer(
        make_optimizer(lr), backward_passes_per_step=passes, average_aggregated_gradients=True
    )
    multi = compiled(make_model(seed=1234 + hvd.rank()), distributed)
    multi_logs = fit(multi, distributed=True, warmup_lr=lr)
    for k, (a, b) in enumerate(zip(weights(multi), weights(single))):
        assert_close(a, b, f"{name}: weight {k} vs one process with the whole batch", TOLERANCE)
    assert_close(multi_logs["loss"], single_logs["loss"], f"{name}: loss of MetricAverageCallback", TOLERANCE)
    assert_close(multi_logs["lr"], single_logs["lr"], f"{name}: warmed-up learning rate", 1e-12)
    updates = [int(opt.iterations.numpy()) for opt in (multi.optimizer, single.optimizer)]
    assert updates == [STEPS // passes] * 2, f"{name}: iterations count the updates: {updates}"
    moved = sum(float(np.abs(a - b).sum()) for a, b in zip(weights(single), weights(make_model())))
    assert moved > 1e-3, f"{name}: training did not change the weights"


def check_fit_equivalence_sgd_momentum() -> None:
    _equivalence("fit SGD-momentum", lambda lr, **kw: keras.optimizers.SGD(lr, momentum=0.9, **kw), 0.05)


def check_fit_equivalence_adam() -> None:
    _equivalence("fit Adam", lambda lr, **kw: keras.optimizers.Adam(lr, **kw), 0.01)


def check_fit_backward_passes_match_keras_accumulation() -> None:
    """backward_passes_per_step=2 (with averaging) does what Keras' gradient_accumulation_steps=2 does in
    one process: the same updates and the same number of iterations (Adam's bias correction uses it)."""
    _equivalence("fit Adam, 2 passes", lambda lr, **kw: keras.optimizers.Adam(lr, **kw), 0.01, passes=2)


def check_fit_with_embedding_gradients() -> None:
    """An embedding's gradient (tf.IndexedSlices on TensorFlow: allgathered, not densified) averages like
    any other."""

    def embedding_model(seed: int) -> keras.Model:
        keras.utils.set_random_seed(seed)
        return keras.Sequential(
            [
                keras.Input((3,), dtype="int32"),
                keras.layers.Embedding(20, 4),
                keras.layers.Flatten(),
                keras.layers.Dense(2),
            ]
        )

    rng = np.random.RandomState(5)
    x, y = rng.randint(0, 20, (STEPS * hvd.size() * PER_RANK, 3)).astype("int32"), dataset()[1]
    single = compiled(embedding_model(7), keras.optimizers.SGD(0.1, momentum=0.9))
    single.fit(x, y, batch_size=hvd.size() * PER_RANK, shuffle=False, verbose=0)
    multi = compiled(
        embedding_model(7 + hvd.rank()), hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    )
    multi.fit(my_rows(x), my_rows(y), batch_size=PER_RANK, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])  # fmt: skip
    for k, (a, b) in enumerate(zip(weights(multi), weights(single))):
        assert_close(a, b, f"embedding model: weight {k} vs one process with the whole batch", TOLERANCE)


def check_distributed_optimizer_keeps_the_optimizer_class_and_refuses_bad_options() -> None:
    base = keras.optimizers.RMSprop(0.01, momentum=0.5)
    opt = hvd.DistributedOptimizer(base, compression=hvd.Compression.fp16)
    assert isinstance(opt, keras.optimizers.RMSprop) and type(opt).__name__ == "RMSprop"
    assert opt.get_config() == base.get_config()
    cases = [
        (lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Max), "supports Average and Sum"),
        (lambda: hvd.DistributedOptimizer(opt), "already a DistributedOptimizer"),
        (lambda: hvd.DistributedOptimizer("sgd"), "wraps a Keras 3 optimizer"),
        (lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0), "must be > 0"),
        (lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Sum, gradient_predivide_factor=2.0),
         "not supported with op != Average"),
    ]  # fmt: skip
    for call, message in cases:
        try:
            call()
        except ValueError as exc:
            assert message in str(exc), str(exc)
        else:
            raise AssertionError(f"expected ValueError mentioning {message!r}")


def check_metric_average_of_scalars_and_arrays() -> None:
    r, n = hvd.rank(), hvd.size()
    logs = {"loss": float(r), "f1": np.array([r, 2.0 * r]), "val_loss": np.float32(r + 1)}
    hvd.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
    mean = (n - 1) / 2
    assert logs["loss"] == mean and logs["val_loss"] == mean + 1, logs
    assert_close(logs["f1"], np.array([mean, 2 * mean]), "an array metric, averaged element by element", 0)


def check_momentum_correction_rescales_the_velocity() -> None:
    """Changing the rate with momentum correction gives the update Horovod's correction gives: the velocity
    scaled by new_lr / old_lr before the step."""
    model = compiled(make_model(), keras.optimizers.SGD(0.1, momentum=0.9))
    x, y = dataset(steps=1)
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0)
    velocity = [np.array(v.numpy()) for v in model.optimizer.momentums]
    schedule = hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5, staircase=True)
    schedule.set_model(model)
    schedule.on_epoch_begin(1)
    schedule.on_batch_begin(0)
    assert abs(float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)) - 0.05) < 1e-8
    for before, after in zip(velocity, model.optimizer.momentums):
        assert_close(after.numpy(), before * 0.5, "velocity rescaled by new_lr / old_lr", 1e-7)


def check_load_model_restores_a_distributed_optimizer() -> None:
    model = compiled(make_model(), hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)))
    fit(model, distributed=True)
    framework = _backend.current().hvd  # hpcdl.tensorflow or hpcdl.torch
    directory = framework.broadcast_object(
        tempfile.mkdtemp(prefix="hpcdl-keras-") if hvd.rank() == 0 else None
    )
    path = os.path.join(directory, "model.keras")
    if hvd.rank() == 0:
        model.save(path)
    hvd.allreduce(np.zeros(1), name="saved")  # everyone waits for the file
    loaded = hvd.load_model(path)
    assert isinstance(loaded.optimizer, keras.optimizers.Adam) and is_distributed(type(loaded.optimizer))
    assert int(loaded.optimizer.iterations.numpy()) == STEPS
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        assert_close(a.numpy(), b.numpy(), "optimizer state after load_model", 0)
    plain = keras.models.load_model(path)  # plain Keras reads it back as the plain optimizer
    assert isinstance(plain.optimizer, keras.optimizers.Adam) and not is_distributed(type(plain.optimizer))
    fit(loaded, distributed=True)
    fit(plain, distributed=False)
    for k, (a, b) in enumerate(zip(weights(loaded), weights(plain))):
        assert_close(a, b, f"training on after load_model: weight {k}", TOLERANCE)
    hvd.allreduce(np.zeros(1), name="loaded")
    if hvd.rank() == 0:
        shutil.rmtree(directory, ignore_errors=True)


def check_elastic_keras_state_restores_and_reinitializes() -> None:
    model = compiled(
        make_model(seed=1234 + hvd.rank()), hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, 0.9))
    )
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    x, y = dataset()
    attempts = []

    @hvd.elastic.run
    def train(state: hvd.elastic.KerasState) -> int:
        attempts.append(state.epoch)
        callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.CommitStateCallback(state, 2)]
        fail = [len(attempts) == 1]

        class FailOnce(keras.callbacks.Callback):
            def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
                if fail[0] and state.epoch == 1:  # right after epoch 1 was committed
                    fail[0] = False
                    state.model.optimizer.iterations.assign(1000)  # a change the restore must undo
                    raise hvd.HorovodInternalError("simulated loss of a peer")

        rows = (my_rows(x), my_rows(y))
        model.fit(*rows, batch_size=PER_RANK, epochs=3 - state.epoch, shuffle=False, verbose=0,
                  callbacks=[*callbacks, FailOnce()])  # fmt: skip
        return state.epoch

    assert train(state) == 3
    assert attempts == [0, 1], attempts  # retried from the committed epoch, after syncing from rank 0
    assert int(model.optimizer.iterations.numpy()) == 3 * STEPS
    gathered = hvd.allgather(np.concatenate([w.ravel() for w in weights(model)])[None, :])
    gathered = keras.ops.convert_to_numpy(gathered)
    assert_close(gathered[0], gathered[-1], "the same weights on every rank after the reset", 0)


SCENARIOS: dict[str, list[Check]] = {
    "keras": [
        check_distributed_optimizer_keeps_the_optimizer_class_and_refuses_bad_options,
        check_fit_equivalence_sgd_momentum,
        check_fit_equivalence_adam,
        check_fit_backward_passes_match_keras_accumulation,
        check_fit_with_embedding_gradients,
        check_metric_average_of_scalars_and_arrays,
        check_momentum_correction_rescales_the_velocity,
        check_load_model_restores_a_distributed_optimizer,
        check_elastic_keras_state_restores_and_reinitializes,
    ],
}


def run_checks(checks: list[Check]) -> None:
    """Run the checks in order: ``EXPECT <names>`` first, then ``PASS <name>`` after each that passed."""
    print("EXPECT " + ",".join(check.__name__ for check in checks), flush=True)
    for check in checks:
        check()
        print(f"PASS {check.__name__}", flush=True)


def use_float64() -> None:
    """Losses and metrics in float64 too: the differences from a reference are then rounding only."""
    keras.config.set_floatx("float64")


def main(scenario: str) -> None:
    use_float64()
    hvd.init()
    run_checks(SCENARIOS[scenario])
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
