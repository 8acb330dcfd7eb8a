"""Rank-side checks of hpcdl.tensorflow, run by tests/parallel/test_tensorflow_ranks.py under ``hpcdl run``.

``python tf_rank_checks.py SCENARIO`` runs every check of the scenario on this rank and prints
``PASS <check>`` for each; the first failure raises (the rank exits non-zero and the launcher fails the
job). Every expected value is computed here from the other ranks' inputs, which each rank can rebuild
because they are deterministic functions of the rank. Importing TensorFlow is the slow part of a rank, so
each scenario batches many checks into one job.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

import hpcdl.tensorflow as hvd
from hpcdl.common import discovery, engine
from hpcdl.common.exceptions import HpcdlError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import keras_rank_checks

Check = Callable[[], None]
SETS: dict[str, hvd.ProcessSet] = {}

# Every dtype TensorFlow has a fixed-size element for.
DTYPES = [
    tf.bool, tf.uint8, tf.int8, tf.uint16, tf.int16, tf.uint32, tf.int32, tf.uint64, tf.int64,
    tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.complex64, tf.complex128,
]  # fmt: skip
# Reductions round (averages, float16/bfloat16 arithmetic); moving data is exact.
TOLERANCE = {tf.float16: 1e-2, tf.bfloat16: 5e-2, tf.float32: 1e-6, tf.complex64: 1e-6, tf.float64: 1e-12}
TOLERANCE[tf.complex128] = 1e-12


def values(rank: int, shape: tuple[int, ...], dtype: tf.DType) -> np.ndarray:
    """A deterministic array that differs per rank, with no ties (for Min/Max) and exact sums: integers
    in 0..4, floats on a grid of quarters, bools in a pattern."""
    base = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    if dtype == tf.bool:
        return (base + rank) % 3 == 0
    if dtype.is_integer:
        return ((base * 7 + rank * 3) % 5).astype(dtype.as_numpy_dtype)
    real = ((base * 0.37 + rank * 1.3 + 0.5) % 7.0 - 3.0).round(2) // 0.25 * 0.25
    if dtype.is_complex:
        return (real + 1j * (real[..., ::-1] + rank)).astype(dtype.as_numpy_dtype)
    return real.astype(dtype.as_numpy_dtype)


def everyone(shape: tuple[int, ...], dtype: tf.DType) -> np.ndarray:
    """Every rank's values, stacked (in a wide type for the reductions' truth)."""
    wide = np.complex128 if dtype.is_complex else (np.bool_ if dtype == tf.bool else np.float64)
    return np.stack([values(r, shape, dtype).astype(wide) for r in range(hvd.size())])


def tensor(rank: int, shape: tuple[int, ...], dtype: tf.DType) -> tf.Tensor:
    return tf.constant(values(rank, shape, dtype), dtype=dtype)


def assert_close(actual: Any, expected: Any, what: str, tol: float = 0.0) -> None:
    a = np.asarray(actual.numpy() if hasattr(actual, "numpy") else actual)
    e = np.asarray(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    if a.dtype == np.bool_ or e.dtype == np.bool_:
        assert np.array_equal(a.astype(bool), e.astype(bool)), f"{what}: {a.ravel()[:8]} != {e.ravel()[:8]}"
        return
    wide = np.complex128 if np.iscomplexobj(a) or np.iscomplexobj(e) else np.float64
    a, e = a.astype(wide), e.astype(wide)
    assert np.allclose(a, e, rtol=tol, atol=tol), f"{what}: {a.ravel()[:8]} != {e.ravel()[:8]}"


def both_modes(fn: Callable[..., Any]) -> list[tuple[str, Callable[..., Any]]]:
    """``fn`` eagerly and inside a ``tf.function`` (a graph)."""
    return [("eager", fn), ("tf.function", tf.function(fn))]


def raises(exc: type[BaseException], message: str, call: Callable[[], Any]) -> str:
    try:
        call()
    except exc as error:
        text = str(error)
        assert message in text, f"expected {message!r} in: {text}"
        return text
    raise AssertionError(f"expected {exc.__name__} mentioning {message!r}")


# ---- every op and dtype -------------------------------------------------------------------------------


def _reduction_truth(op: int, inputs: np.ndarray, dtype: tf.DType) -> np.ndarray:
    if dtype == tf.bool:
        return {hvd.Sum: inputs.any(0), hvd.Max: inputs.any(0), hvd.Min: inputs.all(0)}[op]
    n = len(inputs)
    return {
        hvd.Sum: inputs.sum(0),
        hvd.Average: inputs.sum(0) / n if not dtype.is_integer else np.trunc(inputs.sum(0) / n),
        hvd.Min: inputs.min(0),
        hvd.Max: inputs.max(0),
        hvd.Product: inputs.prod(0),
    }[op]


def _ops_of(dtype: tf.DType) -> list[int]:
    if dtype == tf.bool:
        return [hvd.Sum, hvd.Min, hvd.Max]
    if dtype.is_complex:
        return [hvd.Sum, hvd.Average]
    if dtype == tf.uint64:
        return []  # refused: see check_bad_input_is_a_clear_error
    return [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def _every_op(ops: list[int]) -> Callable[[tf.Tensor], list[tf.Tensor]]:
    return lambda x: [hvd.allreduce(x, op=op) for op in ops]


def check_allreduce_every_op_and_dtype() -> None:
    r, shape = hvd.rank(), (3, 4)
    grouped = both_modes(lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum))
    for dtype in DTYPES:
        tol = TOLERANCE.get(dtype, 0.0)
        ops = _ops_of(dtype)
        for mode, run in both_modes(_every_op(ops)):
            for op, out in zip(ops, run(tensor(r, shape, dtype))):
                assert out.dtype == dtype and out.shape == shape, (mode, dtype, op, out)
                truth = _reduction_truth(op, everyone(shape, dtype), dtype)
                assert_close(out, truth, f"{mode} allreduce {dtype.name} op {op}", tol)
        for mode, run in grouped if ops else []:
            got = run(tensor(r, shape, dtype), tensor(r, (2,), dtype))
            for out, part in zip(got, (shape, (2,))):
                truth = _reduction_truth(hvd.Sum, everyone(part, dtype), dtype)
                assert_close(out, truth, f"{mode} grouped_allreduce {dtype.name}", tol)


def _movements(root: int, splits: list[int], reduce: bool) -> Callable[..., list[tf.Tensor]]:
    def ops(x: tf.Tensor, y: tf.Tensor, z: tf.Tensor) -> list[tf.Tensor]:
        result = [hvd.allgather(x), hvd.broadcast(x[:1], root_rank=root), *hvd.alltoall(y, splits=splits)]
        return [*result, hvd.reducescatter(z, op=hvd.Sum)] if reduce else result

    return ops


def check_allgather_broadcast_alltoall_reducescatter_every_dtype() -> None:
    r, n = hvd.rank(), hvd.size()
    root = n - 1
    splits = [(k + r) % 3 + 1 for k in range(n)]  # rows rank r sends to rank k
    received = [(r + s) % 3 + 1 for s in range(n)]  # rows rank r receives from rank s
    for dtype in DTYPES:
        mine = tensor(r, (r + 1, 3), dtype)  # uneven first dimensions
        gathered = np.concatenate([values(k, (k + 1, 3), dtype) for k in range(n)])
        outgoing = np.concatenate([values(r * 10 + k, (splits[k], 2), dtype) for k in range(n)])
        incoming = np.concatenate([values(s * 10 + r, (received[s], 2), dtype) for s in range(n)])
        rows = 2 * n + 1
        counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
        start = sum(counts[:r])

        for mode, run in both_modes(_movements(root, splits, reduce=dtype != tf.uint64)):
            out = run(mine, tf.constant(outgoing, dtype), tensor(r, (rows, 2), dtype))
            assert_close(out[0], gathered, f"{mode} allgather {dtype.name}")
            assert_close(out[1], values(root, (1, 3), dtype), f"{mode} broadcast {dtype.name}")
            assert_close(out[2], incoming, f"{mode} alltoall {dtype.name}")
            assert out[3].dtype == tf.int32 and out[3].numpy().tolist() == received, (mode, out[3])
            if dtype != tf.uint64:
                truth = _reduction_truth(hvd.Sum, everyone((rows, 2), dtype), dtype)[
                    start : start + counts[r]
                ]
                assert_close(out[4], truth, f"{mode} reducescatter {dtype.name}", TOLERANCE.get(dtype, 0.0))


def check_even_allgather_and_alltoall_return_the_offered_output() -> None:
    """An allgather or alltoall offers the engine its usual result (every rank's rows alike) and returns
    that array itself, aligned for TensorFlow to adopt: no copy. An uneven one gets a copy, also right."""
    from hpcdl.tensorflow import _engine
    from hpcdl.tensorflow._dtypes import wire_of

    r, n = hvd.rank(), hvd.size()
    wire = wire_of(tf.float32)
    offered: list[np.ndarray] = []
    empty = _engine._empty

    def remember(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        offered.append(empty(shape, dtype))
        return offered[-1]

    for what in ("even", "uneven"):
        rows = 2 * n if what == "even" else r * r + 1  # uneven: no rank's offer has the result's size
        splits = [2] * n if what == "even" else [rows] + [0] * (n - 1)  # uneven: every rank sends to rank 0
        offered.clear()
        _engine._empty = remember  # type: ignore[assignment]
        try:
            mine = values(r, (rows, 3), tf.float32)
            (gathered,) = _engine.allgather([mine], [wire], [f"offer.{what}"], 0, [(0, 0)]).finish()
            exchanged, _ = _engine.alltoall(mine, wire, splits, f"offer.{what}.a", 0).finish()
        finally:
            _engine._empty = empty  # type: ignore[assignment]
        rows_of = [2 * n if what == "even" else k * k + 1 for k in range(n)]
        assert_close(
            gathered, np.concatenate([values(k, (rows_of[k], 3), tf.float32) for k in range(n)]), what
        )
        fits = what == "even" or n == 1
        assert np.shares_memory(gathered, offered[0]) == fits, (what, "allgather")
        assert np.shares_memory(exchanged, offered[1]) == fits, (what, "alltoall")
        if fits:
            assert gathered.ctypes.data % 64 == 0 and exchanged.ctypes.data % 64 == 0, what
            want = np.concatenate([values(k, (rows, 3), tf.float32)[2 * r : 2 * r + 2] for k in range(n)])
            assert_close(exchanged, want, f"{what} alltoall")


def check_static_shapes_in_a_graph() -> None:
    n = hvd.size()
    shapes = {}

    @tf.function
    def traced(x: tf.Tensor) -> tf.Tensor:
        shapes["allreduce"] = hvd.allreduce(x).shape
        shapes["allgather"] = hvd.allgather(x).shape
        shapes["broadcast"] = hvd.broadcast(x, 0).shape
        output, received = hvd.alltoall(x, splits=[1] * n)
        shapes["alltoall"], shapes["received"] = output.shape, received.shape
        shapes["reducescatter"] = hvd.reducescatter(x).shape
        return x

    traced(tf.ones([n, 5]))
    assert shapes["allreduce"] == [n, 5] and shapes["broadcast"] == [n, 5], shapes
    assert shapes["allgather"].as_list() == [None, 5] and shapes["alltoall"].as_list() == [None, 5], shapes
    assert shapes["received"] == [n] and shapes["reducescatter"].as_list() == [None, 5], shapes


def check_scaling_average_flag_and_compression() -> None:
    r = hvd.rank()
    x = tensor(r, (4,), tf.float64)
    truth = everyone((4,), tf.float64).sum(0)
    assert_close(
        hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0), truth * 1.5, "scaling"
    )
    assert_close(hvd.allreduce(x, average=False), truth, "average=False is Sum")
    raises(ValueError, "supersedes average", lambda: hvd.allreduce(x, average=True, op=hvd.Sum))
    for mode, run in both_modes(lambda v: hvd.allreduce(v, op=hvd.Sum, compression=hvd.Compression.fp16)):
        out = run(tensor(r, (16,), tf.float32))
        assert out.dtype == tf.float32
        assert_close(out, everyone((16,), tf.float32).sum(0), f"{mode} fp16-compressed allreduce", 1e-2)


def check_indexed_slices_are_allgathered() -> None:
    r, n = hvd.rank(), hvd.size()
    slices = tf.IndexedSlices(
        tf.constant([[float(r + 1)] * 3], tf.float64),
        tf.constant([r % 2], dtype=tf.int64),
        dense_shape=tf.constant([4, 3]),
    )
    for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
        out = hvd.allreduce(slices, op=op)
        assert isinstance(out, tf.IndexedSlices)
        expected = np.zeros((4, 3))
        for k in range(n):
            expected[k % 2] += (k + 1) * scale
        assert_close(tf.convert_to_tensor(out), expected, f"IndexedSlices op {op}", 1e-12)
    raises(NotImplementedError, "Only Sum and Average", lambda: hvd.allreduce(slices, op=hvd.Max))


def check_gradients_of_every_op() -> None:
    """Horovod's gradients, eagerly and in a graph, with an incoming gradient of (rank + 1) everywhere."""
    r, n = hvd.rank(), hvd.size()
    root = n - 1
    mean = (n + 1) / 2  # the Average of the incoming gradients
    splits = [1] * n
    rows = 2 * n + 1
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]

    def grads(x: tf.Variable, op: Callable[[tf.Tensor], tf.Tensor]) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(op(x * 1.0) * float(r + 1))
        return tape.gradient(loss, x)

    cases = {
        "allreduce Sum": (lambda x: hvd.allreduce(x, op=hvd.Sum), (3,), np.full(3, n * mean)),
        "allreduce Average": (lambda x: hvd.allreduce(x), (3,), np.full(3, mean)),
        "grouped": (lambda x: hvd.grouped_allreduce([x], op=hvd.Sum)[0], (3,), np.full(3, n * mean)),
        "allgather": (lambda x: hvd.allgather(x), (r + 1, 2), np.full((r + 1, 2), mean)),
        "broadcast": (lambda x: hvd.broadcast(x, root), (3,), np.full(3, mean if r == root else 0.0)),
        "alltoall": (lambda x: hvd.alltoall(x, splits=splits)[0], (n, 2),
                     np.array([[k + 1.0] * 2 for k in range(n)])),
        "reducescatter Sum": (lambda x: hvd.reducescatter(x, op=hvd.Sum), (rows, 2),
                              np.concatenate([np.full((counts[k], 2), (k + 1.0) * n) for k in range(n)])),
    }  # fmt: skip
    for name, (op, shape, expected) in cases.items():
        for mode, run in both_modes(grads):
            x = tf.Variable(tf.ones(shape, tf.float64))
            assert_close(run(x, op), expected, f"{mode} gradient of {name}", 1e-12)


