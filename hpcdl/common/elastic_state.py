"""Elastic training state for every framework API (Horovod's ``horovod.common.elastic``): state objects
that commit, restore and synchronize, and the retry loop behind each framework's ``hvd.elastic.run``.

A framework supplies how its variables travel and how hpcdl restarts (``reset``); nothing here knows a
framework. ``run_fn`` catches ``HorovodInternalError`` (a collective
failed or timed out), restores the last committed state, re-initializes and synchronizes the state from
rank 0 before calling the training function again. Under ``hpcdl run --min-np A --max-np B`` the
re-initialization joins the launcher's next round of workers (:mod:`hpcdl.common.elastic`), and
``State.commit`` raises ``HostsUpdatedInterrupt`` on every rank when a newer round has formed.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from hpcdl.common import basics, engine, objects
from hpcdl.common import elastic as driver
from hpcdl.common.exceptions import HostsUpdatedInterrupt, HpcdlInternalError
from hpcdl.common.types import ReduceOp


def _any_rank(flag: bool, name: str) -> bool:
    """Whether ``flag`` is True on any rank of the job (one maximum allreduce through the engine)."""
    votes = engine.allreduce_async(np.array([int(flag)], dtype=np.int32), name=name, op=ReduceOp.MAX)
    return bool(engine.synchronize(votes)[0])


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
        self._hosts_updated = False
        if _any_rank(mine, "elastic.hosts_updated"):
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
    """State made of plain Python attributes, given as keyword arguments. They travel as pickled objects,
    which needs no framework: ``bcast_object`` and ``get_rank`` (Horovod's arguments) default to
    :mod:`hpcdl.common`'s own, so ``hvd.elastic.ObjectState(epoch=0)`` works in every API."""

    def __init__(
        self,
        bcast_object: Callable[[Any], Any] = objects.broadcast_object,
        get_rank: Callable[[], int] = basics.rank,
        **kwargs: Any,
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


def run_fn(func: Callable[..., Any], reset: Callable[[], None]) -> Callable[..., Any]:
    """Wrap ``func(state, ...)``: sync ``state`` from rank 0 and call ``func``; on a failed collective
    restore the committed state, ``reset()`` hpcdl and try again; on a change of hosts reset without
    restoring. No collective may run before the wrapped function is called (new ranks would deadlock)."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HpcdlInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
            reset()
            state.on_reset()

    return wrapper


class VariablesState(ObjectState):
    """State made of framework variables (anything with ``numpy()`` and ``assign()``: ``tf.Variable``,
    Keras 3 variables of any backend), kept as NumPy copies, plus plain attributes given as keyword
    arguments. ``broadcast_variables(variables, root_rank)`` is the framework's."""

    def __init__(
        self,
        variables: list[Any],
        broadcast_variables: Callable[[list[Any], int], Any],
        bcast_object: Callable[[Any], Any],
        get_rank: Callable[[], int],
        **kwargs: Any,
    ) -> None:
        self._variables = list(variables)
        self._broadcast_variables = broadcast_variables
        self._saved_values = self._values()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank, **kwargs)

    def _values(self) -> list[Any]:
        return [np.array(v.numpy(), copy=True) for v in self._variables]

    def save(self) -> None:
        self._saved_values = self._values()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self._variables, self._saved_values):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        self._broadcast_variables(self._variables, 0)
        self._saved_values = self._values()
        super().sync()
