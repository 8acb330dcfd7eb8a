"""The runtime's enums (bound once, in :mod:`hpcdl.common.abi`), NumPy's view of its dtypes, and a raw buffer
view for the runtime."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcdl.common.abi import DType, OpType, Placement, ReduceOp

__all__ = ["Buffer", "DType", "OpType", "Placement", "ReduceOp", "buffer_formats", "dtype_of"]


_FROM_NUMPY = {
    np.dtype(np.uint8): DType.UINT8,
    np.dtype(np.int8): DType.INT8,
    np.dtype(np.int16): DType.INT16,
    np.dtype(np.int32): DType.INT32,
    np.dtype(np.int64): DType.INT64,
    np.dtype(np.float16): DType.FLOAT16,
    np.dtype(np.float32): DType.FLOAT32,
    np.dtype(np.float64): DType.FLOAT64,
    np.dtype(np.bool_): DType.BOOL,
}


def dtype_of(array: np.ndarray) -> DType:
    """The runtime dtype of a NumPy array (bfloat16 travels as a uint16 view with an explicit DType)."""
    found = _FROM_NUMPY.get(array.dtype)
    if found is not None:
        return found
    try:
        return _FROM_NUMPY[np.dtype(array.dtype).newbyteorder("=")]
    except KeyError:
        supported = ", ".join(sorted(str(d) for d in _FROM_NUMPY))
        raise TypeError(
            f"hpcdl cannot reduce or move arrays of dtype {array.dtype}; supported: {supported} "
            "(bfloat16: pass a uint16 view with dtype=DType.BFLOAT16)"
        ) from None


def buffer_formats() -> dict[str, DType]:
    """The buffer-protocol formats (``memoryview(a).format``) of the arrays whose dtype the runtime has."""
    formats = {}
    for char in np.typecodes["All"]:
        dtype = np.dtype(char)
        if dtype in _FROM_NUMPY:
            formats[memoryview(np.empty(0, dtype)).format] = _FROM_NUMPY[dtype]
    return formats


@dataclass(frozen=True)
class Buffer:
    """A raw view of memory the caller keeps alive until the operation using it completes."""

    ptr: int
    dtype: DType
    shape: tuple[int, ...]

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize

    @staticmethod
    def from_numpy(a: np.ndarray, dtype: DType | None = None) -> Buffer:
        """View a C-contiguous array; ``dtype`` overrides the inferred one (e.g. BFLOAT16 on uint16)."""
        if not a.flags.c_contiguous:
            raise ValueError("hpcdl needs C-contiguous arrays; pass numpy.ascontiguousarray(a)")
        if not a.dtype.isnative:
            raise ValueError(
                "hpcdl needs arrays in native byte order; use a.astype(a.dtype.newbyteorder('='))"
            )
        resolved = dtype_of(a) if dtype is None else DType(dtype)
        if resolved.itemsize != a.dtype.itemsize:
            raise ValueError(f"dtype {resolved.name} does not match the array's item size {a.dtype.itemsize}")
        return Buffer(int(a.ctypes.data), resolved, tuple(int(d) for d in a.shape))
