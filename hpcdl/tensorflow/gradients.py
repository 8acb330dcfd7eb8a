"""Averaging gradients over ranks: what ``DistributedGradientTape`` and Keras' ``DistributedOptimizer``
share.

``GradientReducer`` reduces one step's gradients: dense ones in one batch of named engine operations (the
engine negotiates them together and fuses them; names are stable from step to step, so the response cache
answers the negotiation), ``tf.IndexedSlices`` by allgathering values and indices unless
``sparse_as_dense``. ``LocalGradientAggregation`` sums gradients over ``backward_passes_per_step`` passes
locally and reduces only every last one, as Horovod's aggregation helper does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import tensorflow as tf

from hpcdl.common import basics, elastic
from hpcdl.common.process_sets import ProcessSet, global_process_set, id_of
from hpcdl.common.reduce_ops import Adasum, Average, group_order
from hpcdl.tensorflow.collectives import _allgather_slices, set_size
from hpcdl.tensorflow.compression import Compression, Compressor
from hpcdl.tensorflow.mpi_ops import reduce_tensors

Groups = Union[int, Sequence[Sequence[Any]], None]


def source_key(source: Any) -> Any:
    """A hashable key for a gradient's source: a ``tf.Variable`` or tensor (its ``ref()``), or a Keras 3
    variable (the ``ref()`` of the ``tf.Variable`` it holds; Keras variables are not hashable)."""
    if hasattr(source, "ref"):
        return source.ref()
    inner = getattr(source, "value", None)
    if isinstance(inner, tf.Variable):
        return inner.ref()
    raise ValueError(f"gradient sources must be variables or tensors, got {type(source).__name__}")


def check_reduction_options(op: int, gradient_predivide_factor: float, groups: Groups) -> None:
    """Horovod's checks of the options of DistributedGradientTape and DistributedOptimizer."""
    if op == Adasum:
        raise NotImplementedError(
            "hpcdl.tensorflow does not implement the Adasum reduction; use op=hvd.Average (or hpcdl.torch)"
        )
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if groups is not None and not (
        isinstance(groups, (list, tuple)) or (isinstance(groups, int) and groups > 0)
    ):
        raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable.")


