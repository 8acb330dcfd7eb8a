"""Rank-side checks of hpcdl.tensorflow in graph mode (TensorFlow 1 graphs run by a session, and
tf.function), run by tests/parallel/test_tensorflow_graph.py under ``hpcdl run``.

The families: a graph's collectives run in a different order on each rank (its executor's choice) and
must all complete; unnamed collectives must get the same names on ranks whose graphs differ elsewhere;
collectives that only some ranks create fail at once, saying to name them; failures raise the TensorFlow
error classes Horovod's ops raise, eagerly and in a graph; SyncBatchNormalization's statistics are the
global batch's. ``python tf_graph_checks.py graph`` prints ``PASS <check>`` for each (see
keras_rank_checks.run_checks).
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

import hpcdl.tensorflow as hvd
from hpcdl.common.exceptions import HpcdlMismatchError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from keras_rank_checks import assert_close, run_checks


def session_run(graph: tf.Graph, fetches: Any) -> Any:
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(fetches)


def values(rank: int, shape: tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
    return (np.arange(int(np.prod(shape))).reshape(shape) % 7 + rank).astype(dtype)


def _submit_op(output: tf.Tensor) -> tf.Operation:
    """The op of a collective that submits it to the engine: the first of its Python ops (whatever
    follows it, e.g. the op that waits, is not reordered)."""
    ops, todo, seen = [], [output.op], set()
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in ("PyFunc", "HpcdlLatch"):
            ops.append(op)
        todo.extend(t.op for t in op.inputs)
    return min((op for op in ops if op.type == "PyFunc"), key=lambda op: op._id)


def check_collectives_complete_whatever_order_each_rank_submits_them() -> None:
    """Twelve independent collectives of every kind in one graph; each rank's executor is made to submit
    them in its own order (ascending on even ranks, descending on odd ones, by control dependencies between
    the submitting ops), as different executors may. Every rank must get every result."""
    n, r = hvd.size(), hvd.rank()
    graph = tf.Graph()
    with graph.as_default():
        outputs, expected = [], []
        for i in range(2):
            x = tf.constant(values(r, (3, 2)) + i)
            outputs.append(hvd.allreduce(x, op=hvd.Sum))
            expected.append(sum(values(k, (3, 2)) + i for k in range(n)))
            outputs.append(hvd.allgather(tf.constant(values(r, (r + 1, 2)))))
            expected.append(np.concatenate([values(k, (k + 1, 2)) for k in range(n)]))
            outputs.append(hvd.broadcast(tf.constant(values(r, (4,), np.int32)), root_rank=n - 1))
            expected.append(values(n - 1, (4,), np.int32))
            outputs.append(hvd.reducescatter(tf.constant(values(r, (n * 2, 3))), op=hvd.Sum))
            expected.append(sum(values(k, (n * 2, 3)) for k in range(n))[r * 2 : r * 2 + 2])
            outputs.append(hvd.alltoall(tf.constant(values(r, (n, 2)))))
            expected.append(np.stack([values(k, (n, 2))[r] for k in range(n)]))
            grouped = hvd.grouped_allreduce([tf.constant(values(r, (2,))), tf.constant(values(r, (5,)))])
            outputs.append(grouped[1])
            expected.append(np.mean([values(k, (5,)) for k in range(n)], axis=0))
        submits = [_submit_op(out) for out in outputs]
        order = submits if r % 2 == 0 else submits[::-1]
        for before, after in zip(order, order[1:]):
            after._add_control_input(before)
    started = time.monotonic()
    results = session_run(graph, outputs)
    for i, (got, want) in enumerate(zip(results, expected)):
        assert_close(got, want, f"collective {i}", 1e-12)
    assert time.monotonic() - started < 30, "no collective may wait for a deadline"


def check_unnamed_collectives_agree_when_graphs_differ_elsewhere() -> None:
    """Rank 0's graph holds more ops (and one more tf.gradients call) than the others before the same
    collectives, so every TensorFlow name after that differs between ranks; the collectives, their
    gradients (allgather's, the case Horovod's own tests meet) included, must still meet."""
    n, r = hvd.size(), hvd.rank()
    graph = tf.Graph()
    with graph.as_default():
        if r == 0:
            extra = tf.Variable(1.0)
            tf.gradients(tf.square(extra) + tf.identity(extra), extra)
        x = tf.ones([r + 2, 3]) * float(r + 1)
        gathered = hvd.allgather(x)
        reduced = hvd.allreduce(x[:1] * 2.0, op=hvd.Sum)
        grad = tf.gradients(gathered, x, tf.ones_like(gathered) * float(r + 1))[0]
    started = time.monotonic()
    got_gathered, got_reduced, got_grad = session_run(graph, [gathered, reduced, grad])
    assert_close(
        got_gathered, np.concatenate([np.full((k + 2, 3), k + 1.0) for k in range(n)]), "allgather", 0
    )
    assert_close(got_reduced, np.full((1, 3), 2.0 * sum(range(1, n + 1))), "allreduce", 1e-6)
    # allgather's gradient: the average of every rank's incoming gradient, this rank's rows.
    assert_close(got_grad, np.full((r + 2, 3), np.mean(np.arange(1, n + 1))), "allgather gradient", 1e-6)
    assert time.monotonic() - started < 30, "names that do not meet wait for a deadline"


def check_unmatched_unnamed_collective_fails_at_once_saying_to_name_it() -> None:
    """Rank 0 creates one more unnamed collective than the others, before the shared one: the ranks' graphs
    disagree. It must fail on every rank well before the engine's 60 s deadline, saying to pass name=."""
    r = hvd.rank()
    graph = tf.Graph()
    with graph.as_default():
        fetches = []
        if r == 0:
            fetches.append(hvd.allgather(tf.ones([2, 2], tf.int32)))
        fetches.append(hvd.allreduce(tf.ones([3]), op=hvd.Sum))
    started = time.monotonic()
    try:
        session_run(graph, fetches)
    except tf.errors.FailedPreconditionError as exc:
        assert "name=" in exc.message, exc.message
    else:
        raise AssertionError("collectives the ranks created differently ran")
    assert time.monotonic() - started < 20, f"took {time.monotonic() - started:.0f} s"
    hvd.barrier()


