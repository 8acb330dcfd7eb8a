"""``DistributedOptimizer`` for tf-keras (Keras 2, what ``tf.keras`` is under ``TF_USE_LEGACY_KERAS=1``):
its optimizers (``tf.keras.optimizers.*``) and its legacy ones (``tf.keras.optimizers.legacy.*``).

As Horovod's, the result is an instance of a subclass of the wrapped optimizer's class, made from its config
(same name, so a saved model loads without hpcdl too). The gradients are reduced where tf-keras computes
them (``minimize``, hence ``model.fit``; ``compute_gradients``; ``_compute_gradients``, which Horovod's
tests call), or, for gradients computed elsewhere, in ``apply_gradients``: each gradient is reduced once.
With ``backward_passes_per_step=N`` they are summed locally (``_agg_helper``, as Horovod names it) and
reduced on every N-th pass; ``apply_gradients`` applies only then, and ``iterations`` counts every call,
as in Horovod's Keras 2 optimizer.
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from hpcdl._keras.framework import build_optimizer
from hpcdl._keras.optimizer import Settings
from hpcdl.tensorflow.gradients import GradientReducer, LocalGradientAggregation
from hpcdl.tensorflow.keras._framework import FRAMEWORK

Pairs = list[tuple[Any, Any]]


class _DistributedOptimizer:
    """Placed before the wrapped optimizer's class; see the module's doc."""

    _hpcdl_settings: Settings

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        settings = self._hpcdl_settings
        name = settings.name or f"Distributed{type(self).__name__}"
        self._hpcdl_reducer = GradientReducer(name, **settings.reducer_options())
        passes = settings.backward_passes_per_step
        self._agg_helper: Optional[LocalGradientAggregation] = (
            LocalGradientAggregation(passes, settings.average_aggregated_gradients, settings.sparse_as_dense)
            if passes > 1
            else None
        )
        self._hpcdl_reduced = False

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient local: it is not reduced (but divided by the set size unless
        ``scale_local_gradients=False``)."""
        self._hpcdl_reducer.register_local_source(var)

    def _hpcdl_reduce(self, pairs: Any) -> Pairs:
        pairs = list(pairs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if self._agg_helper is None:
            reduced = self._hpcdl_reducer(grads, variables)
        else:
            reduced = self._agg_helper(grads, variables, self._hpcdl_reducer)
        self._hpcdl_reduced = True
        return list(zip(reduced, variables))

    def compute_gradients(self, loss: Any, var_list: Any, tape: Any = None) -> Pairs:
        return self._hpcdl_reduce(super().compute_gradients(loss, var_list, tape))  # type: ignore[misc]

    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None, tape: Any = None) -> Pairs:
        base = super()
        if hasattr(base, "_compute_gradients"):  # a legacy optimizer
            pairs = base._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)
        else:
            pairs = base.compute_gradients(loss, var_list, tape)  # type: ignore[attr-defined]
        return self._hpcdl_reduce(pairs)

    def get_gradients(self, loss: Any, params: Any) -> list[Any]:
        grads = super().get_gradients(loss, params)  # type: ignore[misc]
        return [g for g, _ in self._hpcdl_reduce(zip(grads, params))]

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        if not self._hpcdl_reduced:
            pairs = self._hpcdl_reduce(pairs)
        self._hpcdl_reduced = False
        base_apply = super().apply_gradients  # type: ignore[misc]
        if self._agg_helper is None:
            return base_apply(pairs, *args, **kwargs)
        with tf.init_scope():  # the slots, before the conditional that applies
            build_optimizer(self, [v for _, v in pairs])

        def apply() -> tf.Tensor:
            base_apply(pairs, *args, **kwargs)
            return tf.constant(True)

        def skip() -> tf.Tensor:
            self.iterations.assign_add(1)
            return tf.constant(False)

        tf.cond(self._agg_helper.complete(), apply, skip)
        return self.iterations


def is_distributed(cls: type) -> bool:
    return issubclass(cls, _DistributedOptimizer)


def distributed_class(base: type, settings: Settings) -> type:
    """The distributed subclass of tf-keras optimizer class ``base``."""
    namespace = {
        "_hpcdl_settings": settings.resolved(FRAMEWORK),
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
    }
    return type(base.__name__, (_DistributedOptimizer, base), namespace)


def optimizer_roots(keras: Any) -> tuple[type, ...]:
    """tf-keras' optimizer base classes: the current one and the legacy one."""
    return (keras.optimizers.Optimizer, keras.optimizers.legacy.Optimizer)
