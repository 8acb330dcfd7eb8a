"""Which framework serves ``hpcdl.keras``: the one Keras 3 runs on.

Keras 3 runs on TensorFlow, PyTorch or JAX. On TensorFlow the work goes through ``hpcdl.tensorflow`` (a
compiled train step reduces its gradients in graph ops); on PyTorch through ``hpcdl.torch``, whose tensors
Keras' eager train step hands over as they are. JAX compiles its train step with XLA, which can run no
Python collective, so it is refused with what to do. The framework is imported only when the backend
needs it: a TensorFlow user never imports torch, a PyTorch user never imports TensorFlow.
"""

from __future__ import annotations

import importlib

import keras

from hpcdl._keras.framework import Framework
from hpcdl.common.exceptions import HpcdlUnsupportedError

# The module holding each backend's FRAMEWORK.
_FRAMEWORKS = {"tensorflow": "hpcdl.tensorflow.keras._framework", "torch": "hpcdl.keras._torch"}


def current() -> Framework:
    """The framework for the Keras backend in use (a clear error for one hpcdl cannot serve)."""
    name = keras.backend.backend()
    if name not in _FRAMEWORKS:
        why = (
            " (JAX compiles the train step with XLA, which runs no Python collective)"
            if name == "jax"
            else ""
        )
        raise HpcdlUnsupportedError(
            f"hpcdl.keras supports Keras on the tensorflow and torch backends, not on {name!r}{why}"
            + "; set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch before importing Keras"
        )
    return importlib.import_module(_FRAMEWORKS[name]).FRAMEWORK