def check_eager_calls_without_a_tape_skip_custom_gradient() -> None:
    """Eagerly with no gradient tape recording, a collective is the engine's work alone: tf.custom_gradient
    (which inspects its function's signature every call, most of a small op's time) is not entered; under a
    tape it is, and gradients flow (check_gradients_of_every_op)."""
    r, n = hvd.rank(), hvd.size()
    original = tf.custom_gradient

    def refuse(f: Callable) -> Callable:
        raise AssertionError("an eager call with no tape recording entered tf.custom_gradient")

    x = tf.constant(np.full((n, 2), r + 1.0, np.float32))
    tf.custom_gradient = refuse
    try:
        assert_close(hvd.allreduce(x, op=hvd.Sum), np.full((n, 2), n * (n + 1) / 2), "allreduce", 1e-6)
        assert_close(hvd.allgather(x), np.repeat(np.arange(1.0, n + 1), n)[:, None] * np.ones(2), "allgather")
        assert_close(hvd.broadcast(x, 0), np.ones((n, 2)), "broadcast")
        assert_close(hvd.alltoall(x), np.arange(1.0, n + 1)[:, None] * np.ones(2), "alltoall")
        assert_close(hvd.reducescatter(x, op=hvd.Sum), np.full((1, 2), n * (n + 1) / 2), "reducescatter")
        with tf.GradientTape():
            try:
                hvd.allreduce(x, op=hvd.Sum)
            except AssertionError:
                pass
            else:
                raise AssertionError("a call under a recording tape must go through tf.custom_gradient")
    finally:
        tf.custom_gradient = original


