"""Elastic training state of ``hpcdl.torch`` (Horovod's ``ObjectState``/``TorchState``): what is committed
in memory, restored after a failed collective, and synchronized from rank 0 after a reset. ``State`` and
the commit/restore/sync protocol are :mod:`hpcdl.common.elastic_state`'s; what is PyTorch's here is how
models, optimizers and samplers are saved and broadcast."""

from __future__ import annotations

import copy
from typing import Any

import torch

from hpcdl.common.elastic_state import ObjectState, State
from hpcdl.torch.basics import rank
from hpcdl.torch.elastic.sampler import ElasticSampler
from hpcdl.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = ["ObjectState", "State", "TorchState"]


class _Handler:
    """Save/restore/sync of one model, optimizer or sampler kept in a ``TorchState``."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self._saved = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        if isinstance(self.value, torch.nn.Module):
            broadcast_parameters(self.value.state_dict(), root_rank=0)
        elif isinstance(self.value, torch.optim.Optimizer):
            broadcast_optimizer_state(self.value, root_rank=0)
        else:
            self.value.load_state_dict(broadcast_object(self.value.state_dict()))

    @property
    def saved(self) -> Any:
        """The committed ``state_dict``."""
        return self._saved

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()

    def load(self, saved: Any) -> None:
        """Make ``saved`` (a committed ``state_dict``, e.g. from a checkpoint) committed and current."""
        self._saved = saved
        self.restore()

    def layout(self) -> Any:
        """Names, shapes and dtypes of a model's tensors; the kind of anything else."""
        if isinstance(self.value, torch.nn.Module):
            return {k: f"{v.dtype}{list(v.shape)}" for k, v in self._saved.items()}
        return type(self.value).__name__


_HANDLED = (torch.nn.Module, torch.optim.Optimizer, ElasticSampler)


class TorchState(ObjectState):
    """State of a PyTorch training process: models, optimizers and ``ElasticSampler``s given as keyword
    arguments are synchronized with broadcasts; everything else is pickled."""

    def __init__(self, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handled = {k: v for k, v in kwargs.items() if isinstance(v, _HANDLED)}
        self._handlers = {k: _Handler(v) for k, v in handled.items()}
        for name, handler in self._handlers.items():
            object.__setattr__(self, name, handler.value)
        rest = {k: v for k, v in kwargs.items() if k not in handled}
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **rest)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        # Models last: a fresh optimizer's state is made by a zero-gradient step (broadcast_optimizer_state),
        # which changes the parameters where weight decay applies; the model's broadcast then sets them.
        handlers = list(self._handlers.values())
        for handler in sorted(handlers, key=lambda h: isinstance(h.value, torch.nn.Module)):
            handler.sync()
        super().sync()

    def checkpoint_payload(self) -> dict[str, Any]:
        saved = {name: h.saved for name, h in self._handlers.items()}
        return {**super().checkpoint_payload(), "torch": saved}

    def load_checkpoint_payload(self, payload: dict[str, Any]) -> None:
        for name, handler in self._handlers.items():
            handler.load(payload["torch"][name])
        super().load_checkpoint_payload(payload)

    def checkpoint_layout(self) -> dict[str, Any]:
        layout = {name: h.layout() for name, h in self._handlers.items()}
        return {**super().checkpoint_layout(), "torch": layout}

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
