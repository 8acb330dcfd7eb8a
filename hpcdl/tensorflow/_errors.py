"""hpcdl's errors as TensorFlow sees them: each is raised as a class that is both the TensorFlow error
Horovod's ops raise (``tf.errors.FailedPreconditionError`` for ranks that disagree,
``tf.errors.InvalidArgumentError`` for bad arguments, ...) and the hpcdl exception (so ``except
HorovodInternalError`` and elastic ``run`` still see it). In a graph, the latch fails its op with the same
TensorFlow code and a message that starts with the hpcdl class's name.
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf

from hpcdl.common.exceptions import (
    HpcdlConfigError,
    HpcdlError,
    HpcdlMismatchError,
    HpcdlShutdownError,
    HpcdlTimeoutError,
    HpcdlUnsupportedError,
)

# Most specific first.
_CODES: list[tuple[type[BaseException], type[tf.errors.OpError], int]] = [
    (HpcdlMismatchError, tf.errors.FailedPreconditionError, tf.errors.FAILED_PRECONDITION),
    (HpcdlTimeoutError, tf.errors.DeadlineExceededError, tf.errors.DEADLINE_EXCEEDED),
    (HpcdlShutdownError, tf.errors.AbortedError, tf.errors.ABORTED),
    (HpcdlConfigError, tf.errors.InvalidArgumentError, tf.errors.INVALID_ARGUMENT),
    (HpcdlUnsupportedError, tf.errors.UnimplementedError, tf.errors.UNIMPLEMENTED),
    (ValueError, tf.errors.InvalidArgumentError, tf.errors.INVALID_ARGUMENT),
]


def _tensorflow_error(error: type[BaseException]) -> tuple[type[tf.errors.OpError], int]:
    for cls, tf_class, code in _CODES:
        if issubclass(error, cls):
            return tf_class, code
    return tf.errors.UnknownError, tf.errors.UNKNOWN


@functools.cache
def _both(error: type[BaseException]) -> type[BaseException]:
    """A class deriving from ``error`` and from its TensorFlow error class."""
    tf_class = _tensorflow_error(error)[0]

    # TensorFlow's signature, which AutoGraph calls to re-raise an error met while tracing; hpcdl passes
    # the message alone.
    def __init__(self: Any, node_def: Any, op: Any = None, message: Any = None, *args: Any) -> None:
        if op is None and message is None:
            node_def, message = None, node_def
        tf_class.__init__(self, node_def, op, message, *args)

    return type(error.__name__, (tf_class, error), {"__init__": __init__})


def as_tensorflow(exc: BaseException) -> BaseException:
    """``exc`` as an error of both kinds (hpcdl errors and ``ValueError``); anything else as it is."""
    if isinstance(exc, tf.errors.OpError) or not isinstance(exc, (HpcdlError, ValueError)):
        return exc
    return _both(type(exc))(str(exc))


def code_and_message(exc: BaseException) -> tuple[int, str]:
    """The TensorFlow error code and message a graph op fails with for ``exc``."""
    return int(_tensorflow_error(type(exc))[1]), f"{type(exc).__name__}: {exc}"


def invalid_argument(message: str) -> BaseException:
    """A bad argument: ``tf.errors.InvalidArgumentError`` that is also a ``ValueError``."""
    return _both(ValueError)(message)
