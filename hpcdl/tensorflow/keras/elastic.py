"""``horovod.tensorflow.keras.elastic`` for whichever Keras ``tf.keras`` is: ``KerasState``, the callbacks
that commit it and record progress, and ``run`` (see ``hpcdl._keras.elastic``)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from hpcdl._keras import elastic as _impl
from hpcdl.tensorflow.elastic import run as _run
from hpcdl.tensorflow.keras._flavour import keras
from hpcdl.tensorflow.keras._framework import FRAMEWORK


class KerasState(_impl.KerasState):
    __doc__ = _impl.KerasState.__doc__

    def __init__(self, model: Any, optimizer: Optional[Any] = None, **kwargs: Any) -> None:
        super().__init__(FRAMEWORK, model, optimizer, **kwargs)


class CommitStateCallback(_impl.CommitStateCallback, keras.callbacks.Callback):
    __doc__ = _impl.CommitStateCallback.__doc__


class UpdateBatchStateCallback(_impl.UpdateBatchStateCallback, keras.callbacks.Callback):
    __doc__ = _impl.UpdateBatchStateCallback.__doc__


class UpdateEpochStateCallback(_impl.UpdateEpochStateCallback, keras.callbacks.Callback):
    __doc__ = _impl.UpdateEpochStateCallback.__doc__


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``train(state, ...)``: sync ``state`` from rank 0, call ``train``; on a failed collective
    restore the committed state, re-initialize hpcdl and try again."""
    return _run(func)


__all__ = [
    "CommitStateCallback",
    "KerasState",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]