# ---- variables, objects, process sets, join, topology -----------------------------------------------


def check_variables_and_objects() -> None:
    r, n = hvd.rank(), hvd.size()
    variables = [tf.Variable(tensor(r, (2, 3), tf.float32)), tf.Variable(tensor(r, (4,), tf.int64))]
    hvd.broadcast_variables(variables, root_rank=1)
    assert_close(variables[0], values(1, (2, 3), tf.float32), "broadcast_variables float32")
    assert_close(variables[1], values(1, (4,), tf.int64), "broadcast_variables int64")
    in_place = tf.Variable(tensor(r, (3,), tf.float64))
    assert_close(
        hvd.broadcast_(([in_place]), root_rank=0)[0], values(0, (3,), tf.float64), "broadcast_ result"
    )
    assert_close(in_place, values(0, (3,), tf.float64), "broadcast_ in place")
    mixed = {"rank": r, "payload": list(range(r * 100)), "array": np.arange(r)}
    got = hvd.broadcast_object(mixed if r == 1 else None, root_rank=1)
    assert got["rank"] == 1 and got["payload"] == list(range(100)) and got["array"].tolist() == [0]
    everything = hvd.allgather_object({"r": r} if r % 2 else f"rank {r}")
    assert everything == [{"r": k} if k % 2 else f"rank {k}" for k in range(n)], everything
    fn = hvd.broadcast_object_fn(root_rank=0)
    assert fn(r) == 0


