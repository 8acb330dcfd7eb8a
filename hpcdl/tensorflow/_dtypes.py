"""How each TensorFlow dtype travels through the runtime, which has ten dtypes of its own.

A tensor crosses as a NumPy view of its bytes: most dtypes map one to one; bfloat16 travels as uint16 bytes
labelled BFLOAT16; the unsigned types the runtime lacks move as the signed type of their width (moving
bytes does not care) and are reduced in a wider signed type (exact for sums, minima, maxima and averages);
complex numbers travel as (real, imaginary) pairs of floats, which sums and averages reduce correctly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from hpcdl.common.reduce_ops import Average, Sum
from hpcdl.common.types import DType


@dataclass(frozen=True)
class Wire:
    """A TensorFlow dtype on the wire: the runtime's dtype, the NumPy dtype of the bytes as sent, and
    whether each element is a (real, imaginary) pair."""

    runtime: DType
    view: np.dtype
    pairs: bool = False

    def send(self, array: np.ndarray) -> np.ndarray:
        """A C-contiguous view (or copy) of ``array`` in the wire's dtype, at least one-dimensional."""
        a = np.require(array, requirements="C")
        if a.ndim == 0:
            a = a.reshape(1)
        if self.pairs:
            return a.view(self.view).reshape((*a.shape, 2))
        return a.view(self.view)

    def receive(self, raw: np.ndarray, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The array of ``dtype`` and ``shape`` whose bytes are ``raw`` (as sent by :meth:`send`)."""
        return np.require(raw, requirements="C").view(dtype).reshape(shape)


_WIRES: dict[tf.DType, Wire] = {
    tf.bool: Wire(DType.BOOL, np.dtype(np.bool_)),
    tf.uint8: Wire(DType.UINT8, np.dtype(np.uint8)),
    tf.int8: Wire(DType.INT8, np.dtype(np.int8)),
    tf.int16: Wire(DType.INT16, np.dtype(np.int16)),
    tf.int32: Wire(DType.INT32, np.dtype(np.int32)),
    tf.int64: Wire(DType.INT64, np.dtype(np.int64)),
    tf.float16: Wire(DType.FLOAT16, np.dtype(np.float16)),
    tf.bfloat16: Wire(DType.BFLOAT16, np.dtype(np.uint16)),
    tf.float32: Wire(DType.FLOAT32, np.dtype(np.float32)),
    tf.float64: Wire(DType.FLOAT64, np.dtype(np.float64)),
    tf.uint16: Wire(DType.INT16, np.dtype(np.int16)),
    tf.uint32: Wire(DType.INT32, np.dtype(np.int32)),
    tf.uint64: Wire(DType.INT64, np.dtype(np.int64)),
    tf.complex64: Wire(DType.FLOAT32, np.dtype(np.float32), pairs=True),
    tf.complex128: Wire(DType.FLOAT64, np.dtype(np.float64), pairs=True),
}

# Unsigned types the runtime cannot reduce are reduced in a signed type twice as wide.
_WIDER: dict[tf.DType, tf.DType] = {tf.uint16: tf.int32, tf.uint32: tf.int64}


def wire_of(dtype: tf.DType) -> Wire:
    """How tensors of ``dtype`` travel; a clear error for dtypes no collective can move."""
    wire = _WIRES.get(tf.as_dtype(dtype).base_dtype)
    if wire is None:
        supported = ", ".join(d.name for d in _WIRES)
        raise ValueError(
            f"hpcdl collectives cannot move tensors of dtype {tf.as_dtype(dtype).name}; "
            f"cast them to one of: {supported}"
        )
    return wire


def reduction_dtype(dtype: tf.DType, op: int) -> tf.DType:
    """The dtype a tensor of ``dtype`` is reduced in with ``op`` (itself, or a wider signed type for
    uint16/uint32); a clear error for reductions that are not defined or not exact."""
    dtype = tf.as_dtype(dtype).base_dtype
    wire_of(dtype)
    if dtype == tf.uint64:
        raise ValueError(
            "hpcdl cannot reduce uint64 tensors (the runtime has no wider integer to reduce them in); "
            "cast them to int64 or float64 first"
        )
    if dtype.is_complex and op not in (Sum, Average):
        raise ValueError(
            f"complex tensors ({dtype.name}) can only be reduced with hvd.Sum or hvd.Average: "
            "Min, Max and Product are not defined for complex numbers"
        )
    return _WIDER.get(dtype, dtype)
