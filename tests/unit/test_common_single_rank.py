"""A job of one process (no launcher): lifecycle, every op, kernels' scaling and rounding, errors."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdl.common as hc
from hpcdl.common import DType, ReduceOp


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch):
    for var in ("HPCDL_RANK", "HPCDL_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(var, raising=False)
    hc.init(timeout=5)
    yield
    hc.shutdown()


def test_not_initialised_errors_say_what_to_do() -> None:
    assert not hc.is_initialized()
    with pytest.raises(hc.HpcdlNotInitializedError, match="init"):
        hc.rank()
    with pytest.raises(hc.HpcdlNotInitializedError, match="init"):
        hc.allreduce(np.ones(2))


def test_lifecycle_and_topology(runtime) -> None:
    assert hc.is_initialized()
    hc.init()  # a second init is a no-op
    assert (hc.rank(), hc.size(), hc.local_rank(), hc.local_size(), hc.cross_rank(), hc.cross_size()) == (
        0, 1, 0, 1, 0, 1,
    )  # fmt: skip
    assert hc.is_homogeneous() and hc.transport_name(True) == "self"
    assert hc.process_set_ids() == [0] and hc.process_set_ranks(0) == [0]


def test_ops_of_one_rank(runtime) -> None:
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert np.array_equal(hc.allreduce(a, op=ReduceOp.AVERAGE, prescale=2.0, postscale=0.5), a)
    assert np.array_equal(hc.allgather(a), a)
    out, splits = hc.alltoall(a)
    assert np.array_equal(out, a) and splits == [3]
    assert np.array_equal(hc.reducescatter(a), a)
    assert hc.broadcast(a.copy(), root=0) is not None
    hc.barrier()
    empty = hc.allreduce(np.zeros((0, 4), np.int64))
    assert empty.shape == (0, 4)


def test_kernel_scaling_and_rounding(runtime) -> None:
    x = np.array([1.0, -3.0, 1000.0, 1e-7, 0.333], dtype=np.float16)
    got = hc.allreduce(x, prescale=0.5, postscale=3.0)
    assert np.array_equal(got, (x.astype(np.float32) * 0.5 * 3.0).astype(np.float16))
    bits = (np.array([1.0, 3.0, -7.5, 1e30], dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    got = hc.allreduce(bits, postscale=1.0 / 3.0, dtype=DType.BFLOAT16)
    want = (bits.astype(np.uint32) << 16).view(np.float32) * np.float32(1.0 / 3.0)
    want_bits = ((want.view(np.uint32) + 0x7FFF + ((want.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)
    assert np.array_equal(got, want_bits)  # round to nearest even
    ints = np.array([7, -7, 100], dtype=np.int32)
    assert np.array_equal(
        hc.allreduce(ints, prescale=0.5), np.array([3, -3, 50], dtype=np.int32)
    )  # truncation
    flags = np.array([True, False, True])
    assert np.array_equal(hc.allreduce(flags, op=ReduceOp.MIN), flags)


def test_bad_arguments(runtime) -> None:
    with pytest.raises(hc.HpcdlConfigError, match="AVERAGE is not defined for bool"):
        hc.allreduce(np.ones(2, dtype=bool), op=ReduceOp.AVERAGE)
    with pytest.raises(hc.HpcdlConfigError, match="splits"):
        hc.alltoall(np.ones(4), splits=[3])
    with pytest.raises(hc.HpcdlConfigError, match="root 1 is not a rank"):
        hc.broadcast(np.ones(2), root=1)
    with pytest.raises(hc.HpcdlConfigError, match="no process set with id 9"):
        hc.allreduce(np.ones(2), process_set=9)
    with pytest.raises(hc.HpcdlConfigError, match="shape, dtype"):
        hc.allreduce(np.ones(2), out=np.ones(3))


def test_engine_helpers_take_any_native_array(runtime) -> None:
    """The NumPy helpers hand arrays straight to the C hot path: every dtype, empty and strided arrays."""
    from hpcdl.common import engine

    for dtype in (np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.bool_):
        a = np.arange(5).astype(dtype)
        np.testing.assert_array_equal(engine.synchronize(engine.allreduce_async(a, op=ReduceOp.SUM)), a)
    empty = np.zeros((0, 3), np.float32)
    assert engine.synchronize(engine.allreduce_async(empty, name="empty")).shape == (0, 3)
    strided = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(engine.synchronize(engine.allreduce_async(strided)), strided)
    in_place = np.arange(4, dtype=np.float32)
    handle = engine.allreduce_async(in_place, name="in.place", op=ReduceOp.SUM, prescale=2.0, out=in_place)
    assert engine.synchronize(handle) is in_place
    np.testing.assert_array_equal(in_place, [0, 2, 4, 6])


def test_reducing_into_a_given_array_takes_the_one_call_c_path(runtime) -> None:
    """``allreduce_async`` into an array the caller gave, in place or not, is one C call (the Python
    helper's checks never run); the dtype it reads from the buffer format must be the array's own, which
    a prescale shows even on one rank. Whatever that path cannot take still gets the Python checks' errors."""
    from hpcdl.common import engine

    class Tagged(np.ndarray):
        pass

    def python_helper_called(a: np.ndarray) -> np.ndarray:
        raise AssertionError(f"the Python helper took an allreduce into a given {a.dtype} array")

    engine.synchronize(engine.allreduce_async(np.ones(1, np.float32), name="bind"))  # binds the C path
    dtypes = (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine, "_contiguous", python_helper_called)
        for dtype in (*dtypes, np.longlong):
            for shape in ((2, 3), ()):
                a = np.arange(6).astype(dtype).reshape(2, 3) if shape else np.array(3, dtype)
                out = np.empty_like(a)
                handle = engine.allreduce_async(a, op=ReduceOp.SUM, prescale=2.0, out=out)
                assert engine.synchronize(handle) is out
                np.testing.assert_array_equal(out, a * 2)
                in_place = a.copy().view(Tagged)
                handle = engine.allreduce_async(in_place, op=ReduceOp.SUM, prescale=2.0, out=in_place)
                assert engine.synchronize(handle) is in_place
                np.testing.assert_array_equal(in_place, a * 2)
        flags = np.array([True, False])
        assert engine.synchronize(engine.allreduce_async(flags, op=ReduceOp.SUM, out=flags)) is flags
        np.testing.assert_array_equal(flags, [True, False])

    a = np.ones(4, np.float32)
    with pytest.raises(hc.HpcdlError, match="shape and dtype"):
        engine.allreduce_async(a, out=np.ones(4, np.float64))
    with pytest.raises(hc.HpcdlError, match="shape and dtype"):
        engine.allreduce_async(a, out=np.ones((2, 2), np.float32))
    with pytest.raises(hc.HpcdlError, match="C-contiguous"):
        engine.allreduce_async(a, out=np.ones((4, 2), np.float32)[:, 0])
    swapped = np.ones(4, np.dtype(np.float32).newbyteorder())
    with pytest.raises(hc.HpcdlError, match="native byte order"):
        engine.allreduce_async(swapped, out=swapped)
    frozen = np.ones(4, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(hc.HpcdlError, match="read-only"):
        engine.allreduce_async(frozen, out=frozen)
    unsupported = np.ones(4, np.uint32)
    with pytest.raises(TypeError, match="cannot reduce or move arrays of dtype uint32"):
        engine.allreduce_async(unsupported, out=unsupported)
    # The refusals took no names: the runtime goes on.
    np.testing.assert_array_equal(engine.synchronize(engine.allreduce_async(a, op=ReduceOp.SUM, out=a)), a)


def test_direct_in_place_allreduce_is_one_c_call(runtime) -> None:
    """``hpcdl.common.allreduce(a, out=a)`` of a writeable C-contiguous array is one C call
    (``_hotpath.allreduce_now``), for every dtype the runtime has: the dtype it reads from the buffer format
    must be the array's own, which a prescale shows on one rank. What it cannot take (a read-only, strided,
    byte-swapped or empty array, a list) returns None there, and ``allreduce`` still gives its errors."""
    from hpcdl.common import _hotpath
    from hpcdl.common.types import _FROM_NUMPY

    for np_dtype in _FROM_NUMPY:
        if np_dtype == np.bool_:
            continue
        a = (np.arange(6) % 3 + 1).astype(np_dtype).reshape(2, 3)
        expected = a.astype(np.float64) * 2
        assert _hotpath.allreduce_now(a, int(ReduceOp.SUM), 2.0, 1.0, 0) is True
        np.testing.assert_allclose(a.astype(np.float64), expected, rtol=1e-2)
        assert hc.allreduce(a, op=ReduceOp.SUM, prescale=0.5, out=a) is a
        np.testing.assert_allclose(a.astype(np.float64), expected / 2, rtol=1e-2)

    frozen = np.ones(4, np.float32)
    frozen.flags.writeable = False
    strided = np.ones(8, np.float32)[::2]
    swapped = np.ones(4, np.dtype(np.float32).newbyteorder())
    for refused in (frozen, strided, swapped, np.ones(0, np.float32), [1.0, 2.0]):
        assert _hotpath.allreduce_now(refused, int(ReduceOp.SUM), 1.0, 1.0, 0) is None
    for refused in (frozen, strided):
        with pytest.raises(hc.HpcdlConfigError, match="writeable C-contiguous"):
            hc.allreduce(refused, out=refused)
        with pytest.raises(hc.HpcdlConfigError, match="writeable C-contiguous"):  # the dtype named too
            hc.allreduce(refused, out=refused, dtype=DType.FLOAT32)
    assert frozen.tolist() == [1.0] * 4
    # A failure inside the runtime raises its exception, with its message, through the C call.
    a = np.ones(3, np.float32)
    with pytest.raises(hc.HpcdlConfigError, match="no process set with id 99"):
        _hotpath.allreduce_now(a, int(ReduceOp.SUM), 1.0, 1.0, 99)
    with pytest.raises(hc.HpcdlConfigError, match="no process set with id 99"):
        hc.allreduce(a, out=a, process_set=99)


def test_engine_refuses_a_broadcast_root_outside_the_set(runtime) -> None:
    from hpcdl.common import engine

    with pytest.raises(
        hc.HpcdlError, match=r"broadcast root 1 is not a member of process set 0 \(members: rank 0\)"
    ):
        engine.broadcast_async(np.ones(2), root=1, name="bad.root")
    np.testing.assert_array_equal(
        engine.synchronize(engine.broadcast_async(np.ones(2), name="bad.root")), [1, 1]
    )


def test_engine_refuses_a_read_only_output(runtime) -> None:
    from hpcdl.common import engine

    a = np.ones(3, np.float32)
    out = np.empty(3, np.float32)
    out.flags.writeable = False
    with pytest.raises(hc.HpcdlError, match="read-only"):
        engine.allreduce_async(a, out=out)
    # The runtime stays usable and the name was not taken.
    np.testing.assert_array_equal(engine.synchronize(engine.allreduce_async(a, name="after")), a)