def check_topology_and_build_facts() -> None:
    assert hvd.is_initialized()
    assert hvd.local_size() == hvd.size() and hvd.cross_size() == 1 and hvd.is_homogeneous()
    assert hvd.nccl_built() is False and hvd.cuda_built() is False and hvd.gloo_built() is True
    assert hvd.HorovodInternalError is hvd.HpcdlInternalError and issubclass(
        hvd.HorovodInternalError, HpcdlError
    )
    ranks = hvd.allgather(tf.constant([hvd.rank()]))
    assert ranks.numpy().tolist() == list(range(hvd.size()))

    @tf.function
    def graph_values() -> list[tf.Tensor]:
        return [
            hvd.rank_op(),
            hvd.size_op(),
            hvd.local_rank_op(),
            hvd.local_size_op(),
            hvd.process_set_included_op(),
        ]

    assert [int(v) for v in graph_values()] == [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), 1]


def check_process_sets() -> None:
    r = hvd.rank()
    evens, odds = SETS["evens"], SETS["odds"]
    assert evens.ranks == [0, 2] and odds.ranks == [1] and evens.included() == (r in (0, 2))
    if r in (0, 2):
        assert evens.size() == 2 and evens.rank() == (0 if r == 0 else 1)
        for mode, run in both_modes(lambda x: hvd.allreduce(x, op=hvd.Sum, process_set=evens)):
            expected = values(0, (3,), tf.float32) + values(2, (3,), tf.float32)
            assert_close(run(tensor(r, (3,), tf.float32)), expected, f"{mode} allreduce in a process set")
        got = hvd.broadcast(tensor(r, (2,), tf.float32), root_rank=2, process_set=evens)
        assert_close(got, values(2, (2,), tf.float32), "broadcast in a process set (global root)")
        assert hvd.allgather(tf.constant([r]), process_set=evens).numpy().tolist() == [0, 2]
        assert hvd.broadcast_object(f"from {r}", root_rank=2, process_set=evens) == "from 2"
        # A tape reducing over the evens only.
        w = tf.Variable([0.0, 0.0])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * float(r + 1))
        grad = hvd.DistributedGradientTape(tape, process_set=evens).gradient(loss, [w])[0]
        assert_close(grad, np.full(2, (1.0 + 3.0) / 2), "DistributedGradientTape on a process set")
        raises(ValueError, "not a member", lambda: hvd.broadcast(tf.ones(1), root_rank=1, process_set=evens))
    else:
        assert_close(hvd.allreduce(tensor(r, (3,), tf.float32), op=hvd.Sum, process_set=odds),
                     values(r, (3,), tf.float32), "a set of one rank")  # fmt: skip
    raises(
        ValueError, "not registered", lambda: hvd.allreduce(tf.ones(1), process_set=hvd.ProcessSet([0, 1]))
    )
    hvd.barrier()


