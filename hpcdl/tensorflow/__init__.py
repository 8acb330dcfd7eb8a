"""Horovod's TensorFlow API on hpcdl's runtime, for TensorFlow 2.21 with Keras 3 or tf-keras: change
``import horovod.tensorflow as hvd`` to ``import hpcdl.tensorflow as hvd`` and the script runs unchanged.

Eagerly the collectives hand NumPy views of the tensors to hpcdl's engine; in a graph (``tf.function`` or
a TensorFlow 1 session) each is submitted by a ``tf.numpy_function`` without waiting and awaited by a small
asynchronous kernel compiled against the installed TensorFlow on first use (see ``mpi_ops``), with static
shapes where they are known and gradients where Horovod has them. Either way they go through the engine:
named negotiation, fusion, the timeline.

A custom training loop needs four lines: ``hvd.init()``; scale the learning rate by ``hvd.size()``;
``tape = hvd.DistributedGradientTape(tape)`` before ``tape.gradient``; and
``hvd.broadcast_variables(model.variables, root_rank=0)`` after the first step (or before it, once the
optimizer is built). Keras users import ``hpcdl.tensorflow.keras`` (or ``hpcdl.keras``).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hpcdl.common.basics import (
    cross_rank,
    cross_size,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_enabled,
    mpi_threads_supported,
    rank,
    size,
)
from hpcdl.common.exceptions import HostsUpdatedInterrupt, HpcdlInternalError
from hpcdl.common.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from hpcdl.common.reduce_ops import Adasum, Average, Max, Min, Product, Sum
from hpcdl.common.reduce_ops import resolve_op as handle_average_backwards_compatibility
from hpcdl.tensorflow.basics import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    mpi_built,
    nccl_built,
    rocm_built,
    shutdown,
    start_timeline,
    stop_timeline,
)
from hpcdl.tensorflow.collectives import allreduce, grouped_allreduce, grouped_reducescatter, reducescatter
from hpcdl.tensorflow.compression import Compression
from hpcdl.tensorflow.functions import (
    allgather_object,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from hpcdl.tensorflow.mpi_ops import (
    _allreduce,
    _grouped_allreduce,
    _grouped_reducescatter,
    _reducescatter,
    allgather,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    grouped_allgather,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from hpcdl.tensorflow.tape import DistributedGradientTape, PartialDistributedGradientTape

HorovodInternalError = HpcdlInternalError


def _executing_eagerly() -> bool:
    """Horovod's helper, which its TensorFlow tests and some user code call."""
    return tf.executing_eagerly()


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """True when ``num_rank`` is a power of two (Horovod's helper for Adasum's constraints)."""
    return num_rank > 0 and (num_rank & (num_rank - 1)) == 0


def broadcast_global_variables(root_rank: int) -> Any:
    """TensorFlow 1's broadcast of every global variable; TensorFlow 2 runs eagerly and keeps none."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. "
            "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead."
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def DistributedOptimizer(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
    """Horovod's ``hvd.DistributedOptimizer`` for a Keras optimizer: ``hpcdl.tensorflow.keras``'s."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise NotImplementedError(
            "hpcdl.tensorflow supports TensorFlow 2: wrap a Keras optimizer (tf.keras.optimizers.*) with "
            "hvd.DistributedOptimizer, or compute gradients with hvd.DistributedGradientTape"
        )
    from hpcdl.tensorflow.keras.optimizers import DistributedOptimizer as keras_optimizer

    return keras_optimizer(optimizer, *args, **kwargs)


def __getattr__(name: str) -> Any:
    # Imported on first use: they load Keras, which a TensorFlow user may not need.
    if name == "elastic":
        import hpcdl.tensorflow.elastic as elastic

        return elastic
    if name == "SyncBatchNormalization":
        from hpcdl.tensorflow.sync_batch_norm import SyncBatchNormalization

        return SyncBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "HpcdlInternalError",
    "Max",
    "Min",
    "PartialDistributedGradientTape",
    "ProcessSet",
    "Product",
    "Sum",
    "SyncBatchNormalization",
    "_allreduce",
    "_grouped_allreduce",
    "_grouped_reducescatter",
    "_reducescatter",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
    "ccl_built",
    "check_num_rank_power_of_2",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "handle_average_backwards_compatibility",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_rank_op",
    "local_size",
    "local_size_op",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "process_set_included_op",
    "rank",
    "rank_op",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "size_op",
    "start_timeline",
    "stop_timeline",
]
