"""Elastic training state (Horovod's ``State``/``ObjectState``/``TorchState``): what is committed in
memory, restored after a failed collective, and synchronized from rank 0 after a reset."""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch

from hpcdl.common import elastic as driver
from hpcdl.common.exceptions import HostsUpdatedInterrupt
from hpcdl.torch.basics import rank
from hpcdl.torch.elastic.sampler import ElasticSampler
from hpcdl.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)


class State:
    """Base class: ``commit()`` saves and checks for host changes; ``restore()``, ``sync()`` and
    ``reset()`` are provided by subclasses; ``register_reset_callbacks`` adds hooks run after a reset."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: list[Callable[[], None]] = []
        self._hosts_updated = False

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def notify_hosts_updated(self) -> None:
        """Record that the launcher reported a change of hosts; the next ``commit`` raises for all ranks."""
        self._hosts_updated = True

    def commit(self) -> None:
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank if any rank has been told the hosts changed:
        by ``notify_hosts_updated`` or, under ``hpcdl run --min-np/--max-np``, by the driver having formed a
        newer round (workers joined). The ranks agree, so all of them reset at the same commit."""
        mine = self._hosts_updated or driver.round_changed()
        updated = any(allgather_object(mine, name="elastic.hosts_updated"))
        self._hosts_updated = False
        if updated:
            raise HostsUpdatedInterrupt(False)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Called after a reset, before ``sync``."""


class ObjectState(State):
    """State made of plain Python attributes, given as keyword arguments."""

    def __init__(
        self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int], **kwargs: Any
    ) -> None:
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


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

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


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
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