def check_join_with_uneven_steps() -> None:
    r, n = hvd.rank(), hvd.size()
    sums = [hvd.allreduce(tf.ones(2), op=hvd.Sum, name=f"join.{i}") for i in range(r + 1)]
    assert int(hvd.join()) == n - 1  # the rank with the most steps joins last
    for i, s in enumerate(sums):
        assert_close(s, np.full(2, n - i), f"step {i}: ranks that joined contribute zeros")


def check_timeline() -> None:
    directory = hvd.broadcast_object(
        tempfile.mkdtemp(prefix="hpcdl-tf-timeline-") if hvd.rank() == 0 else None
    )
    path = os.path.join(directory, "timeline.json")
    hvd.start_timeline(path)
    hvd.allreduce(tf.ones(3), name="timeline.probe")
    hvd.stop_timeline()
    if hvd.rank() == 0:
        with open(path) as trace:
            assert "timeline.probe" in trace.read()
        os.unlink(path)
        os.rmdir(directory)
    hvd.barrier()


# ---- errors -------------------------------------------------------------------------------------------


def check_mismatch_is_a_clear_error_eagerly_and_in_a_graph() -> None:
    shape = (3,) if hvd.rank() == 0 else (4,)
    text = raises(
        hvd.HorovodInternalError,
        "mismatched.shape",
        lambda: hvd.allreduce(tf.ones(shape), name="mismatched.shape"),
    )
    assert "shape" in text, text

    @tf.function
    def in_graph(x: tf.Tensor) -> tf.Tensor:
        return hvd.allreduce(x, name="mismatched.graph")

    text = raises(tf.errors.OpError, "mismatched.graph", lambda: in_graph(tf.ones(shape)))
    assert "HpcdlMismatchError" in text, text  # what hvd.elastic.run recognizes
    hvd.barrier()


def check_duplicate_name_is_a_clear_error() -> None:
    """A name still pending (here from the engine's NumPy API) is refused, not run twice."""
    r = hvd.rank()
    if r == 0:
        pending = engine.allreduce_async(np.ones(2, np.float32), name="dup", op=hvd.Sum)
        raises(HpcdlError, "already pending", lambda: hvd.allreduce(tf.ones(2), name="dup"))
    hvd.barrier()
    if r != 0:
        pending = engine.allreduce_async(np.ones(2, np.float32), name="dup", op=hvd.Sum)
    assert_close(engine.synchronize(pending), np.full(2, hvd.size()), "the first 'dup' completes")
    assert_close(
        hvd.allreduce(tf.ones(2), name="dup", op=hvd.Sum), np.full(2, hvd.size()), "reused once done"
    )


