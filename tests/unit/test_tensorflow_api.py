"""hpcdl.tensorflow and hpcdl.keras without other ranks: the exported surface, how each dtype travels,
Horovod's ``groups`` option, the local gradient aggregation, and a job of one process (every op eagerly
and in a graph, the tape and the Keras optimizer leaving training unchanged, XLA refused, check-build)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed: pip install 'hpcdl[tensorflow]'")
keras = pytest.importorskip("keras", reason="Keras 3 is not installed (it comes with TensorFlow 2.16+)")

import hpcdl.tensorflow as hvd  # noqa: E402
from hpcdl._keras.optimizer import is_distributed  # noqa: E402
from hpcdl.common.exceptions import HpcdlNotInitializedError, HpcdlUnsupportedError  # noqa: E402
from hpcdl.common.reduce_ops import group_order, split_list  # noqa: E402
from hpcdl.stack.check_build import check_build  # noqa: E402
from hpcdl.tensorflow._dtypes import reduction_dtype, wire_of  # noqa: E402
from hpcdl.tensorflow.gradients import LocalGradientAggregation  # noqa: E402

# Every name `import horovod.tensorflow as hvd` offers in Horovod 0.28 (horovod/tensorflow/__init__.py),
# but SyncBatchNormalization, BroadcastGlobalVariablesHook and LocalGradientAggregationHelper (TensorFlow 1).
HOROVOD_TENSORFLOW_NAMES = """
elastic Compression allgather_object broadcast_object broadcast_object_fn broadcast_variables allgather
grouped_allgather broadcast broadcast_ _allreduce _grouped_allreduce alltoall _reducescatter
_grouped_reducescatter init shutdown is_initialized start_timeline stop_timeline size local_size
cross_size rank local_rank cross_rank is_homogeneous rank_op local_rank_op size_op local_size_op
process_set_included_op mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built
ddl_built ccl_built cuda_built rocm_built ProcessSet global_process_set add_process_set
remove_process_set Average Sum Adasum Min Max Product handle_average_backwards_compatibility
check_num_rank_power_of_2 join allreduce reducescatter grouped_allreduce grouped_reducescatter
broadcast_global_variables DistributedOptimizer DistributedGradientTape PartialDistributedGradientTape
""".split()  # noqa: SIM905
# horovod/tensorflow/keras/__init__.py, its callbacks and elastic modules.
HOROVOD_KERAS_NAMES = """
init shutdown is_initialized start_timeline stop_timeline size local_size cross_size rank local_rank
cross_rank mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built ProcessSet
global_process_set add_process_set remove_process_set nccl_built ddl_built ccl_built cuda_built
rocm_built Average Sum Compression callbacks elastic DistributedOptimizer broadcast_global_variables
allreduce allgather broadcast reducescatter load_model
""".split()  # noqa: SIM905
FIXED_SIZE_DTYPES = [
    tf.bool,
    tf.uint8,
    tf.int8,
    tf.uint16,
    tf.int16,
    tf.uint32,
    tf.int32,
    tf.uint64,
    tf.int64,
]
FIXED_SIZE_DTYPES += [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.complex64, tf.complex128]
KERAS_CALLBACKS = [
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
]
KERAS_ELASTIC = [
    "KerasState",
    "CommitStateCallback",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]


def test_horovods_tensorflow_and_keras_names_are_all_there() -> None:
    import hpcdl.keras as hvd_keras
    import hpcdl.tensorflow.keras as hvd_tf_keras

    assert [n for n in HOROVOD_TENSORFLOW_NAMES if not hasattr(hvd, n)] == []
    for module in (hvd_keras, hvd_tf_keras):
        assert [n for n in HOROVOD_KERAS_NAMES if not hasattr(module, n)] == []
        assert [n for n in KERAS_CALLBACKS if not hasattr(module.callbacks, n)] == []
        assert [n for n in KERAS_ELASTIC if not hasattr(module.elastic, n)] == []
    assert hvd.elastic.TensorFlowKerasState is hvd_tf_keras.elastic.KerasState
    assert hvd.HorovodInternalError is hvd.HpcdlInternalError and issubclass(
        hvd.HorovodInternalError, Exception
    )
    assert hvd_keras.Compression is hvd.Compression and hvd_keras.ProcessSet is hvd.ProcessSet


@pytest.mark.parametrize("dtype", FIXED_SIZE_DTYPES)
def test_every_fixed_size_dtype_travels_as_its_own_bytes(dtype: tf.DType) -> None:
    wire = wire_of(dtype)
    for shape in [(), (3,), (2, 3)]:
        original = np.arange(int(np.prod(shape)) or 1).reshape(shape).astype(dtype.as_numpy_dtype)
        sent = wire.send(original)
        assert sent.flags.c_contiguous and sent.dtype == wire.view and sent.ndim >= 1
        assert sent.nbytes == original.nbytes and wire.runtime.itemsize == wire.view.itemsize
        if wire.pairs:
            assert sent.shape == (*(original.shape or (1,)), 2)
        back = wire.receive(sent.copy(), original.dtype, original.shape)
        assert back.dtype == original.dtype and np.array_equal(back, original)


def test_reductions_widen_or_refuse_what_the_runtime_cannot_reduce_exactly() -> None:
    assert reduction_dtype(tf.uint16, hvd.Sum) == tf.int32
    assert reduction_dtype(tf.uint32, hvd.Max) == tf.int64
    assert reduction_dtype(tf.float16, hvd.Product) == tf.float16
    assert reduction_dtype(tf.complex128, hvd.Average) == tf.complex128
    with pytest.raises(ValueError, match="cast them to int64 or float64"):
        reduction_dtype(tf.uint64, hvd.Sum)
    with pytest.raises(ValueError, match="not defined for complex numbers"):
        reduction_dtype(tf.complex64, hvd.Min)
    with pytest.raises(ValueError, match="cannot move tensors of dtype string"):
        wire_of(tf.string)


def test_groups_option_orders_and_sizes_the_atomic_groups() -> None:
    assert split_list(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    positions, keys = [0, 2, 3, 5], ["a", "c", "d", "f"]
    assert group_order(None, positions, keys, str) == ([0, 2, 3, 5], [1, 1, 1, 1])
    assert group_order(2, positions, keys, str) == ([0, 2, 3, 5], [2, 2])
    assert group_order(8, positions, keys, str) == ([0, 2, 3, 5], [1, 1, 1, 1])
    # Listed variables go together (those without a gradient here are skipped); the rest alone.
    assert group_order([["f", "a", "x"], ["d"]], positions, keys, str) == ([5, 0, 3, 2], [2, 1, 1])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_local_aggregation_sums_passes_and_reduces_on_the_last(compiled: bool) -> None:
    source = tf.Variable([0.0, 0.0])
    reduced_calls = []

    def reduce(sums: list, sources: list) -> list:
        reduced_calls.append(len(sums))
        return [s * 10.0 for s in sums]  # stands in for the allreduce

    aggregation = LocalGradientAggregation(passes=3, average=True)

    def one_pass(g: tf.Tensor) -> tuple:
        [out] = aggregation([g], [source], reduce)
        return out, aggregation.complete()

    run = tf.function(one_pass) if compiled else one_pass
    outs = [run(tf.constant([1.0, 2.0]) * k) for k in (1, 2, 3, 1)]
    assert [bool(done) for _, done in outs] == [False, False, True, False]
    assert np.allclose(outs[0][0], [1, 2]) and np.allclose(outs[1][0], [3, 6])  # the local sums so far
    assert np.allclose(outs[2][0], [20, 40])  # (1 + 2 + 3) * [1, 2] reduced, divided by 3 passes
    assert np.allclose(outs[3][0], [1, 2]), "the sums start over after a reduction"
    assert reduced_calls and all(n == 1 for n in reduced_calls)
    with pytest.raises(ValueError, match="backward_passes_per_step must be > 0"):
        LocalGradientAggregation(passes=0)


def test_collectives_before_init_say_what_to_do() -> None:
    assert not hvd.is_initialized()
    with pytest.raises(HpcdlNotInitializedError, match="init"):
        hvd.allreduce(tf.ones(2))
    with tf.GradientTape() as tape:
        variable = tf.Variable(1.0)
        loss = variable * 2
    with pytest.raises(HpcdlNotInitializedError, match=r"call hpcdl.init\(\)"):
        hvd.DistributedGradientTape(tape).gradient(loss, [variable])


@pytest.fixture
def one_process(monkeypatch: pytest.MonkeyPatch):
    for var in ("HPCDL_RANK", "HPCDL_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(var, raising=False)
    hvd.init()
    yield
    hvd.shutdown()


def test_every_op_of_one_process_eagerly_and_in_a_graph(one_process) -> None:
    x = tf.reshape(tf.range(6, dtype=tf.float32), [3, 2])

    def ops(t: tf.Tensor) -> list:
        output, received = hvd.alltoall(t, splits=[3])
        return [
            hvd.allreduce(t),
            hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
            *hvd.grouped_allreduce([t, t * 2], op=hvd.Max),
            hvd.allgather(t),
            hvd.broadcast(t, root_rank=0),
            output,
            hvd.reducescatter(t),
            tf.cast(received, tf.float32),
        ]

    for run in (ops, tf.function(ops)):
        out = [o.numpy() for o in run(x)]
        for got, want in zip(out, [x, x, x, x * 2, x, x, x, x, [3.0]]):
            np.testing.assert_array_equal(got, want)
    assert int(hvd.join()) == 0
    hvd.barrier()


def test_eager_results_are_adopted_in_place_and_keep_their_memory(one_process) -> None:
    """An eager result becomes a tensor over the engine's output itself (DLPack) where TensorFlow can use
    that memory as it is; an unaligned or bfloat16 array is copied (TensorFlow's kernels abort on unaligned
    memory). A large result lies on a block of the pool, which must not serve the next result while the
    tensor lives."""
    import ml_dtypes

    from hpcdl.tensorflow._engine import _empty
    from hpcdl.tensorflow.mpi_ops import _adopt

    for dtype in (
        np.float16,
        np.float32,
        np.float64,
        np.int8,
        np.int32,
        np.int64,
        np.uint16,
        np.bool_,
        np.complex64,
    ):
        aligned = _empty((5,), dtype)
        aligned[:] = 1
        adopted = _adopt(aligned)
        aligned[0] = 0
        assert adopted.numpy()[0] == 0, f"{np.dtype(dtype)}: copied, not adopted"
    for array in (np.arange(17, dtype=np.float32)[1:], np.ones(4, ml_dtypes.bfloat16)):
        copied = _adopt(array)
        array[0] = 7
        assert copied.numpy()[0] != 7 and float(tf.reduce_sum(tf.cast(copied, tf.float32))) > 0
    first = hvd.allgather(tf.fill([1 << 20], 1.0))  # 4 MiB: a block of the pool
    second = hvd.allgather(tf.fill([1 << 20], 2.0))
    assert float(tf.reduce_min(first)) == float(tf.reduce_max(first)) == 1.0
    assert float(tf.reduce_min(second)) == 2.0


def test_tape_and_keras_optimizer_change_nothing_in_one_process(one_process) -> None:
    import hpcdl.keras as hvd_keras

    variable = tf.Variable([1.0, -2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(variable**2)
    assert isinstance(hvd.DistributedGradientTape(tape), tf.GradientTape)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(variable**2)
    np.testing.assert_allclose(hvd.DistributedGradientTape(tape).gradient(loss, variable), [2.0, -4.0])

    def trained(distributed: bool) -> list:
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        optimizer = keras.optimizers.Adam(0.1)
        model.compile(
            optimizer=hvd_keras.DistributedOptimizer(optimizer) if distributed else optimizer, loss="mse"
        )
        rng = np.random.RandomState(0)
        model.fit(rng.randn(16, 3), rng.randn(16, 2), batch_size=4, verbose=0)
        return [w.numpy() for w in model.weights]

    for a, b in zip(trained(True), trained(False)):
        np.testing.assert_array_equal(a, b)
    wrapped = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))  # horovod.tensorflow's entry point too
    assert isinstance(wrapped, keras.optimizers.SGD) and is_distributed(type(wrapped))
    with pytest.raises(NotImplementedError, match="wrap a Keras optimizer"):
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))


def test_xla_compiled_functions_are_refused_with_what_to_do(one_process) -> None:
    # AutoGraph re-raises an error of a RuntimeError subclass from traced code as its StagingError, whose
    # message carries hpcdl's error class and text.
    with pytest.raises(Exception, match="jit_compile=False") as refused:
        tf.function(lambda t: hvd.allreduce(t), jit_compile=True)(tf.ones(2))
    assert isinstance(refused.value, HpcdlUnsupportedError) or "HpcdlUnsupportedError" in str(refused.value)


def test_check_build_shows_tensorflow_and_keras_with_versions() -> None:
    frameworks = {c.name: c for c in check_build().frameworks}
    assert (
        frameworks["TensorFlow"].available
        and frameworks["TensorFlow"].detail == f"tensorflow {tf.__version__}"
    )
    assert frameworks["Keras"].available
    assert frameworks["Keras"].detail == f"keras {keras.__version__} on the {keras.backend.backend()} backend"


@pytest.mark.parametrize("legacy", ["0", "1"])
def test_check_build_says_which_keras_tf_keras_is(monkeypatch: pytest.MonkeyPatch, legacy: str) -> None:
    from importlib.metadata import version

    monkeypatch.setenv("TF_USE_LEGACY_KERAS", legacy)
    row = {c.name: c for c in check_build().frameworks}["tf.keras"]
    if legacy == "0":
        assert row.available and row.detail.startswith(f"Keras 3, keras {version('keras')}"), row
    elif importlib.util.find_spec("tf_keras") is None:
        assert not row.available and "pip install --no-deps tf-keras" in row.reason, row
    else:
        assert row.available and row.detail.startswith(f"tf-keras {version('tf-keras')}"), row


def test_keras_and_tensorflow_packages_do_not_import_each_other() -> None:
    """hpcdl.tensorflow (with its keras) never imports hpcdl.keras; hpcdl._keras imports neither framework
    API (on Keras' torch backend, where Keras imports torch itself, nothing of TensorFlow); hpcdl.keras on
    TensorFlow does not import torch."""
    script = (
        "import sys; import hpcdl.tensorflow.keras, hpcdl.tensorflow.elastic;"
        "hpcdl.tensorflow.elastic.TensorFlowKerasState;"
        "assert 'hpcdl.keras' not in sys.modules, 'hpcdl.tensorflow imports hpcdl.keras';"
        "import hpcdl.keras; assert 'torch' not in sys.modules, 'hpcdl.keras imports torch'"
    )
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=240)
    neutral = "import sys, hpcdl._keras.callbacks, hpcdl._keras.elastic, hpcdl._keras.optimizer;" + (
        "assert not {'hpcdl.tensorflow', 'hpcdl.torch', 'tensorflow'} & set(sys.modules)"
    )
    torch_env = dict(env, KERAS_BACKEND="torch")
    subprocess.run([sys.executable, "-c", neutral], check=True, env=torch_env, timeout=240)


def test_graph_collectives_fall_back_to_waiting_in_their_op_without_a_compiler(tmp_path) -> None:
    """Where the latch kernel cannot be built, hpcdl warns once, saying what to install, and graph
    collectives still run (waiting inside their op)."""
    script = """
import warnings
import tensorflow as tf
import hpcdl.tensorflow as hvd
hvd.init()
f = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum) + hvd.allgather(x))
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    assert f(tf.ones(2)).numpy().tolist() == [2.0, 2.0]
    assert f(tf.ones(2)).numpy().tolist() == [2.0, 2.0]
texts = [str(w.message) for w in seen if "asynchronous graph kernel" in str(w.message)]
assert len(texts) == 1 and "C++ compiler" in texts[0], texts
"""
    env = dict(
        os.environ, CXX=str(tmp_path / "no-compiler"), XDG_CACHE_HOME=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="3"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=240)
