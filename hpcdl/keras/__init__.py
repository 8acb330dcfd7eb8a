"""Horovod's Keras API (``horovod.keras``, ``horovod.tensorflow.keras``) for Keras 3: change the import to
``import hpcdl.keras as hvd`` (or ``hpcdl.tensorflow.keras``) and the script runs unchanged.

Keras 3 runs on several backends; this API serves two of them with the same names and callbacks: on
TensorFlow it is ``hpcdl.tensorflow`` underneath, on PyTorch (``KERAS_BACKEND=torch``) ``hpcdl.torch``.
The functions below (``init``, ``rank``, ``Compression``, ``ProcessSet``, ...) are that framework API's own.

The five steps of a Horovod Keras script: ``hvd.init()``; scale the learning rate by ``hvd.size()``;
``opt = hvd.DistributedOptimizer(opt)``; ``callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
hvd.callbacks.MetricAverageCallback(), hvd.callbacks.LearningRateWarmupCallback(...)]``; checkpoint on
rank 0 only.
"""

from __future__ import annotations

from typing import Any, Optional

import keras

from hpcdl._keras import collectives as _collectives
from hpcdl._keras import optimizer as _optimizer
from hpcdl.common.exceptions import HpcdlInternalError
from hpcdl.common.reduce_ops import Adasum, Average, Max, Min, Product, Sum
from hpcdl.keras import _backend, callbacks, elastic

_framework = _backend.current()
_hvd = _framework.hvd

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


def _tf_keras_optimizer(optimizer: Any) -> bool:
    return any(cls.__module__.startswith("tf_keras.") for cls in type(optimizer).__mro__)


def DistributedOptimizer(
    optimizer: Any,
    name: Optional[str] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = None,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = None,
    scale_local_gradients: bool = True,
) -> Any:
    """Wrap a Keras 3 optimizer so that gradients are averaged over the ranks before they are applied (a
    tf-keras one goes to ``hpcdl.tensorflow.keras``). The arguments are Horovod's, described in
    ``hpcdl._keras.optimizer.DistributedOptimizer``."""
    args = (
        optimizer,
        name,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        gradient_predivide_factor,
        op,
        backward_passes_per_step,
        average_aggregated_gradients,
        num_groups,
        groups,
        process_set,
        scale_local_gradients,
    )
    if _tf_keras_optimizer(optimizer):
        from hpcdl.tensorflow.keras.optimizers import DistributedOptimizer as tf_keras_optimizer

        return tf_keras_optimizer(*args)
    return _optimizer.DistributedOptimizer(_framework, *args)


def PartialDistributedOptimizer(
    optimizer: Any,
    name: Optional[str] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = None,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    groups: Any = None,
    process_set: Any = None,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
) -> Any:
    """``DistributedOptimizer`` that keeps the gradients of ``local_layers`` (a Keras layer or a list)
    local: not reduced, divided by the set size unless ``scale_local_gradients=False``."""
    distributed = DistributedOptimizer(
        optimizer,
        name=name,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )
    if _tf_keras_optimizer(optimizer):
        import tf_keras

        return _optimizer.register_local_layers(distributed, local_layers, tf_keras.layers.Layer)
    return _optimizer.register_local_layers(distributed, local_layers, keras.layers.Layer)


def allreduce(
    value: Any,
    name: Optional[str] = None,
    average: Optional[bool] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: Optional[int] = None,
    compression: Any = None,
) -> Any:
    """Reduce a tensor-compatible value over all ranks (default op Average); returns a backend tensor."""
    args = (name, average, prescale_factor, postscale_factor, op, compression)
    return _collectives.allreduce(_framework, value, *args)


def allgather(value: Any, name: Optional[str] = None) -> Any:
    """Concatenate a tensor-compatible value from every rank along its first dimension."""
    return _collectives.allgather(_framework, value, name)


def broadcast(value: Any, root_rank: int, name: Optional[str] = None) -> Any:
    """A tensor-compatible value as it is on ``root_rank``."""
    return _collectives.broadcast(_framework, value, root_rank, name)


def reducescatter(value: Any, name: Optional[str] = None, op: int = Average) -> Any:
    """Reduce a tensor-compatible value over all ranks and keep this rank's block of its first dimension."""
    return _collectives.reducescatter(_framework, value, name, op)


def broadcast_global_variables(root_rank: int) -> Any:
    """TensorFlow 1 only; Keras 3 keeps no global variables: use BroadcastGlobalVariablesCallback."""
    raise RuntimeError(
        "hvd.broadcast_global_variables() needs TensorFlow 1's global variables, which Keras 3 does not "
        "keep; pass hvd.callbacks.BroadcastGlobalVariablesCallback(0) to model.fit, or call "
        "hvd.broadcast_variables(model.weights, root_rank=0) with hpcdl.tensorflow"
    )


def load_model(
    filepath: Any,
    custom_optimizers: Optional[list[type]] = None,
    custom_objects: Optional[dict[str, Any]] = None,
    compression: Any = None,
    legacy_opts: bool = False,
) -> keras.Model:
    """Load a saved Keras model whose optimizer comes back wrapped in a ``DistributedOptimizer`` (with its
    saved state), ready to continue training on every rank.

    ``custom_optimizers`` lists optimizer classes of your own that the model may use; ``custom_objects`` is
    passed on to ``keras.models.load_model``. ``legacy_opts`` is accepted for compatibility (Keras 3 has no
    legacy optimizers).
    """
    settings = _optimizer.Settings(compression=compression)
    classes = _optimizer.subclasses(keras.optimizers.Optimizer, _optimizer.is_distributed)
    objects = _optimizer.load_model_objects(
        lambda cls: _optimizer.distributed_class(cls, settings, _framework),
        classes,
        custom_optimizers,
        custom_objects,
    )
    return keras.models.load_model(filepath, custom_objects=objects)


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
