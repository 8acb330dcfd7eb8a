"""Horovod's public TensorFlow reductions: ``allreduce``, ``grouped_allreduce``, ``reducescatter`` and
``grouped_reducescatter``, with compression and ``tf.IndexedSlices``.

A ``tf.IndexedSlices`` (the gradient of ``tf.gather``, e.g. of an embedding) is reduced as Horovod reduces
it: its values and its indices are allgathered, which represents the sum of every rank's slices (values
divided by the set size for Average) without ever building the dense tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import tensorflow as tf

from hpcdl.common.process_sets import ProcessSet, global_process_set, id_of
from hpcdl.common.reduce_ops import Adasum, Average, Sum, resolve_op
from hpcdl.tensorflow.compression import Compression, Compressor
from hpcdl.tensorflow.mpi_ops import (
    _grouped_allreduce,
    _grouped_reducescatter,
    _set_size,
    _tensor,
    grouped_allgather,
)


def set_size(process_set: ProcessSet, dtype: tf.DType) -> tf.Tensor:
    """The size of the set as a ``dtype`` scalar; read when the graph runs under an elastic launch, where
    it changes between resets."""
    return _set_size(id_of(process_set), dtype)


def _allgather_slices(
    slices: list[tf.IndexedSlices],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    name: Optional[str],
) -> list[tf.IndexedSlices]:
    if op == Adasum:
        raise NotImplementedError(
            "The Adasum reduction does not support sparse tensors; pass sparse_as_dense=True to "
            "DistributedOptimizer / DistributedGradientTape"
        )
    if op not in (Sum, Average):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
    values = grouped_allgather(
        [s.values for s in slices], name=f"{name}.values" if name else None, process_set=process_set
    )
    indices = grouped_allgather(
        [s.indices for s in slices], name=f"{name}.indices" if name else None, process_set=process_set
    )
    if op == Average:
        # True division, as Horovod's: integer values come back as floats (float32 up to 16 bits, else
        # float64), like TensorFlow's ``/`` on integer tensors.
        values = [tf.math.truediv(v, set_size(process_set, v.dtype)) for v in values]
    return [tf.IndexedSlices(v, i, dense_shape=s.dense_shape) for v, i, s in zip(values, indices, slices)]


def allreduce(
    tensor: Any,
    average: Optional[bool] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
) -> Any:
    """Reduce a tensor, variable or ``tf.IndexedSlices`` over the ranks of ``process_set`` (default op
    Average). The result has the input's shape and dtype; ``compression`` only shrinks what travels.
    ``device_dense``/``device_sparse`` are accepted for compatibility: hpcdl reduces in host memory."""
    op = resolve_op(op, average)
    return _reduce_each(
        [tensor], compression, op, prescale_factor, postscale_factor, process_set, name, "allreduce"
    )[0]


def grouped_allreduce(
    tensors: Sequence[Any],
    average: Optional[bool] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
    name: Optional[str] = None,
) -> list[Any]:
    """Reduce a list of tensors (and ``tf.IndexedSlices``) as one atomic group; returns them in order."""
    if not tensors:
        return list(tensors)
    op = resolve_op(op, average)
    return _reduce_each(
        list(tensors),
        compression,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        name,
        "grouped_allreduce",
    )


def _reduce_each(
    tensors: list[Any],
    compression: type[Compressor],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    name: Optional[str],
    what: str,
) -> list[Any]:
    """The dense tensors compressed and reduced as one group, the ``tf.IndexedSlices`` allgathered."""
    results: list[Any] = [None] * len(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if sparse:
        gathered = _allgather_slices(
            [tensors[i] for i in sparse], op, prescale_factor, postscale_factor, process_set, name
        )
        for i, value in zip(sparse, gathered):
            results[i] = value
    if dense:
        compressed, contexts = zip(*[compression.compress(_tensor(tensors[i], what)) for i in dense])
        reduced = _grouped_allreduce(
            list(compressed),
            name=name,
            op=op,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            process_set=process_set,
        )
        for i, value, ctx in zip(dense, reduced, contexts):
            results[i] = compression.decompress(value, ctx)
    return results


def reducescatter(
    tensor: Any,
    device_dense: str = "",
    compression: type[Compressor] = Compression.none,
    op: int = Average,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> tf.Tensor:
    """Reduce ``tensor`` over the set (default op Average) and keep this rank's block of dimension 0."""
    scale = (prescale_factor, postscale_factor)
    return _scatter_each([tensor], compression, op, *scale, process_set, name, "reducescatter")[0]


def grouped_reducescatter(
    tensors: Sequence[Any],
    device_dense: str = "",
    compression: type[Compressor] = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[tf.Tensor]:
    """Reducescatter a list of tensors as one group."""
    if not tensors:
        return list(tensors)
    scale = (prescale_factor, postscale_factor)
    return _scatter_each(list(tensors), compression, op, *scale, process_set, None, "grouped_reducescatter")


def _scatter_each(
    tensors: list[Any],
    compression: type[Compressor],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    name: Optional[str],
    what: str,
) -> list[tf.Tensor]:
    compressed, contexts = zip(*[compression.compress(_tensor(t, what)) for t in tensors])
    reduced = _grouped_reducescatter(
        list(compressed),
        name=name,
        op=op,
        process_set=process_set,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
    )
    return [compression.decompress(r, ctx) for r, ctx in zip(reduced, contexts)]
