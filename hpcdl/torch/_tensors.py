"""Torch tensors as raw views the runtime can read and write (``hpcdl.common.types.Buffer``).

CPU tensors are handed to the engine zero-copy: the engine reads from and writes into the tensor's own
memory, so the tensor must stay alive (and untouched) until its handle completes; the handle table keeps
that reference. Outputs the engine allocates itself (allgather, alltoall) come back as bytes and are
viewed as a tensor of the input's dtype.
"""

from __future__ import annotations

import numpy as np
import torch

from hpcdl.common.types import Buffer, DType

_DTYPES: dict[torch.dtype, DType] = {
    torch.uint8: DType.UINT8,
    torch.int8: DType.INT8,
    torch.int16: DType.INT16,
    torch.int32: DType.INT32,
    torch.int64: DType.INT64,
    torch.float16: DType.FLOAT16,
    torch.bfloat16: DType.BFLOAT16,
    torch.float32: DType.FLOAT32,
    torch.float64: DType.FLOAT64,
    torch.bool: DType.BOOL,
}


def runtime_dtype(tensor: torch.Tensor) -> DType:
    """The runtime's code for the tensor's dtype; a clear error for dtypes it cannot reduce."""
    try:
        return _DTYPES[tensor.dtype]
    except KeyError:
        supported = ", ".join(str(d).replace("torch.", "") for d in _DTYPES)
        raise ValueError(
            f"Tensor type {tensor.type()} is not supported by hpcdl collectives; "
            f"convert it to one of: {supported}"
        ) from None


def buffer_of(tensor: torch.Tensor) -> Buffer:
    """A zero-copy view of a contiguous CPU tensor."""
    if tensor.device.type != "cpu":
        raise ValueError(f"internal: buffer_of expects a CPU tensor, got one on {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError("internal: buffer_of expects a contiguous tensor")
    # A 0-d tensor travels as one element.
    shape = tuple(tensor.shape) or (1,)
    return Buffer(ptr=tensor.data_ptr(), dtype=runtime_dtype(tensor), shape=shape)


def tensor_from_bytes(data: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """View the engine's output bytes (a uint8 NumPy array it already copied) as a tensor."""
    raw = torch.from_numpy(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    if raw.numel() == 0:
        return torch.empty(shape, dtype=dtype)
    return raw.view(dtype).reshape(shape)
