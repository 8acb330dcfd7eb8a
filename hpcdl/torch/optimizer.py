"""``DistributedOptimizer``: wraps any ``torch.optim.Optimizer`` so that gradients are averaged over ranks.

A hook on every parameter fires as soon as autograd has accumulated that parameter's gradient and starts
its allreduce in the engine, so communication overlaps the rest of the backward pass; ``step()`` (or
``synchronize()``) waits for all of them and then applies the wrapped optimizer's update. Like Horovod,
the returned object is an instance of a subclass of the wrapped optimizer's class (``isinstance(opt,
torch.optim.SGD)`` still holds), built on the wrapped optimizer's ``param_groups``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from contextlib import contextmanager
from typing import Any, Callable, Optional, Union

import torch

from hpcdl.common.reduce_ops import split_list
from hpcdl.torch import _adasum
from hpcdl.torch.async_ops import (
    allreduce_async_,
    grouped_allreduce_async_,
    sparse_allreduce_async,
    synchronize,
)
from hpcdl.torch.basics import rocm_built, size
from hpcdl.torch.compression import Compression, Compressor
from hpcdl.torch.functions import broadcast_object
from hpcdl.torch.process_sets import ProcessSet, global_process_set
from hpcdl.torch.reduce_ops import Adasum, Average

TOO_MANY_PASSES = (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally."
)
ZERO_GRAD_TOO_EARLY = (
    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
    "optimizer.synchronize(). This is prohibited as it can cause a race condition."
)


def _named(named_parameters: Optional[Iterable], param_groups: list[dict]) -> dict[torch.Tensor, str]:
    """Map every parameter to the name its allreduce will carry, with Horovod's checks."""
    if named_parameters is not None:
        named = list(named_parameters)
    else:
        named = [
            (f"allreduce.noname.{i}.{j}", v)
            for i, group in enumerate(param_groups)
            for j, v in enumerate(group["params"])
        ]
    if any(not isinstance(p, tuple) for p in named):
        raise ValueError(
            "named_parameters should be a sequence of tuples (name, parameter), usually produced by "
            "model.named_parameters()."
        )
    seen: set[str] = set()
    dups = {k for k, _ in named if k in seen or seen.add(k)}
    if dups:
        raise ValueError(
            "Parameter names in named_parameters must be unique. Found duplicates: " + ", ".join(sorted(dups))
        )
    all_ids = {id(v) for group in param_groups for v in group["params"]}
    unnamed = all_ids - {id(v) for _, v in named}
    if unnamed:
        raise ValueError(
            "named_parameters was specified, but one or more model parameters were not named. "
            "Python object ids: " + ", ".join(str(i) for i in unnamed)
        )
    return {v: k for k, v in sorted(named, key=lambda kv: kv[0])}


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed in before the wrapped optimizer's class; see ``DistributedOptimizer``."""

    def __init__(
        self,
        params: Any,
        named_parameters: Optional[Iterable],
        compression: type[Compressor],
        backward_passes_per_step: int = 1,
        op: int = Average,
        gradient_predivide_factor: float = 1.0,
        groups: Optional[Union[int, list]] = None,
        sparse_as_dense: bool = False,
        process_set: ProcessSet = global_process_set,
    ) -> None:
        super().__init__(params)
        self._compression = compression
        self._parameter_names = _named(named_parameters, self.param_groups)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for v in self._parameter_names}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._handles: dict[Any, tuple[Any, Any]] = {}
        self._hook_handles: list[Any] = []
        self._requires_update: set[torch.Tensor] = set()
        self._synchronized = False
        self._should_synchronize = True
        self._groups = _check_groups(groups)
        self._p_to_group: dict[torch.Tensor, tuple] = {}
        self._group_counts: dict[tuple, int] = {}
        if process_set.included() and size() > 1:
            self._register_hooks()

    # -- setup ----------------------------------------------------------------------------------------

    def _trainable(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]

    def _register_hooks(self) -> None:
        if self._groups is not None:
            self._form_groups()
        for p in self._trainable():
            self._requires_update.add(p)
            self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def _form_groups(self) -> None:
        params = self._trainable()
        # Every rank must form the same groups in the same order: take the set's first rank's order.
        root = min(self.process_set.ranks) if self.process_set.ranks else 0
        names = broadcast_object(
            [self._parameter_names.get(p) for p in params], root_rank=root, process_set=self.process_set
        )
        params.sort(key=lambda p: names.index(self._parameter_names.get(p)))
        if isinstance(self._groups, list):
            grouped_ids = {id(p) for group in self._groups for p in group}
            wanted = {id(p) for p in params}
            p_groups = [[p for p in group if id(p) in wanted] for group in self._groups]
            p_groups += [[p] for p in params if id(p) not in grouped_ids]
        else:
            p_groups = split_list(params, self._groups)
        for group in (tuple(g) for g in p_groups if g):
            for p in group:
                self._p_to_group[p] = group
            self._group_counts[group] = 0

    # -- allreduce launching -------------------------------------------------------------------------

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[Any, Any]:
        if p.grad is None:
            # This rank computed no gradient (e.g. an unused branch), another may have: send zeros.
            p.grad = torch.zeros_like(p)
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return sparse_allreduce_async(
                    tensor, name=name, op=self.op, process_set=self.process_set
                ), None
            tensor = tensor.to_dense()
        compressed, ctx = self._compression.compress(tensor)
        if self.op == Average:
            prescale, postscale = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        else:
            prescale, postscale = 1.0, 1.0
        handle = allreduce_async_(
            compressed,
            name=name,
            op=self.op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=self.process_set,
        )
        return handle, ctx

    def _grouped_allreduce_grad_async(self, group: tuple) -> tuple[Any, Any]:
        for p in group:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        compressed, ctxs = zip(*[self._compression.compress(p.grad) for p in group])
        handle = grouped_allreduce_async_(
            list(compressed),
            name=self._parameter_names.get(group[0]),
            op=self.op,
            process_set=self.process_set,
        )
        return handle, ctxs

    def _make_hook(self, p: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(TOO_MANY_PASSES)
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                if self._groups is not None:
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        self._handles[group] = self._grouped_allreduce_grad_async(group)
                        for member in group:
                            self._handles.pop(member, None)
                        self._group_counts[group] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)

        return hook

    # -- public API ------------------------------------------------------------------------------------

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before gradients are reduced."""
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def synchronize(self) -> None:
        """Wait until every gradient has been reduced (starting those whose hook has not fired yet)."""
        if not self.process_set.included():
            self._synchronized = True
            return
        done: set[torch.Tensor] = set()
        for key in self._handles:
            done.update(key if isinstance(key, tuple) else (key,))
        for p in self._requires_update - done:
            self._handles[p] = self._allreduce_grad_async(p)
        for key, (handle, _) in list(self._handles.items()):
            if handle is None:
                self._handles[key] = self._allreduce_grad_async(key)
        for key, (handle, ctx) in self._handles.items():
            if isinstance(key, tuple):
                for p, output, c in zip(key, synchronize(handle), ctx):
                    self._allreduce_delay[p] = self.backward_passes_per_step
                    p.grad.set_(self._compression.decompress(output, c))
                self._group_counts[key] = 0
                continue
            p = key
            output = handle() if callable(handle) else synchronize(handle)
            self._allreduce_delay[p] = self.backward_passes_per_step
            if self._groups is not None:
                self._group_counts[self._p_to_group[p]] = 0
            grad = p.grad
            if grad.is_sparse:
                aggregated = self._compression.decompress(output, ctx)
                if not aggregated.is_sparse:
                    aggregated = aggregated.to_sparse()
                grad.zero_().add_(aggregated)
                continue
            result = self._compression.decompress(output, ctx)
            if result is not grad:  # reduced in place (no compression): already there; set_ costs 0.5 us
                grad.set_(result)
        self._handles.clear()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """Make ``step()`` skip waiting for gradients; use after an explicit ``synchronize()`` (e.g. to
        clip gradients between the two)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                    "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                    "your code.",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def _hpcdl_local_step(self) -> Any:
        """The wrapped optimizer's own step, with no communication."""
        return super().step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles:
            raise AssertionError(ZERO_GRAD_TOO_EARLY)
        return super().zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, state_dict: dict) -> None:
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super().load_state_dict(state_dict)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """``op=hvd.Adasum``: each rank applies its own update, and the parameter deltas are combined with
    Adasum (Horovod's delta optimizer)."""

    def __init__(
        self,
        params: Any,
        named_parameters: Optional[Iterable],
        compression: type[Compressor],
        backward_passes_per_step: int = 1,
    ) -> None:
        super().__init__(params)
        self._compression = compression
        self._parameter_names = _named(named_parameters, self.param_groups)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for v in self._parameter_names}
        self._handles: dict[torch.Tensor, tuple[Any, Any]] = {}
        self._hook_handles: list[Any] = []
        self._requires_update: set[torch.Tensor] = set()
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False) for p in self._parameter_names}
        for p in [p for group in self.param_groups for p in group["params"] if p.requires_grad]:
            p.grad = torch.zeros_like(p)
            self._requires_update.add(p)
            self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[Any, Any]:
        # delta = (start - lr·f(g)) - start: step only p, from its current value, and send the change.
        start = self._starting_models[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is v for v in group["params"]) else []
        try:
            with torch.no_grad():
                start.copy_(p)
                super().step()
                p.sub_(start)
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        compressed, ctx = self._compression.compress(p.data)
        return allreduce_async_(compressed, name=self._parameter_names.get(p), op=Adasum), ctx

    def _make_hook(self, p: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(TOO_MANY_PASSES)
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)

        return hook

    def synchronize(self) -> None:
        """Adasum reduces parameter deltas inside ``step()``; nothing to wait for before it."""

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # pragma: no cover

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = closure() if closure is not None else None
        for p in self._requires_update - set(self._handles):
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                handle, ctx = self._allreduce_grad_async(p)
            delta = self._compression.decompress(synchronize(handle), ctx)
            with torch.no_grad():
                start = self._starting_models[p]
                start.add_(delta)
                p.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def _hpcdl_local_step(self) -> Any:
        return super().step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles:
            raise AssertionError(ZERO_GRAD_TOO_EARLY)
        return super().zero_grad(set_to_none=set_to_none)


