"""Gradient compression for allreduce (Horovod's ``hvd.Compression.none`` / ``hvd.Compression.fp16``)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class Compressor:
    """Interface: ``compress`` returns the tensor to send and a context; ``decompress`` undoes it."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send tensors as they are (the default)."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16 (half the bytes of float32); other dtypes go unchanged."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        if tensor.dtype.is_floating:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        if ctx is not None and ctx.is_floating and tensor.dtype != ctx:
            return tf.cast(tensor, ctx)
        return tensor


class Compression:
    """Optional gradient compression used by ``allreduce``, ``DistributedGradientTape`` and
    ``DistributedOptimizer``."""

    none = NoneCompressor
    fp16 = FP16Compressor
