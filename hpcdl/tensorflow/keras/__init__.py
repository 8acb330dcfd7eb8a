"""Horovod's ``horovod.tensorflow.keras`` for whichever Keras ``tf.keras`` is: Keras 3 (TensorFlow's default)
or tf-keras 2.x (Keras 2: ``pip install tf-keras`` and set ``TF_USE_LEGACY_KERAS=1`` before TensorFlow is
imported), detected at import. ``import hpcdl.tensorflow.keras as hvd`` serves both with the same API:
``DistributedOptimizer`` (any Keras 3 optimizer, tf-keras' and ``tf.keras.optimizers.legacy.*``),
``PartialDistributedOptimizer``, the callbacks, ``load_model``, elastic ``KerasState``.
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

import hpcdl.tensorflow as _hvd
from hpcdl._keras import collectives as _collectives
from hpcdl.common.exceptions import HpcdlInternalError, HpcdlUnsupportedError
from hpcdl.common.reduce_ops import Adasum, Average, Max, Min, Product, Sum
from hpcdl.tensorflow.keras import callbacks, elastic
from hpcdl.tensorflow.keras._flavour import LEGACY, keras
from hpcdl.tensorflow.keras._framework import FRAMEWORK
from hpcdl.tensorflow.keras.optimizers import DistributedOptimizer, PartialDistributedOptimizer, load_model

if not LEGACY and keras.backend.backend() != "tensorflow":
    raise HpcdlUnsupportedError(
        f"hpcdl.tensorflow.keras is Keras on TensorFlow, but Keras runs on the {keras.backend.backend()!r} "
        "backend here; import hpcdl.keras, which serves it, or set KERAS_BACKEND=tensorflow"
    )

init = _hvd.init
shutdown = _hvd.shutdown
is_initialized = _hvd.is_initialized
start_timeline = _hvd.start_timeline
stop_timeline = _hvd.stop_timeline
size = _hvd.size
local_size = _hvd.local_size
cross_size = _hvd.cross_size
rank = _hvd.rank
local_rank = _hvd.local_rank
cross_rank = _hvd.cross_rank
is_homogeneous = _hvd.is_homogeneous
mpi_threads_supported = _hvd.mpi_threads_supported
mpi_enabled = _hvd.mpi_enabled
mpi_built = _hvd.mpi_built
gloo_enabled = _hvd.gloo_enabled
gloo_built = _hvd.gloo_built
nccl_built = _hvd.nccl_built
ddl_built = _hvd.ddl_built
ccl_built = _hvd.ccl_built
cuda_built = _hvd.cuda_built
rocm_built = _hvd.rocm_built
ProcessSet = _hvd.ProcessSet
global_process_set = _hvd.global_process_set
add_process_set = _hvd.add_process_set
remove_process_set = _hvd.remove_process_set
Compression = _hvd.Compression
HorovodInternalError = HpcdlInternalError


def allreduce(
    value: Any,
    name: Optional[str] = None,
    average: Optional[bool] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: Optional[int] = None,
    compression: Any = None,
) -> Any:
    """Reduce a tensor-compatible value over all ranks (default op Average); returns a tensor."""
    args = (name, average, prescale_factor, postscale_factor, op, compression)
    return _collectives.allreduce(FRAMEWORK, value, *args)


def allgather(value: Any, name: Optional[str] = None) -> Any:
    """Concatenate a tensor-compatible value from every rank along its first dimension."""
    return _collectives.allgather(FRAMEWORK, value, name)


def broadcast(value: Any, root_rank: int, name: Optional[str] = None) -> Any:
    """A tensor-compatible value as it is on ``root_rank``."""
    return _collectives.broadcast(FRAMEWORK, value, root_rank, name)


def reducescatter(value: Any, name: Optional[str] = None, op: int = Average) -> Any:
    """Reduce a tensor-compatible value over all ranks and keep this rank's block of its first dimension."""
    return _collectives.reducescatter(FRAMEWORK, value, name, op)


def broadcast_global_variables(root_rank: int) -> Any:
    """TensorFlow 1's broadcast of every global variable, run in Keras' session (tf-keras) or the default
    one (the op itself where there is none). Eagerly there are none: use
    ``callbacks.BroadcastGlobalVariablesCallback`` or ``hpcdl.tensorflow.broadcast_variables``."""
    op = _hvd.broadcast_global_variables(root_rank)  # raises, with what to do, when eager
    session = keras.backend.get_session() if LEGACY else tf.compat.v1.get_default_session()
    return session.run(op) if session is not None else op


__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "Max",
    "Min",
    "PartialDistributedOptimizer",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "allgather",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "callbacks",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_homogeneous",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]
