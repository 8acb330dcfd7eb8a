"""dtype mapping and raw buffer views."""

from __future__ import annotations

import numpy as np
import pytest

from hpcdl.common.rendezvous import make_secret
from hpcdl.common.types import Buffer, DType, dtype_of


def test_dtype_of_every_numpy_type() -> None:
    pairs = {np.uint8: DType.UINT8, np.int8: DType.INT8, np.int16: DType.INT16, np.int32: DType.INT32,
             np.int64: DType.INT64, np.float16: DType.FLOAT16, np.float32: DType.FLOAT32,
             np.float64: DType.FLOAT64, np.bool_: DType.BOOL}  # fmt: skip
    for numpy_type, dtype in pairs.items():
        assert dtype_of(np.zeros(2, dtype=numpy_type)) is dtype
        assert dtype.itemsize == np.dtype(numpy_type).itemsize
    assert dtype_of(np.zeros(2, dtype=">f4")) is DType.FLOAT32
    with pytest.raises(TypeError, match="complex128"):
        dtype_of(np.zeros(2, dtype=np.complex128))


def test_buffer_views() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    buf = Buffer.from_numpy(a)
    assert (buf.ptr, buf.dtype, buf.shape, buf.count, buf.nbytes) == (
        a.ctypes.data,
        DType.FLOAT32,
        (2, 3),
        6,
        24,
    )
    assert Buffer.from_numpy(np.zeros(4, np.uint16), DType.BFLOAT16).dtype is DType.BFLOAT16
    with pytest.raises(ValueError, match="contiguous"):
        Buffer.from_numpy(a.T)
    with pytest.raises(ValueError, match="item size"):
        Buffer.from_numpy(np.zeros(4, np.float32), DType.BFLOAT16)


def test_secrets_are_fresh_hex() -> None:
    a, b = make_secret(), make_secret()
    assert a != b and len(a) == 64 and int(a, 16) >= 0