def check_bad_input_is_a_clear_error() -> None:
    n = hvd.size()
    cases = [
        (ValueError, lambda: hvd.allreduce(tf.constant(["a"])), "cannot move tensors of dtype string"),
        (ValueError, lambda: hvd.allreduce(tf.ones(2, tf.uint64), op=hvd.Sum), "cannot reduce uint64"),
        (ValueError, lambda: hvd.allreduce(tf.ones(2, tf.complex64), op=hvd.Max), "reduced with hvd.Sum"),
        (ValueError, lambda: hvd.allgather(tf.constant(1.0)), "reshape it"),
        (ValueError, lambda: hvd.alltoall(tf.ones(n + 1)), "do not divide among"),
        (ValueError, lambda: hvd.alltoall(tf.ones(2), splits=[5] * n), "sum to the tensor's first dimension"),
        (ValueError, lambda: hvd._grouped_allreduce([]), "non-empty list"),
        (ValueError, lambda: hvd.allreduce(tf.ones(1), name=3), "name must be a string"),
        (ValueError, lambda: hvd.broadcast(tf.ones(1), root_rank=n + 5), "not a member"),
        (ValueError, lambda: hvd.allreduce(tf.ones(1), op=42), "unknown reduction op"),
        (NotImplementedError, lambda: hvd.allreduce(tf.ones(1), op=hvd.Adasum), "Adasum"),
        # AutoGraph re-raises it from the traced function as its StagingError carrying hpcdl's class and text.
        (Exception, lambda: tf.function(hvd.allreduce, jit_compile=True)(tf.ones(1)), "HpcdlUnsupported"),
        (RuntimeError, lambda: hvd.broadcast_global_variables(0), "broadcast_variables"),
    ]  # fmt: skip
    for exc, call, message in cases:
        raises(exc, message, call)

    @tf.function
    def splits_from_a_tensor(x: tf.Tensor, splits: tf.Tensor) -> tf.Tensor:
        return hvd.alltoall(x, splits=splits)[0]

    raises(tf.errors.InvalidArgumentError, "sum to the tensor's first dimension",
           lambda: splits_from_a_tensor(tf.ones(2), tf.constant([5] * n)))  # fmt: skip
    assert hvd.grouped_allreduce([]) == []  # Horovod returns an empty list as it is
    hvd.barrier()


# ---- training: N ranks x batch B == 1 rank x N·B ------------------------------------------------------

PER_RANK = 4
STEPS = 6


def _train_with_a_tape(
    distributed: bool,
    make_optimizer: Callable[[], Any],
    passes: int,
    compiled: bool,
    compression: Any,
    dtype: str,
) -> list[np.ndarray]:
    """STEPS optimizer steps of ``passes`` micro-batches of size × PER_RANK rows each (this rank's rows
    when distributed); gradients summed over the passes. Ranks other than 0 start from other weights when
    distributed (broadcast_variables fixes that)."""
    n, r = hvd.size(), hvd.rank()
    model = keras_rank_checks.make_model(seed=1234 + (r if distributed else 0), dtype=dtype)
    optimizer = make_optimizer()
    optimizer.build(model.trainable_variables)
    if distributed:
        hvd.broadcast_variables(model.weights + optimizer.variables, root_rank=0)
    summed = [tf.Variable(tf.zeros_like(v)) for v in model.trainable_variables]

    def micro_step(x: tf.Tensor, y: tf.Tensor, last: bool) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        if distributed:
            tape = hvd.DistributedGradientTape(tape, compression=compression, backward_passes_per_step=passes)
            grads = tape.gradient(loss, model.trainable_variables)  # the reduced sum on the last pass
        else:
            local = tape.gradient(loss, model.trainable_variables)
            grads = [tf.convert_to_tensor(s.assign_add(g)) for s, g in zip(summed, local)]
        if last:
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            for s in summed:
                s.assign(tf.zeros_like(s))

    step = tf.function(micro_step) if compiled else micro_step
    rng = np.random.RandomState(7)
    for _ in range(STEPS):
        for p in range(passes):
            x, y = rng.randn(n * PER_RANK, 6).astype(dtype), rng.randn(n * PER_RANK, 2).astype(dtype)
            if distributed:
                x, y = x[r * PER_RANK : (r + 1) * PER_RANK], y[r * PER_RANK : (r + 1) * PER_RANK]
            step(tf.constant(x), tf.constant(y), p == passes - 1)
    return [np.array(v.numpy()) for v in model.trainable_variables]


