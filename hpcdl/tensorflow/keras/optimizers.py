"""``DistributedOptimizer``, ``PartialDistributedOptimizer`` and ``load_model`` of
``hpcdl.tensorflow.keras``, for a Keras 3 optimizer or a tf-keras one (current or legacy), whichever
the optimizer is."""

from __future__ import annotations

import importlib
from typing import Any, Optional

from hpcdl._keras import optimizer as keras3
from hpcdl._keras.optimizer import Settings, load_model_objects, register_local_layers, subclasses
from hpcdl.common.reduce_ops import Average
from hpcdl.tensorflow.keras import _tf_keras
from hpcdl.tensorflow.keras._flavour import is_tf_keras_optimizer, keras
from hpcdl.tensorflow.keras._framework import FRAMEWORK


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
    """Wrap a Keras optimizer (Keras 3's, or tf-keras' current or legacy one) so that gradients are
    averaged over the ranks of ``process_set`` before they are applied. The arguments are Horovod's (see
    ``hpcdl._keras.optimizer.DistributedOptimizer``); ``device_dense``/``device_sparse`` are accepted for
    compatibility (hpcdl reduces in host memory)."""
    if not is_tf_keras_optimizer(optimizer):
        return keras3.DistributedOptimizer(
            FRAMEWORK,
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
    if _tf_keras.is_distributed(type(optimizer)):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap the plain optimizer once")
    settings = Settings(
        name=name,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups if groups is not None or num_groups == 0 else num_groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )
    cls = _tf_keras.distributed_class(type(optimizer), settings)
    return cls.from_config(optimizer.get_config())


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
    layer_module = importlib.import_module(type(optimizer).__module__.split(".")[0])
    return register_local_layers(distributed, local_layers, layer_module.layers.Layer)


def load_model(
    filepath: Any,
    custom_optimizers: Optional[list[type]] = None,
    custom_objects: Optional[dict[str, Any]] = None,
    compression: Any = None,
    legacy_opts: bool = False,
) -> Any:
    """Load a saved model (with ``tf.keras``'s Keras) whose optimizer comes back wrapped in a
    ``DistributedOptimizer`` with its saved state. ``custom_optimizers``: your own optimizer classes the
    model may use; ``custom_objects`` goes on to ``load_model``; ``legacy_opts``: with tf-keras, the saved
    optimizer is one of ``tf.keras.optimizers.legacy.*`` (both kinds have the same class names)."""
    settings = Settings(compression=compression)
    if keras.__name__ == "tf_keras":
        current, legacy = _tf_keras.optimizer_roots(keras)
        classes = subclasses(legacy if legacy_opts else current, _tf_keras.is_distributed)

        def wrap(cls: type) -> type:
            return _tf_keras.distributed_class(cls, settings)

    else:
        classes = subclasses(keras.optimizers.Optimizer, keras3.is_distributed)

        def wrap(cls: type) -> type:
            return keras3.distributed_class(cls, settings, FRAMEWORK)

    objects = load_model_objects(wrap, classes, custom_optimizers, custom_objects)
    return keras.models.load_model(filepath, custom_objects=objects)
