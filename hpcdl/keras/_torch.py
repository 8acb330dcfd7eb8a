"""Gradient reduction and local aggregation for Keras on the PyTorch backend, through ``hpcdl.torch``.

Keras' torch train step is eager: it hands the optimizer the parameters' ``.grad`` tensors, which go to the
engine as they are (zero-copy on the CPU, through ``hpcdl.torch``'s GPU path on CUDA), all submitted before
the first is waited for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import numpy as np

import hpcdl.torch as hvd
from hpcdl.common import basics, elastic
from hpcdl.common.elastic_state import run_fn
from hpcdl.common.reduce_ops import Average, group_order
from hpcdl.torch.process_sets import id_of

Groups = Union[int, Sequence[Sequence[Any]], None]


def _key(variable: Any) -> int:
    return id(variable)


@dataclass
class TorchGradientReducer:
    """Reduces a list of gradients (some None) of a list of Keras variables over ``process_set``. Sparse
    gradients are reduced as dense tensors (Keras' torch layers make none)."""

    name: str
    compression: Any = hvd.Compression.none
    sparse_as_dense: bool = False
    op: int = Average
    gradient_predivide_factor: float = 1.0
    groups: Groups = None
    process_set: hvd.ProcessSet = hvd.global_process_set
    scale_local_gradients: bool = True
    local_sources: set = field(default_factory=set)

    def register_local_source(self, source: Any) -> None:
        self.local_sources.add(_key(source))

    def __call__(self, grads: Sequence[Any], sources: Sequence[Any]) -> list[Any]:
        grads = [g.to_dense() if g is not None and g.is_sparse else g for g in grads]
        shared = [
            i
            for i, (g, s) in enumerate(zip(grads, sources))
            if g is not None and _key(s) not in self.local_sources
        ]
        ps = id_of(self.process_set)  # a clear error before init() or for an unregistered set
        size = basics.process_set_size(ps)
        if shared and (elastic.enabled() or (basics.process_set_rank(ps) >= 0 and size > 1)):
            self._reduce(grads, sources, shared)
        if self.scale_local_gradients and self.local_sources:
            grads = [
                g / size if g is not None and _key(s) in self.local_sources else g
                for g, s in zip(grads, sources)
            ]
        return grads

    def _reduce(self, grads: list[Any], sources: Sequence[Any], shared: list[int]) -> None:
        """Reduce ``grads[i]`` for every i in ``shared``, in place in the list."""
        order, sizes = group_order(self.groups, shared, [_key(sources[i]) for i in shared], _key)
        factor = self.gradient_predivide_factor if self.op == Average else 1.0
        options = {
            "op": self.op,
            "prescale_factor": 1.0 / factor,
            "postscale_factor": factor,
            "process_set": self.process_set,
        }
        pending, start = [], 0
        for count in sizes:
            members = order[start : start + count]
            start += count
            compressed = [self.compression.compress(grads[i]) for i in members]
            tensors = [t for t, _ in compressed]
            if count == 1:
                handle = hvd.allreduce_async(tensors[0], name=f"{self.name}.grad_{members[0]}", **options)
            else:
                handle = hvd.grouped_allreduce_async(
                    tensors, name=f"{self.name}.grad_{members[0]}", **options
                )
            pending.append((members, [ctx for _, ctx in compressed], handle))
        for members, contexts, handle in pending:
            results = hvd.synchronize(handle)
            for i, result, ctx in zip(members, results if len(members) > 1 else [results], contexts):
                grads[i] = self.compression.decompress(result, ctx)


class EagerGradientAggregation:
    """Sum gradients over ``passes`` backward passes; every ``passes``-th call reduces the sums (divided by
    ``passes`` when ``average``) and reports the step complete."""

    def __init__(self, passes: int, average: bool) -> None:
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.passes = passes
        self.average = average
        self.count = 0
        self._sums: Optional[list[Any]] = None

    def complete(self) -> bool:
        return self.count == 0

    def __call__(self, grads: Sequence[Any], sources: Sequence[Any], reduce: Any) -> list[Any]:
        if self._sums is None:
            self._sums = [None if g is None else g.detach().clone() for g in grads]
        else:
            for total, g in zip(self._sums, grads):
                if total is not None and g is not None:
                    total.add_(g)
        self.count += 1
        if self.count < self.passes:
            return list(self._sums)
        reduced = reduce(self._sums, sources)
        if self.average:
            reduced = [None if r is None else r / self.passes for r in reduced]
        self._sums, self.count = None, 0
        return reduced


class TorchFramework:
    """``hpcdl.torch`` as the Keras machinery (``hpcdl._keras``) uses it, for Keras 3 on PyTorch."""

    name = "torch"
    hvd = hvd

    def reducer(self, name: str, options: dict[str, Any]) -> TorchGradientReducer:
        return TorchGradientReducer(name, **options)

    def aggregation(self, passes: int, average: bool, sparse_as_dense: bool) -> EagerGradientAggregation:
        return EagerGradientAggregation(passes, average)

    def broadcast_variables(self, variables: Sequence[Any], root_rank: int) -> None:
        # A Keras variable holds a torch Parameter; the engine writes the root's values into its memory.
        tensors = [(f"broadcast_variables.{i}", v.value.detach()) for i, v in enumerate(variables)]
        hvd.broadcast_parameters(tensors, root_rank)

    def tensor(self, value: Any) -> Any:
        import torch

        return torch.as_tensor(np.asarray(value))

    def average(self, values: np.ndarray, name: str) -> np.ndarray:
        return hvd.allreduce(self.tensor(values), op=Average, name=name).numpy()

    def run(self, func: Callable[..., Any]) -> Callable[..., Any]:
        def reset() -> None:
            hvd.shutdown()
            hvd.init()

        return run_fn(func, reset)


FRAMEWORK = TorchFramework()
