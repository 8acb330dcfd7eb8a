"""Rank-side checks of ``hpcdl.tensorflow.keras`` with whichever Keras ``tf.keras`` is: Keras 3, or tf-keras
(Keras 2) when the job sets ``TF_USE_LEGACY_KERAS=1``; run by tests/parallel/test_tensorflow_keras.py.

Every reference is one process training on the whole batch with the plain optimizer; the distributed run
gives each rank its rows of that batch. ``python tf_keras_checks.py keras`` prints ``PASS <check>`` for
each (see keras_rank_checks.run_checks).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

import hpcdl.tensorflow as hvd_tf
import hpcdl.tensorflow.keras as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from keras_rank_checks import assert_close, run_checks
from tf_graph_checks import check_sync_batch_normalization_uses_the_global_batch

keras = tf.keras
LEGACY = keras.optimizers.Optimizer.__module__.startswith("tf_keras")
PER_RANK, STEPS, TOL = 4, 6, 1e-9


def make_model(seed: int = 7) -> Any:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(2)]
    )


def dataset(batches: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(3)
    rows = batches * hvd.size() * PER_RANK
    return rng.randn(rows, 5), rng.randn(rows, 2)


def my_rows(a: np.ndarray) -> np.ndarray:
    """This rank's rows of every batch of size × PER_RANK rows."""
    n, r = hvd.size(), hvd.rank()
    batches = a.reshape(-1, n, PER_RANK, *a.shape[1:])
    return batches[:, r].reshape(-1, *a.shape[1:])


def fit(model: Any, optimizer: Any, x: np.ndarray, y: np.ndarray, batch: int, callbacks: Any = ()) -> Any:
    model.compile(loss="mse", optimizer=optimizer)
    return model.fit(x, y, batch_size=batch, shuffle=False, epochs=1, verbose=0, callbacks=list(callbacks))


def same_on_every_rank(value: np.ndarray, what: str) -> None:
    gathered = hvd_tf.allgather(tf.constant(np.asarray(value, np.float64)[None])).numpy()
    for k in range(hvd.size()):
        assert_close(gathered[k], gathered[0], f"{what} on rank {k}", 0)


def _optimizers() -> list[tuple[str, Callable[[], Any]]]:
    found = [
        ("SGD-momentum", lambda: keras.optimizers.SGD(0.05, momentum=0.9)),
        ("Adam", lambda: keras.optimizers.Adam(0.01)),
    ]
    if LEGACY:
        found += [
            ("legacy SGD", lambda: keras.optimizers.legacy.SGD(0.05, momentum=0.9)),
            ("legacy Adam", lambda: keras.optimizers.legacy.Adam(0.01)),
        ]
    return found


def check_fit_matches_one_process_on_the_whole_batch() -> None:
    x, y = dataset(STEPS)
    for what, make in _optimizers():
        reference = make_model()
        fit(reference, make(), x, y, hvd.size() * PER_RANK)
        model = make_model()
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
        fit(model, hvd.DistributedOptimizer(make()), my_rows(x), my_rows(y), PER_RANK, callbacks)
        for got, want in zip(model.get_weights(), reference.get_weights()):
            assert_close(got, want, what, TOL)


def check_backward_passes_match_batches_twice_as_big() -> None:
    """backward_passes_per_step=2 with averaging: each update is the mean gradient of two batches, as one
    process training on batches twice as big."""
    x, y = dataset(2 * STEPS)
    reference = make_model()
    fit(reference, keras.optimizers.SGD(0.1), x, y, 2 * hvd.size() * PER_RANK)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.1), backward_passes_per_step=2, average_aggregated_gradients=True
    )
    fit(model, optimizer, my_rows(x), my_rows(y), PER_RANK)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        assert_close(got, want, "two passes", TOL)


def _ranks_model(k: int) -> Any:
    """Rank k's model: every weight k + 1."""
    init = keras.initializers.Constant(float(k + 1))
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(2, kernel_initializer=init, bias_initializer=init),
            keras.layers.Dense(1, kernel_initializer=init, bias_initializer=init),
        ]
    )
    return model