def _check_groups(groups: Optional[Union[int, list]]) -> Optional[Union[int, list]]:
    if groups is None:
        return None
    if isinstance(groups, list):
        seen: set[int] = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))
        return groups
    if not isinstance(groups, int) or groups <= 0:
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
    return groups


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Optional[Iterable] = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Optional[Union[int, list]] = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` applies gradients averaged (``op``) over the ranks.

    Args:
        optimizer: the torch optimizer to wrap; its param_groups (and their options) are reused.
        named_parameters: ``model.named_parameters()``: names the allreduces (recommended).
        compression: ``hvd.Compression.none`` or ``hvd.Compression.fp16``.
        backward_passes_per_step: backward passes accumulated locally before one reduction.
        op: ``hvd.Average`` (default), ``hvd.Sum`` or ``hvd.Adasum``.
        gradient_predivide_factor: with Average, scale by 1/f before the sum and f/size after it.
        num_groups: deprecated, use ``groups``.
        groups: an int (split parameters into that many fused groups) or a list of lists of parameters.
        sparse_as_dense: reduce sparse gradients as dense tensors.
        process_set: reduce over this process set only.
    """
    if gradient_predivide_factor != 1.0:
        if rocm_built():
            raise ValueError("gradient_predivide_factor not supported yet with ROCm")
        if op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
            DeprecationWarning,
            stacklevel=2,
        )
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    base = optimizer.__class__
    if op != Adasum or size() == 1:
        cls = type(base.__name__, (_DistributedOptimizer, base), {})
        wrapped = cls(
            optimizer.param_groups,
            named_parameters,
            compression,
            backward_passes_per_step,
            op,
            gradient_predivide_factor,
            groups,
            sparse_as_dense,
            process_set,
        )
        # Unlike Horovod, keep state the wrapped optimizer already has (e.g. loaded from a checkpoint).
        wrapped.state.update(optimizer.state)
        return wrapped
    if process_set is not global_process_set:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    _adasum.check_supported(process_set)
    cls = type(base.__name__, (_DistributedAdasumOptimizer, base), {})
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step)