def _tape_equivalence(
    name: str,
    make_optimizer: Callable[[], Any],
    passes: int = 1,
    compression: Any = None,
    dtype: str = "float64",
) -> None:
    compression = compression or hvd.Compression.none
    tol = 1e-9 if compression is hvd.Compression.none else 3e-3
    for compiled in (False, True):
        single = _train_with_a_tape(False, make_optimizer, passes, compiled, compression, dtype)
        multi = _train_with_a_tape(True, make_optimizer, passes, compiled, compression, dtype)
        mode = "tf.function" if compiled else "eager"
        for k, (a, b) in enumerate(zip(multi, single)):
            assert_close(a, b, f"{name} ({mode}): variable {k} vs one rank with the whole batch", tol)
        untrained = [v.numpy() for v in keras_rank_checks.make_model(dtype=dtype).trainable_variables]
        assert sum(float(np.abs(a - b).sum()) for a, b in zip(single, untrained)) > 1e-3, "nothing trained"


def _sgd() -> Any:
    return keras.optimizers.SGD(0.1, momentum=0.9)


def _adam() -> Any:
    return keras.optimizers.Adam(0.01)


def check_tape_equivalence_sgd_momentum() -> None:
    _tape_equivalence("tape SGD-momentum", _sgd)


def check_tape_equivalence_adam() -> None:
    _tape_equivalence("tape Adam", _adam)


def check_tape_equivalence_two_backward_passes() -> None:
    _tape_equivalence("tape SGD-momentum, 2 passes", _sgd, passes=2)
    _tape_equivalence("tape Adam, 2 passes", _adam, passes=2)


def check_tape_equivalence_fp16_compression() -> None:
    _tape_equivalence("tape SGD-momentum fp16", _sgd, compression=hvd.Compression.fp16, dtype="float32")


def check_tape_options() -> None:
    """groups, sparse gradients (allgathered or dense), Sum, predivide, local sources, nested sources."""
    r, n = hvd.rank(), hvd.size()
    a, b, c = tf.Variable([1.0, 2.0]), tf.Variable([[3.0]]), tf.Variable(tf.ones([5, 2]))

    def gradient(**options: Any) -> list[Any]:
        with tf.GradientTape() as tape:
            rows = tf.gather(c, [r % 5, (r + 1) % 5])  # an IndexedSlices gradient
            loss = float(r + 1) * (tf.reduce_sum(a) + tf.reduce_sum(b) + tf.reduce_sum(rows))
        local = options.pop("local", False)
        distributed = hvd.DistributedGradientTape(tape, **options)
        if local:
            distributed.register_local_source(b)
        return distributed.gradient(loss, {"a": a, "b": b, "c": c}).values()

    mean = (n + 1) / 2
    dense_c = np.zeros((5, 2))
    for k in range(n):
        dense_c[[k % 5, (k + 1) % 5]] += (k + 1) / n
    for options in ({}, {"groups": 2}, {"groups": [[a, c]]}, {"sparse_as_dense": True}):
        ga, gb, gc = gradient(**options)
        assert_close(ga, np.full(2, mean), f"dense gradient with {options}", 1e-12)
        assert_close(gb, np.full((1, 1), mean), f"dense gradient with {options}", 1e-12)
        assert isinstance(gc, tf.IndexedSlices) != bool(options.get("sparse_as_dense")), (options, type(gc))
        assert_close(tf.convert_to_tensor(gc), dense_c, f"sparse gradient with {options}", 1e-12)
    ga, _, _ = gradient(op=hvd.Sum)
    assert_close(ga, np.full(2, n * mean), "op=Sum", 1e-12)
    ga, _, _ = gradient(gradient_predivide_factor=2.0)
    assert_close(ga, np.full(2, mean), "gradient_predivide_factor keeps the average", 1e-12)
    _, gb, _ = gradient(local=True)
    assert_close(gb, np.full((1, 1), (r + 1) / n), "a local source is scaled, not reduced", 1e-12)
    raises(ValueError, "op != Average", lambda: gradient(op=hvd.Sum, gradient_predivide_factor=2.0))
    raises(ValueError, "must be > 0", lambda: gradient(backward_passes_per_step=0))


