"""Which Keras ``tf.keras`` is, decided once at import: Keras 3 (the default with TensorFlow 2.16 and
later), or tf-keras (Keras 2, the ``tf-keras`` package) when ``TF_USE_LEGACY_KERAS=1`` was set before
TensorFlow was imported. ``keras`` is that Keras' own module."""

from __future__ import annotations

import importlib

import tensorflow as tf

keras = importlib.import_module(tf.keras.optimizers.Optimizer.__module__.split(".")[0])
LEGACY = keras.__name__ == "tf_keras"
VERSION = str(getattr(keras, "__version__", "?"))


def is_tf_keras_optimizer(optimizer: object) -> bool:
    """Whether ``optimizer`` is one of tf-keras' (current or legacy), whichever Keras tf.keras is."""
    return any(cls.__module__.startswith("tf_keras.") for cls in type(optimizer).__mro__)