@dataclass
class GradientReducer:
    """Reduces a list of gradients (some None, some ``tf.IndexedSlices``) of a list of sources."""

    name: str
    compression: type[Compressor] = Compression.none
    sparse_as_dense: bool = False
    op: int = Average
    gradient_predivide_factor: float = 1.0
    groups: Groups = None
    process_set: ProcessSet = global_process_set
    scale_local_gradients: bool = True
    local_sources: set = field(default_factory=set)

    def register_local_source(self, source: Any) -> None:
        """Keep ``source``'s gradient local: not reduced (divided by the set size unless
        ``scale_local_gradients`` is False)."""
        self.local_sources.add(source_key(source))

    def __call__(self, grads: Sequence[Any], sources: Sequence[Any]) -> list[Any]:
        grads = list(grads)
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        shared = [
            i
            for i, (g, s) in enumerate(zip(grads, sources))
            if g is not None and source_key(s) not in self.local_sources
        ]
        if self._communicates():
            for i, reduced in zip(
                shared, self._reduce([grads[i] for i in shared], [sources[i] for i in shared], shared)
            ):
                grads[i] = reduced
        if self.scale_local_gradients and self.local_sources:
            grads = [self._scaled_local(g, s) for g, s in zip(grads, sources)]
        return grads

    def _communicates(self) -> bool:
        """False where reducing would change nothing: this rank is outside the set, or the set is this rank
        alone (decided when the gradients are built; under an elastic launch, always reduce)."""
        ps = id_of(self.process_set)
        if elastic.enabled():
            return True
        return basics.process_set_rank(ps) >= 0 and basics.process_set_size(ps) > 1

    def _scaled_local(self, grad: Any, source: Any) -> Any:
        if grad is None or source_key(source) not in self.local_sources:
            return grad
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(
                grad.values / set_size(self.process_set, grad.values.dtype), grad.indices, grad.dense_shape
            )
        return grad / set_size(self.process_set, grad.dtype)

    def _reduce(self, grads: list[Any], sources: list[Any], indices: list[int]) -> list[Any]:
        names = [f"{self.name}.grad_{i}" for i in indices]
        results: list[Any] = [None] * len(grads)
        sparse = [k for k, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
        if sparse:
            gathered = _allgather_slices(
                [grads[k] for k in sparse], self.op, 1.0, 1.0, self.process_set, f"{self.name}.sparse"
            )
            for k, value in zip(sparse, gathered):
                results[k] = value
        dense = [k for k, g in enumerate(grads) if not isinstance(g, tf.IndexedSlices)]
        if not dense:
            return results
        order, sizes = group_order(self.groups, dense, [source_key(sources[k]) for k in dense], source_key)
        compressed, contexts = zip(*[self.compression.compress(grads[k]) for k in order])
        prescale, postscale = (
            (1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor)
            if self.op == Average
            else (1.0, 1.0)
        )
        reduced = reduce_tensors(
            list(compressed), [names[k] for k in order], self.op, prescale, postscale, self.process_set, sizes
        )
        for k, value, ctx in zip(order, reduced, contexts):
            results[k] = self.compression.decompress(value, ctx)
        return results


class LocalGradientAggregation:
    """Sum gradients locally over ``passes`` backward passes; on every ``passes``-th call reduce the sums
    (divided by ``passes`` when ``average``) and start over. Between those calls the local
    sums are returned, and :meth:`complete` is False: an optimizer must not apply them.

    The sums live in variables created (outside any ``tf.function``) on the first call, so the same
    aggregation serves eager code and compiled training steps.
    """

    def __init__(self, passes: int, average: bool = False, sparse_as_dense: bool = False) -> None:
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.passes = passes
        self.average = average
        self.sparse_as_dense = sparse_as_dense
        self._sums: Optional[list[Optional[tf.Variable]]] = None
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="backward_passes")

    def complete(self) -> tf.Tensor:
        """True right after the gradients of a whole step were reduced (or before the first pass)."""
        return tf.equal(self.counter, 0)

    def __call__(
        self,
        grads: Sequence[Any],
        sources: Sequence[Any],
        reduce: Callable[[Sequence[Any], Sequence[Any]], list[Any]],
    ) -> list[Any]:
        """Add this pass's gradients; ``reduce(sums, sources)`` on the last pass of a step."""
        grads = [self._dense(g) for g in grads]
        sums = self._variables(grads, sources)
        totals = [None if s is None else tf.convert_to_tensor(s.assign_add(g)) for s, g in zip(sums, grads)]
        count = self.counter.assign_add(1)
        present = [i for i, t in enumerate(totals) if t is not None]

        def reduce_and_restart() -> list[tf.Tensor]:
            reduced = reduce([totals[i] for i in present], [sources[i] for i in present])
            if self.average:
                reduced = [r / self.passes for r in reduced]
            with tf.control_dependencies(reduced):
                restart = [sums[i].assign(tf.zeros_like(sums[i])) for i in present]
                restart.append(self.counter.assign(0))
                with tf.control_dependencies(restart):
                    return [tf.identity(r) for r in reduced]

        results = tf.cond(
            tf.equal(count, self.passes),
            reduce_and_restart,
            lambda: [tf.identity(totals[i]) for i in present],
        )
        out: list[Any] = [None] * len(grads)
        for i, value in zip(present, results):
            out[i] = value
        return out

    def _dense(self, grad: Any) -> Any:
        if isinstance(grad, tf.IndexedSlices):
            if not self.sparse_as_dense:
                raise ValueError(
                    "IndexedSlices are not supported when `backward_passes_per_step` > 1 and "
                    "`sparse_as_dense` is False."
                )
            return tf.convert_to_tensor(grad)
        return grad

    def _variables(self, grads: list[Any], sources: Sequence[Any]) -> list[Optional[tf.Variable]]:
        if self._sums is None:
            with tf.init_scope():
                self._sums = [
                    None
                    if g is None
                    else tf.Variable(tf.zeros(s.shape, dtype=g.dtype), trainable=False, name="gradient_sum")
                    for g, s in zip(grads, sources)
                ]
        if len(self._sums) != len(grads) or any(
            (s is None) != (g is None) for s, g in zip(self._sums, grads)
        ):
            raise ValueError(
                "backward_passes_per_step > 1 aggregates the gradients of the same sources on every pass; "
                "this pass has other sources (or other missing gradients) than the first one"
            )
        return self._sums
