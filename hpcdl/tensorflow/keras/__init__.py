"""Horovod's ``horovod.tensorflow.keras`` for Keras 3 on TensorFlow: ``hpcdl.keras`` with the TensorFlow
backend required (``import hpcdl.tensorflow.keras as hvd``)."""

from __future__ import annotations

import keras

from hpcdl.common.exceptions import HpcdlUnsupportedError

if keras.backend.backend() != "tensorflow":
    raise HpcdlUnsupportedError(
        f"hpcdl.tensorflow.keras is Keras on TensorFlow, but Keras runs on the {keras.backend.backend()!r} "
        "backend here; import hpcdl.keras, which serves it, or set KERAS_BACKEND=tensorflow"
    )

from hpcdl.keras import *  # noqa: F403  (the same API)
from hpcdl.keras import __all__  # noqa: F401
from hpcdl.tensorflow.keras import callbacks, elastic  # noqa: F401  (Horovod's submodules)
