"""``horovod.tensorflow.keras.callbacks`` for whichever Keras ``tf.keras`` is (see ``hpcdl._keras.callbacks``
for what each does)."""

from __future__ import annotations

from hpcdl._keras import callbacks as _impl
from hpcdl._keras.framework import Framework
from hpcdl.tensorflow.keras._flavour import keras
from hpcdl.tensorflow.keras._framework import FRAMEWORK


def _framework() -> Framework:
    return FRAMEWORK


class BroadcastGlobalVariablesCallback(_impl.BroadcastGlobalVariablesCallback, keras.callbacks.Callback):
    __doc__ = _impl.BroadcastGlobalVariablesCallback.__doc__
    framework = staticmethod(_framework)


class MetricAverageCallback(_impl.MetricAverageCallback, keras.callbacks.Callback):
    __doc__ = _impl.MetricAverageCallback.__doc__
    framework = staticmethod(_framework)


class LearningRateScheduleCallback(_impl.LearningRateScheduleCallback, keras.callbacks.Callback):
    __doc__ = _impl.LearningRateScheduleCallback.__doc__
    framework = staticmethod(_framework)


class LearningRateWarmupCallback(_impl.LearningRateWarmupCallback, keras.callbacks.Callback):
    __doc__ = _impl.LearningRateWarmupCallback.__doc__
    framework = staticmethod(_framework)


__all__ = [
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]
