"""What ``hpcdl.keras`` needs from the framework under Keras 3, for each backend it supports.

Keras 3 runs on TensorFlow, PyTorch or JAX. On TensorFlow the work goes through ``hpcdl.tensorflow`` (a
compiled train step reduces its gradients with ``tf.numpy_function`` ops); on PyTorch through
``hpcdl.torch``, whose tensors Keras' eager train step hands over as they are. JAX compiles its train
step with XLA, which can run no Python collective, so it is refused with what to do. The framework is
imported only when the backend needs it: a TensorFlow user never imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional

import keras
import numpy as np

from hpcdl.common.exceptions import HpcdlUnsupportedError
from hpcdl.common.reduce_ops import Average

Reduce = Callable[[Sequence[Any], Sequence[Any]], list[Any]]


class TensorFlowBackend:
    """Keras on TensorFlow, through ``hpcdl.tensorflow``."""

    name = "tensorflow"

    def __init__(self) -> None:
        import hpcdl.tensorflow as hvd

        self.hvd = hvd

    def reducer(self, name: str, options: dict[str, Any]) -> Any:
        from hpcdl.tensorflow.gradients import GradientReducer

        return GradientReducer(name, **options)

    def aggregation(self, passes: int, average: bool, sparse_as_dense: bool) -> Any:
        from hpcdl.tensorflow.gradients import LocalGradientAggregation

        return LocalGradientAggregation(passes, average, sparse_as_dense)

    def broadcast_variables(self, variables: Sequence[Any], root_rank: int) -> None:
        self.hvd.broadcast_variables(list(variables), root_rank)

    def tensor(self, value: Any) -> Any:
        import tensorflow as tf

        return tf.convert_to_tensor(value)

    def average(self, values: np.ndarray, name: str) -> np.ndarray:
        return self.hvd.allreduce(self.tensor(values), op=Average, name=name).numpy()


class TorchBackend:
    """Keras on PyTorch, through ``hpcdl.torch``."""

    name = "torch"

    def __init__(self) -> None:
        import hpcdl.torch as hvd

        self.hvd = hvd

    def reducer(self, name: str, options: dict[str, Any]) -> Any:
        from hpcdl.keras._torch import TorchGradientReducer

        return TorchGradientReducer(name, **options)

    def aggregation(self, passes: int, average: bool, sparse_as_dense: bool) -> Any:
        from hpcdl.keras._torch import EagerGradientAggregation

        return EagerGradientAggregation(passes, average)

    def broadcast_variables(self, variables: Sequence[Any], root_rank: int) -> None:
        # A Keras variable holds a torch Parameter; the engine writes the root's values into its memory.
        tensors = [(f"broadcast_variables.{i}", v.value.detach()) for i, v in enumerate(variables)]
        self.hvd.broadcast_parameters(tensors, root_rank)

    def tensor(self, value: Any) -> Any:
        import torch

        return torch.as_tensor(np.asarray(value))

    def average(self, values: np.ndarray, name: str) -> np.ndarray:
        return self.hvd.allreduce(self.tensor(values), op=Average, name=name).numpy()


_BACKENDS: dict[str, Callable[[], Any]] = {"tensorflow": TensorFlowBackend, "torch": TorchBackend}
_current: Optional[Any] = None


def current() -> Any:
    """The backend object for the Keras backend in use (a clear error for one hpcdl cannot serve)."""
    global _current
    name = keras.backend.backend()
    if _current is None or _current.name != name:
        if name not in _BACKENDS:
            raise HpcdlUnsupportedError(
                f"hpcdl.keras supports Keras on the tensorflow and torch backends, not on {name!r}"
                + (
                    " (JAX compiles the train step with XLA, which runs no Python collective)"
                    if name == "jax"
                    else ""
                )
                + "; set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch before importing Keras"
            )
        _current = _BACKENDS[name]()
    return _current
