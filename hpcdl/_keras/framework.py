"""What the Keras machinery needs from a framework API (``hpcdl.tensorflow`` or ``hpcdl.torch``), and the
few places where Keras 3 and tf-keras (Keras 2) differ on an optimizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Protocol

import numpy as np


class Framework(Protocol):
    """A framework API as the Keras machinery uses it."""

    name: str
    hvd: Any  # the framework API module (hpcdl.tensorflow or hpcdl.torch)

    def reducer(self, name: str, options: dict[str, Any]) -> Any:
        """A gradient reducer: ``reducer(grads, variables) -> reduced grads``, ``register_local_source``."""

    def aggregation(self, passes: int, average: bool, sparse_as_dense: bool) -> Any:
        """Local gradient aggregation over ``passes`` backward passes (``complete()``, ``__call__``)."""

    def broadcast_variables(self, variables: Sequence[Any], root_rank: int) -> None: ...

    def average(self, values: np.ndarray, name: str) -> np.ndarray: ...

    def tensor(self, value: Any) -> Any: ...

    def run(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """Elastic ``run``: retry ``func(state)`` after a failed collective."""


def optimizer_variables(optimizer: Any) -> list[Any]:
    """The optimizer's variables: a list in Keras 3 and tf-keras' optimizers, a method of tf-keras' legacy
    ones."""
    if optimizer is None:
        return []
    variables = optimizer.variables
    if callable(variables) and not isinstance(variables, (list, tuple)):
        variables = variables()
    return list(variables)


def optimizer_built(optimizer: Any) -> bool:
    """Whether the optimizer made its variables (Keras 3 ``built``; tf-keras ``_built``; a legacy
    optimizer's hyperparameters)."""
    for attribute in ("built", "_built", "_hypers_created"):
        value = getattr(optimizer, attribute, None)
        if isinstance(value, bool):
            return value
    return False


def build_optimizer(optimizer: Any, variables: Sequence[Any]) -> None:
    """Make the optimizer's variables for ``variables`` (a legacy tf-keras optimizer has no ``build``)."""
    if hasattr(optimizer, "_create_all_weights"):
        optimizer._create_all_weights(list(variables))
    else:
        optimizer.build(list(variables))


def momentum_buffers(optimizer: Any) -> list[Any]:
    """The velocity variables that carry the learning rate inside them (SGD's, RMSprop's momentum)."""
    found = getattr(optimizer, "momentums", None) or getattr(optimizer, "_momentums", None)
    if found:
        return list(found)
    slots = getattr(optimizer, "_slots", None) or {}  # a legacy tf-keras optimizer
    return [named["momentum"] for named in slots.values() if "momentum" in named]


def scalar(value: Any) -> float:
    """A float from a Keras, TensorFlow or PyTorch scalar (a variable, tensor or number)."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    elif hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return float(np.asarray(value))