def check_collective_only_some_ranks_create_fails_at_once_naming_them() -> None:
    """In a tf.function, rank 0 alone creates a second unnamed allreduce (a Python branch on the rank),
    after the one every rank creates: every rank must fail at once (the engine's deadline is 60 s),
    naming the ranks' counts, the collective rank 0 alone created, and saying to pass name=. Last of its
    scenario: the unnamed collectives of this process's tf.functions disagree from now on."""
    r = hvd.rank()

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        out = hvd.allreduce(x, op=hvd.Sum)
        if r == 0:
            out += hvd.allreduce(x * 2.0, op=hvd.Sum)
        return out

    step.get_concrete_function(tf.TensorSpec([3], tf.float64))
    hvd.barrier()
    started = time.monotonic()
    message = _raises(tf.errors.FailedPreconditionError, lambda: step(tf.ones([3], tf.float64))).message
    assert time.monotonic() - started < 20, f"took {time.monotonic() - started:.0f} s"
    counts = dict(re.findall(r"rank (\d+): (\d+)", message))
    assert set(counts) == {str(k) for k in range(hvd.size())}, message
    assert all(int(counts["0"]) == int(n) + 1 for k, n in counts.items() if k != "0"), message
    assert re.search(r"graph\.collective_\d+ \(only on rank 0\)", message), message
    assert "name=" in message, message
    hvd.barrier()