def _gradients(model: Any, x: np.ndarray) -> list[np.ndarray]:
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x))
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def check_partial_distributed_optimizer_keeps_local_layers_local() -> None:
    """Gradients of the local layer stay this rank's (divided by the set size); the others are averaged."""
    n, r = hvd.size(), hvd.rank()
    x = np.ones((2, 3))
    model = _ranks_model(r)
    before = [w.copy() for w in model.get_weights()]
    everyone = [_gradients(_ranks_model(k), x) for k in range(n)]
    optimizer = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[model.layers[0]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    local = len(model.layers[0].trainable_weights)
    for i, (after, start) in enumerate(zip(model.get_weights(), before)):
        step = start - after
        want = everyone[r][i] / n if i < local else np.mean([g[i] for g in everyone], axis=0)
        assert_close(step, want, f"variable {i}", 1e-9)


def check_callbacks_broadcast_average_and_schedule() -> None:
    """BroadcastGlobalVariablesCallback starts every rank from the root's weights; MetricAverageCallback
    makes the logged loss the same on every rank; LearningRateScheduleCallback sets the rate per epoch."""
    n, r = hvd.size(), hvd.rank()
    model = _ranks_model(r)
    root_weights = _ranks_model(n - 1).get_weights()
    x, y = np.ones((PER_RANK, 3)) * (r + 1), np.zeros((PER_RANK, 1))
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(n - 1),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.0, multiplier=1.0),
    ]
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.5)))
    history = model.fit(x, y, batch_size=PER_RANK, epochs=2, verbose=0, callbacks=callbacks)
    for got, want in zip(model.get_weights(), root_weights):
        assert_close(got, want, "weights after a rate-0 fit", 0)
    same_on_every_rank(np.asarray(history.history["loss"]), "averaged loss")
    assert history.history["lr"][-1] == 0.0, history.history


def check_load_model_and_elastic_state() -> None:
    """A saved model loads with a distributed optimizer that keeps training in step on every rank; an
    elastic KerasState syncs from rank 0, restores and commits."""
    x, y = dataset(1)
    model = make_model()
    fit(model, hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), my_rows(x), my_rows(y), PER_RANK)
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "model.h5" if LEGACY else "model.keras")
        model.save(path)
        loaded = hvd.load_model(path)
    assert hasattr(loaded.optimizer, "register_local_var"), type(loaded.optimizer).__mro__
    loaded.train_on_batch(my_rows(x)[:PER_RANK], my_rows(y)[:PER_RANK])
    for i, w in enumerate(loaded.get_weights()):
        same_on_every_rank(w, f"loaded model's weight {i}")

    r = hvd.rank()
    mine = _ranks_model(r)
    state = hvd.elastic.KerasState(mine, keras.optimizers.Adam(0.01), epoch=r)
    state.sync()
    assert state.epoch == 0
    synced = [w.copy() for w in mine.get_weights()]
    for got, want in zip(synced, _ranks_model(0).get_weights()):
        assert_close(got, want, "synced from rank 0", 0)
    mine.set_weights([w + 1 for w in synced])
    state.restore()
    for got, want in zip(mine.get_weights(), synced):
        assert_close(got, want, "restored", 0)


def check_broadcast_global_variables_in_a_graph() -> None:
    r = hvd.rank()
    graph = tf.Graph()
    with graph.as_default():
        variable = tf.compat.v1.Variable(float(r + 10))
        broadcast = hvd_tf.broadcast_global_variables(0)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(broadcast)
            assert session.run(variable) == 10.0


SCENARIOS = {
    "keras": [
        check_fit_matches_one_process_on_the_whole_batch,
        check_backward_passes_match_batches_twice_as_big,
        check_partial_distributed_optimizer_keeps_local_layers_local,
        check_callbacks_broadcast_average_and_schedule,
        check_load_model_and_elastic_state,
        check_broadcast_global_variables_in_a_graph,
        check_sync_batch_normalization_uses_the_global_batch,
    ]
}


if __name__ == "__main__":
    expected = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
    assert expected == LEGACY, f"tf.keras is {'tf-keras' if LEGACY else 'Keras 3'}"
    keras.backend.set_floatx("float64")
    hvd.init()
    run_checks(SCENARIOS[sys.argv[1]])
    hvd.shutdown()
