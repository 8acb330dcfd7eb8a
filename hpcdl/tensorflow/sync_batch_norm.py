"""``hvd.SyncBatchNormalization``: Keras' batch normalization whose training statistics are those of the
whole global batch (every rank's rows), as Horovod's.

Each rank sums its rows and their squares over the normalized axes; one grouped Sum-allreduce of (sum,
sum of squares, row count) gives every rank the global mean and variance. The allreduce is
differentiable, so the gradient flows through the other ranks' statistics too. The layer is a subclass of
``tf.keras.layers.BatchNormalization``, of whichever Keras ``tf.keras`` is (Keras 3, or tf-keras under
``TF_USE_LEGACY_KERAS=1``); inference uses the moving statistics, as usual.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from hpcdl.common.reduce_ops import Sum
from hpcdl.tensorflow.collectives import grouped_allreduce


def global_moments(inputs: tf.Tensor, axes: Sequence[int], keepdims: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """Mean and variance of ``inputs`` over ``axes`` and over every rank's rows."""
    dtype = inputs.dtype
    x = tf.cast(inputs, tf.float32) if dtype in (tf.float16, tf.bfloat16) else inputs
    axes = [a % x.shape.rank for a in axes]
    total = tf.reduce_sum(x, axis=axes, keepdims=keepdims)
    squares = tf.reduce_sum(tf.square(x), axis=axes, keepdims=keepdims)
    shape = tf.shape(x)
    count = tf.cast(tf.reduce_prod(tf.gather(shape, axes)), x.dtype)
    total, squares, count = grouped_allreduce([total, squares, tf.reshape(count, [1])], op=Sum)
    mean = total / count[0]
    variance = tf.maximum(squares / count[0] - tf.square(mean), 0.0)
    return tf.cast(mean, dtype), tf.cast(variance, dtype)


def _layer_class() -> type:
    keras = tf.keras
    base = keras.layers.BatchNormalization
    legacy = base.__module__.startswith("tf_keras")

    class SyncBatchNormalization(base):  # type: ignore[valid-type, misc]
        """Batch normalization over the global batch (see the module's doc); takes BatchNormalization's
        arguments."""

        def __init__(self, **kwargs: Any) -> None:
            if legacy:
                kwargs["fused"] = False  # the fused kernel computes the statistics itself
            super().__init__(**kwargs)

        if legacy:

            def _calculate_mean_and_var(
                self, inputs: tf.Tensor, reduction_axes: Sequence[int], keep_dims: bool, mask: Any = None
            ) -> tuple[tf.Tensor, tf.Tensor]:
                if mask is not None:
                    raise NotImplementedError("hvd.SyncBatchNormalization does not support masks")
                return global_moments(inputs, reduction_axes, keep_dims)

        else:

            def _moments(self, inputs: tf.Tensor, mask: Any) -> tuple[tf.Tensor, tf.Tensor]:
                if mask is not None:
                    raise NotImplementedError("hvd.SyncBatchNormalization does not support masks")
                return global_moments(inputs, self._reduction_axes, keepdims=False)

    return SyncBatchNormalization


SyncBatchNormalization = _layer_class()
