"""Elastic training with TensorFlow (Horovod's ``hvd.elastic``): ``run``, ``TensorFlowState`` for a list of
variables and ``TensorFlowKerasState`` for a Keras model and its optimizer.

``run`` restores the last committed state, re-initializes hpcdl and synchronizes the state from rank 0
whenever a collective fails. Eagerly a failed collective raises ``HorovodInternalError``; inside a
``tf.function`` TensorFlow reports it as a ``tf.errors.OpError`` carrying hpcdl's message, which ``run``
recognizes (as Horovod recognizes its own ops' errors).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import tensorflow as tf

from hpcdl.common.basics import rank
from hpcdl.common.elastic_state import ObjectState, State, VariablesState, run_fn
from hpcdl.common.exceptions import (
    HostsUpdatedInterrupt,
    HpcdlInternalError,
    HpcdlMismatchError,
    HpcdlTimeoutError,
)
from hpcdl.tensorflow.basics import init, shutdown
from hpcdl.tensorflow.functions import broadcast_object, broadcast_variables

# How a failed collective inside a tf.function shows in TensorFlow's error message.
_INTERNAL_ERRORS = tuple(cls.__name__ for cls in (HpcdlInternalError, HpcdlTimeoutError, HpcdlMismatchError))


def _reset() -> None:
    shutdown()
    init()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``train(state, ...)``: sync ``state`` from rank 0, call ``train``; on a failed collective
    restore the committed state, re-initialize and try again. No collective may run before the decorated
    function is called (new ranks would deadlock)."""

    @functools.wraps(func)
    def internal_errors(state: State, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as exc:
            if any(name in exc.message for name in _INTERNAL_ERRORS):
                raise HpcdlInternalError(exc.message) from exc
            raise

    return run_fn(internal_errors, _reset)


class TensorFlowState(VariablesState):
    """State of a list of ``tf.Variable`` (TensorFlow 2, eager), plus plain attributes given as keyword
    arguments. ``session`` (TensorFlow 1) is accepted for compatibility and not needed."""

    def __init__(self, variables: Optional[list[Any]] = None, session: Any = None, **kwargs: Any) -> None:
        if variables is None:
            raise ValueError(
                "TensorFlowState needs variables=[...]: TensorFlow 2 has no global variable collection"
            )
        super().__init__(
            list(variables),
            broadcast_variables,
            bcast_object=broadcast_object,
            get_rank=rank,
            **kwargs,
        )


def __getattr__(name: str) -> Any:
    # TensorFlowKerasState is hpcdl.tensorflow.keras's KerasState; imported on first use so that
    # hpcdl.tensorflow does not import Keras.
    if name == "TensorFlowKerasState":
        from hpcdl.tensorflow.keras.elastic import KerasState

        return KerasState
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TensorFlowState",
    "run",
]
