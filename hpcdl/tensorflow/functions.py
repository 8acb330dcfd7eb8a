"""Broadcasting variables and arbitrary Python objects (Horovod's ``horovod.tensorflow.functions``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional

import tensorflow as tf

from hpcdl.common import objects
from hpcdl.common.process_sets import ProcessSet, global_process_set, id_of
from hpcdl.tensorflow.mpi_ops import _broadcast, _check_root, _names


def broadcast_variables(
    variables: Sequence[Any],
    root_rank: int,
    process_set: ProcessSet = global_process_set,
    inplace: bool = False,
) -> Any:
    """Overwrite every rank's ``variables`` (``tf.Variable`` or Keras variables) with their values on
    global rank ``root_rank``, all in one batch of broadcasts. Returns the grouped assignments (an op in a
    graph; None eagerly). ``inplace`` is accepted for compatibility: the values are always assigned."""
    variables = list(variables)
    if not variables:
        return tf.no_op() if not tf.executing_eagerly() else None
    for v in variables:
        if not hasattr(v, "assign"):
            raise ValueError(f"broadcast_variables takes variables, got {type(v).__name__}")
    root = _check_root(root_rank, process_set)
    values = [tf.convert_to_tensor(v) for v in variables]
    names = (
        [f"broadcast_variables.{i}" for i in range(len(variables))]
        if tf.executing_eagerly()
        else _names("Broadcast", None, values, process_set)
    )
    received = _broadcast(values, names, root, process_set)
    assignments = [v.assign(r) for v, r in zip(variables, received)]
    return None if tf.executing_eagerly() else tf.group(*assignments)


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    session: Any = None,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Return ``root_rank``'s ``obj`` on every rank of the set (serialized with cloudpickle).

    Other ranks may pass anything (e.g. None): the operation's name does not depend on the object's type.
    ``session`` (TensorFlow 1) is accepted for compatibility and not needed.
    """
    root = _check_root(root_rank, process_set)
    return objects.broadcast_object(obj, root, name, id_of(process_set))


def broadcast_object_fn(
    root_rank: int = 0,
    session: Any = None,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> Callable[[Any], Any]:
    """A function that broadcasts an object from ``root_rank`` (Horovod's TensorFlow 1 helper)."""
    return lambda obj: broadcast_object(obj, root_rank, name=name, process_set=process_set)


def allgather_object(
    obj: Any, session: Any = None, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Return the list of every rank's ``obj`` (in the set's rank order); objects may differ in type."""
    return objects.allgather_object(obj, name, id_of(process_set))
