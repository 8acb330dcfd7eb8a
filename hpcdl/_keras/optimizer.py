"""``DistributedOptimizer`` for Keras 3: wraps any Keras optimizer so that ``apply`` (and therefore
``apply_gradients`` and ``model.fit``) first averages the gradients over ranks.

Like Horovod, the result is an instance of a subclass of the wrapped optimizer's class, made from its
config; it keeps the wrapped class's name and module, so a model saved with it loads as the plain
optimizer in plain Keras, and as a distributed one with ``hvd.load_model``. With
``backward_passes_per_step=N`` gradients are summed locally and reduced on every N-th call, and the update
is applied only then: ``iterations`` counts the updates, as with Keras 3's own
``gradient_accumulation_steps`` (Adam's bias correction sees the same step numbers as one process
applying every N batches; a ``LearningRateSchedule`` advances once per update).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import keras

from hpcdl._keras.framework import Framework
from hpcdl.common.reduce_ops import Average, Sum


@dataclass(frozen=True)
class Settings:
    """How a distributed optimizer class reduces gradients (Horovod's DistributedOptimizer arguments,
    checked; None for compression and process_set: the framework's defaults, see :meth:`resolved`)."""

    name: Optional[str] = None
    compression: Any = None
    sparse_as_dense: bool = False
    gradient_predivide_factor: float = 1.0
    op: int = Average
    backward_passes_per_step: int = 1
    average_aggregated_gradients: bool = False
    groups: Any = None
    process_set: Any = None
    scale_local_gradients: bool = True

    def __post_init__(self) -> None:
        if self.op not in (Average, Sum):
            raise ValueError("op currently only supports Average and Sum")
        if self.gradient_predivide_factor != 1.0 and self.op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if self.backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        groups = self.groups
        if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable.")

    def resolved(self, framework: Framework) -> Settings:
        """These settings with the framework's defaults for compression and process set."""
        return dataclasses.replace(
            self,
            compression=self.compression or framework.hvd.Compression.none,
            process_set=self.process_set or framework.hvd.global_process_set,
        )

    def reducer_options(self) -> dict[str, Any]:
        """The arguments of the backend's gradient reducer."""
        fields = ("compression", "sparse_as_dense", "op", "gradient_predivide_factor", "groups")
        return {key: getattr(self, key) for key in (*fields, "process_set", "scale_local_gradients")}


class _DistributedOptimizer:
    """Placed before the wrapped optimizer's class; see ``DistributedOptimizer``."""

    _hpcdl_settings: Settings
    _hpcdl_framework: Framework

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        settings, framework = self._hpcdl_settings, self._hpcdl_framework
        name = settings.name or f"Distributed{type(self).__name__}"
        self._hpcdl_reducer = framework.reducer(name, settings.reducer_options())
        passes = settings.backward_passes_per_step
        self._hpcdl_aggregation = (
            framework.aggregation(passes, settings.average_aggregated_gradients, settings.sparse_as_dense)
            if passes > 1
            else None
        )

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient local: it is not reduced (but divided by the set size unless
        ``scale_local_gradients=False``)."""
        self._hpcdl_reducer.register_local_source(var)

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        base_apply = super().apply  # type: ignore[misc]
        if trainable_variables is None and not self.built:
            return base_apply(grads, trainable_variables)  # Keras says what is missing
        variables = list(
            trainable_variables if trainable_variables is not None else self._trainable_variables
        )
        if self._hpcdl_aggregation is None:
            return base_apply(self._hpcdl_reducer(list(grads), variables), trainable_variables)
        if not self.built:
            self.build(variables)
        summed = self._hpcdl_aggregation(list(grads), variables, self._hpcdl_reducer)

        def apply_step() -> None:
            base_apply(summed, trainable_variables)

        keras.ops.cond(self._hpcdl_aggregation.complete(), apply_step, lambda: None)
        return None


def is_distributed(cls: type) -> bool:
    """Whether an optimizer class is one that ``distributed_class`` made."""
    return issubclass(cls, _DistributedOptimizer)


def distributed_class(base: type, settings: Settings, framework: Framework) -> type:
    """The distributed subclass of Keras 3 optimizer class ``base``; its ``from_config`` makes distributed
    optimizers (what ``load_model`` needs)."""
    namespace = {
        "_hpcdl_settings": settings.resolved(framework),
        "_hpcdl_framework": framework,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
    }
    return type(base.__name__, (_DistributedOptimizer, base), namespace)


def DistributedOptimizer(
    framework: Framework,
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
    """Wrap a Keras 3 optimizer so that gradients are averaged over the ranks of ``process_set`` before
    they are applied.

    Args:
        framework: the framework API that reduces them.
        optimizer: any ``keras.optimizers.Optimizer`` (a fresh one: the wrapper is made from its config).
        name: prefix of the engine's operation names (default ``Distributed<Optimizer>``).
        compression: ``hvd.Compression.fp16`` sends floating-point gradients as float16.
        sparse_as_dense: reduce sparse gradients as dense tensors (else they are allgathered).
        gradient_predivide_factor: divide by this before the sum and by size/this after it.
        op: ``hvd.Average`` (default) or ``hvd.Sum``.
        backward_passes_per_step: sum this many passes locally before reducing and applying.
        average_aggregated_gradients: divide the sum of the passes by their number.
        groups: an int (that many atomic groups) or lists of variables to reduce together.
        process_set: reduce over this process set only.
        scale_local_gradients: divide the gradients of ``register_local_var`` variables by the set size.
        device_dense, device_sparse: accepted for compatibility; hpcdl reduces in host memory.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            "DistributedOptimizer wraps a Keras 3 optimizer (keras.optimizers.*), or a tf-keras one "
            f"(tf.keras.optimizers.* under TF_USE_LEGACY_KERAS=1), got {type(optimizer).__name__}"
        )
    if is_distributed(type(optimizer)):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap the plain optimizer once")
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
            DeprecationWarning,
            stacklevel=2,
        )
        groups = num_groups if groups is None else groups
    chosen = Settings(
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
    return distributed_class(type(optimizer), chosen, framework).from_config(optimizer.get_config())


def register_local_layers(optimizer: Any, local_layers: Any, layer_class: type) -> Any:
    """``PartialDistributedOptimizer``'s part: keep the gradients of ``local_layers`` (a layer or a list)
    local on ``optimizer`` (a distributed one); returns it."""
    if local_layers is None:
        layers: list[Any] = []
    elif isinstance(local_layers, layer_class):
        layers = [local_layers]
    else:
        layers = list(local_layers)
        if not all(isinstance(layer, layer_class) for layer in layers):
            raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    for layer in layers:
        for variable in layer.trainable_weights:
            optimizer.register_local_var(variable)
    return optimizer


def load_model_objects(
    wrap: Any, classes: list[type], custom_optimizers: Optional[list[type]], custom_objects: Optional[dict]
) -> dict[str, Any]:
    """``load_model``'s custom objects: every optimizer class (Keras' and ``custom_optimizers``) replaced by
    ``wrap(cls)``, its distributed subclass, under its name and in lower case (how Keras looks built-in
    optimizers up), then ``custom_objects``."""
    objects: dict[str, Any] = {}
    for cls in [*classes, *(custom_optimizers or [])]:
        wrapped = wrap(cls)
        objects[cls.__name__] = wrapped
        objects[cls.__name__.lower()] = wrapped
    objects.update(custom_objects or {})
    return objects


def subclasses(root: type, skip: Any) -> list[type]:
    """Every subclass of ``root`` (subclasses of subclasses too), but those ``skip(cls)`` is True for."""
    found, todo = [], list(root.__subclasses__())
    while todo:
        cls = todo.pop()
        if not skip(cls):
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return found
