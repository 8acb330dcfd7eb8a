"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()`` averages gradients over ranks.

As in Horovod, the wrapped tape's recording is reused and the result is an instance of a subclass of the
wrapped tape's class, so ``isinstance(tape, tf.GradientTape)`` holds. With ``backward_passes_per_step=N``
the gradients are summed locally over N passes and reduced on the N-th; the passes may use N different
tapes (one per micro-batch), because the sums belong to the sources, not to a tape::

    for micro_batch in micro_batches:            # N of them
        with tf.GradientTape() as tape:
            loss = loss_fn(model(micro_batch))
        tape = hvd.DistributedGradientTape(tape, backward_passes_per_step=N)
        grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # the reduced sums

Between reductions ``gradient()`` returns the local sums so far, which must not be applied.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, Optional

import tensorflow as tf

from hpcdl.common.process_sets import ProcessSet, global_process_set
from hpcdl.common.reduce_ops import Average
from hpcdl.tensorflow.compression import Compression, Compressor
from hpcdl.tensorflow.gradients import (
    GradientReducer,
    Groups,
    LocalGradientAggregation,
    check_reduction_options,
    source_key,
)

# Sums of backward_passes_per_step > 1, per list of sources (a training loop makes a new tape per step).
_AGGREGATIONS: dict[tuple, LocalGradientAggregation] = {}


def _aggregation(
    sources: list[Any], passes: int, average: bool, sparse_as_dense: bool
) -> LocalGradientAggregation:
    key = (tuple(source_key(s) for s in sources), passes, average, sparse_as_dense)
    if key not in _AGGREGATIONS:
        _AGGREGATIONS[key] = LocalGradientAggregation(passes, average, sparse_as_dense)
    return _AGGREGATIONS[key]


class _DistributedGradientTape:
    """Placed before the wrapped tape's class; see ``DistributedGradientTape``."""

    _hpcdl_reducer: GradientReducer
    _hpcdl_passes: int
    _hpcdl_average_aggregated: bool

    def register_local_source(self, source: Any) -> None:
        """Keep ``source``'s gradient local: it is not reduced (but divided by the set size unless
        ``scale_local_gradients=False``)."""
        self._hpcdl_reducer.register_local_source(source)

    def gradient(
        self,
        target: Any,
        sources: Any,
        output_gradients: Any = None,
        use_generic_names: bool = False,
        unconnected_gradients: Any = tf.UnconnectedGradients.NONE,
    ) -> Any:
        """The wrapped tape's gradients, averaged over the ranks of the process set.

        ``use_generic_names`` is accepted for compatibility: hpcdl always names gradient reductions by
        their position (``DistributedGradientTape.grad_<i>``), the same on every rank and every step."""
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)  # type: ignore[misc]
        flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads)
        reducer = self._hpcdl_reducer
        if self._hpcdl_passes > 1:
            aggregation = _aggregation(
                flat_sources, self._hpcdl_passes, self._hpcdl_average_aggregated, reducer.sparse_as_dense
            )
            reduced = aggregation(flat_grads, flat_sources, reducer)
        else:
            reduced = reducer(flat_grads, flat_sources)
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(
        self, target: Any, sources: Any, output_gradients: Any = None, use_generic_names: bool = False
    ) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        """``([(local source, gradient)], [(reduced source, gradient)])`` of one ``gradient()`` call."""
        gradients = self.gradient(target, sources, output_gradients, use_generic_names)
        local, shared = [], []
        for s, g in zip(sources, gradients):
            (local if source_key(s) in self._hpcdl_reducer.local_sources else shared).append((s, g))
        return local, shared


def DistributedGradientTape(
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Groups = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
) -> tf.GradientTape:
    """Wrap ``gradtape`` so that ``gradient()`` averages the gradients over the ranks of ``process_set``.

    Args:
        compression: ``hvd.Compression.fp16`` sends floating-point gradients as float16.
        sparse_as_dense: reduce ``tf.IndexedSlices`` gradients as dense tensors (else they are allgathered).
        op: ``hvd.Average`` (default) or ``hvd.Sum`` (also Min, Max, Product).
        gradient_predivide_factor: with Average, divide by this before the sum and by size/this after.
        groups: an int (that many atomic groups) or lists of variables to reduce together.
        backward_passes_per_step: sum this many passes locally before reducing (see the module's doc).
        average_aggregated_gradients: divide the sum of the passes by their number.
        device_dense, device_sparse: accepted for compatibility; hpcdl reduces in host memory.
    """
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
            DeprecationWarning,
            stacklevel=2,
        )
        if groups is None:
            groups = num_groups
    check_reduction_options(op, gradient_predivide_factor, groups)
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    tape = cls(gradtape._persistent, gradtape._watch_accessed_variables)
    tape._tape = gradtape._tape
    tape._hpcdl_reducer = GradientReducer(
        "DistributedGradientTape",
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        groups,
        process_set,
        scale_local_gradients,
    )
    tape._hpcdl_passes = backward_passes_per_step
    tape._hpcdl_average_aggregated = average_aggregated_gradients
    return tape


def PartialDistributedGradientTape(
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Groups = None,
    process_set: ProcessSet = global_process_set,
    local_layers: Optional[Any] = None,
    scale_local_gradients: bool = True,
) -> tf.GradientTape:
    """``DistributedGradientTape`` that keeps the gradients of ``local_layers`` (Keras layers) local."""
    keras = tf.keras
    if local_layers is None:
        layers: Iterable[Any] = []
    elif isinstance(local_layers, keras.layers.Layer):
        layers = [local_layers]
    else:
        layers = list(local_layers)
        if not all(isinstance(layer, keras.layers.Layer) for layer in layers):
            raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    tape = DistributedGradientTape(
        gradtape,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
        process_set,
        scale_local_gradients,
    )
    for layer in layers:
        for variable in layer.trainable_weights:
            tape.register_local_source(variable)
    return tape