def check_collective_only_some_ranks_run_fails_at_the_deadline_naming_them() -> None:
    """A tf.cond branch holding an unnamed allreduce is taken on rank 0 only (every rank created it): rank
    0 must fail at the engine's deadline (3 s in this scenario) naming the ranks that did not submit it and
    the collective, saying to pass name=; the others finish their step. They wait for rank 0's verdict
    (a file) before the next collective, so that they are not counted missing in it."""
    n, r = hvd.size(), hvd.rank()
    verdict = os.path.join(os.environ["HPCDL_CHECKS_DIR"], "rank0-failed")

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        shared = hvd.allreduce(x, op=hvd.Sum)
        return tf.cond(
            tf.equal(hvd.rank(), 0), lambda: hvd.allreduce(shared * 2.0, op=hvd.Sum), lambda: shared
        )

    step.get_concrete_function(tf.TensorSpec([3], tf.float64))
    hvd.barrier()
    started = time.monotonic()
    if r == 0:
        error = _raises(tf.errors.DeadlineExceededError, lambda: step(tf.ones([3], tf.float64)))
        elapsed = time.monotonic() - started
        assert 2.5 < elapsed < 15, f"failed after {elapsed:.1f} s, the deadline is 3 s"
        missing = re.search(
            r"allreduce '(graph\.collective_\d+)': ranks? ([\d, ]+) (has|have) not", error.message
        )
        assert missing, error.message
        assert sorted(int(k) for k in missing.group(2).split(",")) == list(range(1, n)), error.message
        assert f"{missing.group(1)} was named automatically" in error.message and "name=" in error.message
        with open(verdict, "w"):
            pass
    else:
        assert_close(step(tf.ones([3], tf.float64)), np.full(3, float(n)), "the shared allreduce", 0)
        while not os.path.exists(verdict):
            assert time.monotonic() - started < 30, "rank 0 did not fail at the deadline"
            time.sleep(0.05)
    hvd.barrier()


def _raises(error: type, run: Callable[[], Any]) -> BaseException:
    try:
        run()
    except error as exc:
        return exc
    raise AssertionError(f"expected {error.__name__}")


def check_failures_raise_horovods_tensorflow_errors() -> None:
    """Ranks that disagree: tf.errors.FailedPreconditionError (eagerly also hpcdl's HpcdlMismatchError, in
    a graph a message naming it, which elastic run recognizes); a bad argument:
    tf.errors.InvalidArgumentError (also a ValueError), as Horovod's ops raise them."""
    r = hvd.rank()
    shape = [3] if r == 0 else [4]
    exc = _raises(tf.errors.FailedPreconditionError, lambda: hvd.allreduce(tf.ones(shape), name="bad.shape"))
    assert isinstance(exc, HpcdlMismatchError), type(exc).__mro__
    graph = tf.Graph()
    with graph.as_default():
        fetch = hvd.allgather(tf.ones([2], tf.int32 if r == 0 else tf.float32), name="bad.dtype")
    exc = _raises(tf.errors.FailedPreconditionError, lambda: session_run(graph, fetch))
    assert "HpcdlMismatchError" in exc.message, exc.message

    @tf.function
    def uneven(x: tf.Tensor) -> tf.Tensor:
        return hvd.alltoall(x)

    exc = _raises(tf.errors.InvalidArgumentError, lambda: uneven(tf.ones([hvd.size() + 1])))
    assert isinstance(exc, ValueError) and "splits" in str(exc), exc
    hvd.barrier()


def check_sync_batch_normalization_uses_the_global_batch() -> None:
    """Training-mode outputs on each rank's rows equal plain batch normalization of the whole batch."""
    n, r = hvd.size(), hvd.rank()
    batch = np.random.RandomState(5).randn(n * 3, 4, 2)
    plain = tf.keras.layers.BatchNormalization(axis=1)
    expected = plain(tf.constant(batch), training=True).numpy()[r * 3 : r * 3 + 3]
    mine = tf.constant(batch[r * 3 : r * 3 + 3])
    eager = hvd.SyncBatchNormalization(axis=1)(mine, training=True)
    assert_close(eager, expected, "eager", 1e-9)
    layer = hvd.SyncBatchNormalization(axis=1)
    compiled = tf.function(lambda x: layer(x, training=True))(mine)
    assert_close(compiled, expected, "tf.function", 1e-9)


SCENARIOS = {
    "graph": [
        check_collectives_complete_whatever_order_each_rank_submits_them,
        check_unnamed_collectives_agree_when_graphs_differ_elsewhere,
        check_unmatched_unnamed_collective_fails_at_once_saying_to_name_it,
        check_failures_raise_horovods_tensorflow_errors,
        check_sync_batch_normalization_uses_the_global_batch,
        check_collective_only_some_ranks_create_fails_at_once_naming_them,
    ],
    "deadline": [check_collective_only_some_ranks_run_fails_at_the_deadline_naming_them],
}


if __name__ == "__main__":
    tf.keras.backend.set_floatx("float64")
    hvd.init()
    run_checks(SCENARIOS[sys.argv[1]])
    hvd.shutdown()
