"""Horovod's Keras callbacks for Keras 3, on the TensorFlow and the PyTorch backend (see
``hpcdl._keras.callbacks`` for what each does)."""

from __future__ import annotations

import keras

from hpcdl._keras import callbacks as _impl
from hpcdl.keras import _backend


class BroadcastGlobalVariablesCallback(_impl.BroadcastGlobalVariablesCallback, keras.callbacks.Callback):
    __doc__ = _impl.BroadcastGlobalVariablesCallback.__doc__
    framework = staticmethod(_backend.current)


class MetricAverageCallback(_impl.MetricAverageCallback, keras.callbacks.Callback):
    __doc__ = _impl.MetricAverageCallback.__doc__
    framework = staticmethod(_backend.current)


class LearningRateScheduleCallback(_impl.LearningRateScheduleCallback, keras.callbacks.Callback):
    __doc__ = _impl.LearningRateScheduleCallback.__doc__
    framework = staticmethod(_backend.current)


class LearningRateWarmupCallback(_impl.LearningRateWarmupCallback, keras.callbacks.Callback):
    __doc__ = _impl.LearningRateWarmupCallback.__doc__
    framework = staticmethod(_backend.current)


__all__ = [
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]