def check_elastic_tensorflow_state_restores_after_a_failure_in_a_graph() -> None:
    """A collective failing inside a tf.function (a tf.errors.OpError carrying hpcdl's error) makes
    hvd.elastic.run restore the committed variables and attributes, re-initialize and go on."""
    r = hvd.rank()
    weight = tf.Variable([float(r)] * 2)  # different per rank until the state is synchronized
    state = hvd.elastic.TensorFlowState([weight], epoch=0)
    attempts: list[int] = []

    def fail(_: np.ndarray) -> np.ndarray:
        raise hvd.HorovodInternalError("simulated loss of a peer")

    @tf.function
    def failing_step() -> tf.Tensor:
        return tf.numpy_function(fail, [weight], tf.float32)

    @hvd.elastic.run
    def train(state: hvd.elastic.TensorFlowState) -> int:
        attempts.append(state.epoch)
        while state.epoch < 3:
            weight.assign_add(hvd.allreduce(tf.ones(2), op=hvd.Sum))
            if state.epoch == 1 and len(attempts) == 1:
                failing_step()  # before the commit: this epoch's update is lost and done again
            state.epoch += 1
            state.commit()
        return state.epoch

    assert train(state) == 3 and attempts == [0, 1], attempts
    assert_close(weight, np.full(2, 3.0 * hvd.size()), "three epochs counted once each, from rank 0's start")


# ---- init(comm=[...]): jobs made of a subset of the ranks (4 ranks) -------------------------------------

GROUPS = [[0, 2], [3, 1]]  # two jobs; the second one's rank 0 is world rank 3


def check_init_with_a_comm_list_forms_a_job_of_its_own() -> None:
    """As with hpcdl.torch: each rank is its position in its list, and everything (eager and graph ops,
    objects, dynamic process sets, an elastic commit) runs within its job; one job's shutdown leaves the
    other working."""
    world = discovery.discover().rank
    members = next(group for group in GROUPS if world in group)
    hvd.init(comm=members, process_sets="dynamic")
    r = hvd.rank()
    assert (r, hvd.size(), hvd.local_size()) == (members.index(world), 2, 2), (r, hvd.size())
    assert hvd.global_process_set.ranks == [0, 1] and hvd.global_process_set.included()
    assert [int(v) for v in tf.function(lambda: [hvd.rank_op(), hvd.size_op()])()] == [r, 2]
    for mode, run in both_modes(lambda x: hvd.allreduce(x, op=hvd.Sum)):
        assert_close(run(tf.constant([float(world)])), [float(sum(members))], f"{mode} allreduce in the job")
    got = hvd.broadcast(tf.constant([world]), root_rank=1)  # a rank of this job
    assert got.numpy().tolist() == [members[1]], got
    assert hvd.allgather_object(world) == members
    alone = hvd.add_process_set([0])  # collective over this job only
    if r == 0:
        assert_close(hvd.allreduce(tf.ones(1), op=hvd.Sum, process_set=alone), [1.0], "a set of the job")
    assert hvd.remove_process_set(alone)
    state = hvd.elastic.ObjectState(world=world)
    state.sync()
    assert state.world == members[0], state.world
    state.commit()  # the ranks of this job agree that no host changed
    hvd.barrier()
    if members == GROUPS[0]:
        hvd.shutdown()
        return
    time.sleep(1.0)  # the first job has shut down by now
    for _ in range(20):
        assert_close(hvd.allreduce(tf.ones(8), op=hvd.Sum), np.full(8, 2.0), "after the other job ended")
    hvd.shutdown()


SCENARIOS: dict[str, list[Check]] = {
    "collectives": [
        check_topology_and_build_facts,
        check_allreduce_every_op_and_dtype,
        check_allgather_broadcast_alltoall_reducescatter_every_dtype,
        check_even_allgather_and_alltoall_return_the_offered_output,
        check_static_shapes_in_a_graph,
        check_scaling_average_flag_and_compression,
        check_indexed_slices_are_allgathered,
        check_gradients_of_every_op,
        check_eager_calls_without_a_tape_skip_custom_gradient,
        check_variables_and_objects,
        check_process_sets,
        check_join_with_uneven_steps,
        check_timeline,
        check_mismatch_is_a_clear_error_eagerly_and_in_a_graph,
        check_duplicate_name_is_a_clear_error,
        check_bad_input_is_a_clear_error,
        check_tape_equivalence_sgd_momentum,
        check_tape_equivalence_adam,
    ],
    "training": [
        check_tape_equivalence_sgd_momentum,
        check_tape_equivalence_adam,
        check_tape_equivalence_two_backward_passes,
        check_tape_equivalence_fp16_compression,
        check_tape_options,
        check_elastic_tensorflow_state_restores_after_a_failure_in_a_graph,
        *keras_rank_checks.SCENARIOS["keras"],
    ],
    "subsets": [check_init_with_a_comm_list_forms_a_job_of_its_own],  # each check calls init itself
}


def main(scenario: str) -> None:
    keras_rank_checks.use_float64()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    if scenario == "collectives":
        SETS.update(evens=hvd.ProcessSet([2, 0]), odds=hvd.ProcessSet([1]))
        hvd.init(process_sets=list(SETS.values()))
    elif scenario != "subsets":
        hvd.init()
    keras_rank_checks.run_checks(SCENARIOS[scenario])
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
