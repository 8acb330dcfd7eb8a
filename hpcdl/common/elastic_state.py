"""Elastic training state for every framework API (Horovod's ``horovod.common.elastic``): state objects
that commit, restore and synchronize, and the retry loop behind each framework's ``hvd.elastic.run``.

A framework supplies how its variables travel and how hpcdl restarts (``reset``); nothing here knows a
framework. ``run_fn`` catches ``HorovodInternalError`` (a collective
failed or timed out), restores the last committed state, re-initializes and synchronizes the state from
rank 0 before calling the training function again. Under ``hpcdl run --min-np A --max-np B`` the
re-initialization joins the launcher's next round of workers (:mod:`hpcdl.common.elastic`), and
``State.commit`` raises ``HostsUpdatedInterrupt`` on every rank when a newer round has formed.

A commit is also where the ranks agree to stop or to save (:mod:`hpcdl.checkpoint`): one allreduce per
commit carries every rank's votes (hosts changed, asked to stop, a checkpoint due), so all ranks act at
the same commit whichever rank was asked. ``request_stop`` (a scheduler's warning signal) makes every
rank's next ``commit`` raise ``PreemptionInterrupt``; a ``Checkpointer`` attached to the state writes the
committed state when it says a checkpoint is due.
"""

from __future__ import annotations

import functools
import signal
from typing import Any, Callable, Optional, Protocol

import numpy as np

from hpcdl.common import basics, engine, objects
from hpcdl.common import elastic as driver
from hpcdl.common.exceptions import HostsUpdatedInterrupt, HpcdlInternalError
from hpcdl.common.types import ReduceOp

# The stop vote of a rank asked to stop by the program rather than by a signal (signal numbers are < 65).
STOP_REQUESTED = 128

_stop_vote = 0  # 0, a signal number, or STOP_REQUESTED; set from signal handlers, so a plain assignment


def request_stop(signum: int = STOP_REQUESTED) -> None:
    """Ask every rank to stop at its next commit (``PreemptionInterrupt``). Safe in a signal handler;
    asking again changes nothing until the request has been acted on (``clear_stop``)."""
    global _stop_vote
    if not _stop_vote:
        _stop_vote = signum


def stop_requested() -> int:
    """This rank's pending stop request: 0 (none), the signal number, or ``STOP_REQUESTED``."""
    return _stop_vote


def clear_stop() -> None:
    global _stop_vote
    _stop_vote = 0


def stop_reason(vote: int) -> str:
    """Words for a stop vote: ``SIGUSR2`` or ``a stop request``."""
    if 0 < vote < STOP_REQUESTED:
        try:
            return signal.Signals(vote).name
        except ValueError:
            return f"signal {vote}"
    return "a stop request"


class PreemptionInterrupt(BaseException):
    """Raised by ``commit`` on every rank, at the same commit, once any rank was asked to stop (by a
    scheduler's warning signal, see :mod:`hpcdl.checkpoint`). The committed state is the one to keep.
    A ``BaseException`` like ``KeyboardInterrupt``: an ``except Exception`` in a training loop does not
    swallow it, and ``hvd.elastic.run`` lets it through."""

    def __init__(self, vote: int, commits: int) -> None:
        super().__init__(f"stopping at commit {commits}: {stop_reason(vote)} reached a rank of the job")
        self.vote = vote
        self.commits = commits


class Checkpointer(Protocol):
    """What :mod:`hpcdl.checkpoint` attaches to a state: whether this rank thinks a checkpoint is due
    (any rank's yes is every rank's), and the collective write of the committed state, called by every
    rank at the same commit (also at the one where they stop, before ``PreemptionInterrupt`` is raised)."""

    def due(self, state: State) -> bool: ...

    def write(self, state: State, reason: str) -> None: ...


class State:
    """Base class: ``commit()`` saves and checks for host changes; ``restore()``, ``sync()`` and
    ``reset()`` are provided by subclasses; ``register_reset_callbacks`` adds hooks run after a reset."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: list[Callable[[], None]] = []
        self._hosts_updated = False
        self._commits = 0
        self._checkpointer: Optional[Checkpointer] = None

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def notify_hosts_updated(self) -> None:
        """Record that the launcher reported a change of hosts; the next ``commit`` raises for all ranks."""
        self._hosts_updated = True

    @property
    def commit_count(self) -> int:
        """Commits since training began (carried by checkpoints): the step a checkpoint is taken at."""
        return self._commits

    def attach_checkpointer(self, checkpointer: Optional[Checkpointer]) -> None:
        self._checkpointer = checkpointer

    def commit(self) -> None:
        self.save()
        self._commits += 1
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Agree with every rank (one allreduce of each rank's votes) on what happens at this commit: a
        stop (``PreemptionInterrupt``) if any rank was asked to stop; a checkpoint of the committed state if
        the attached checkpointer says one is due on any rank; ``HostsUpdatedInterrupt`` if any rank has been
        told the hosts changed, by ``notify_hosts_updated`` or, under ``hpcdl run --min-np/--max-np``, by the
        driver having formed a newer round (workers joined). All ranks act at the same commit."""
        hosts = self._hosts_updated or driver.round_changed()
        self._hosts_updated = False
        due = self._checkpointer is not None and self._checkpointer.due(self)
        mine = np.array([int(hosts), stop_requested(), int(due)], dtype=np.int32)
        votes = engine.synchronize(engine.allreduce_async(mine, name="elastic.commit", op=ReduceOp.MAX))
        if votes[1]:
            if self._checkpointer is not None:  # before unwinding: nothing has run since the commit
                self._checkpointer.write(self, stop_reason(int(votes[1])))
            raise PreemptionInterrupt(int(votes[1]), self._commits)
        if votes[2] and self._checkpointer is not None:
            self._checkpointer.write(self, "periodic")
        if votes[0]:
            raise HostsUpdatedInterrupt(False)

    # ---- what a checkpoint holds (hpcdl.checkpoint) -------------------------------------------------
    def checkpoint_payload(self) -> dict[str, Any]:
        """The committed state as plain picklable values (what rank 0 writes)."""
        return {"commits": self._commits}

    def load_checkpoint_payload(self, payload: dict[str, Any]) -> None:
        """Make ``payload`` (from ``checkpoint_payload``) the committed and the current state."""
        self._commits = int(payload["commits"])

    def checkpoint_layout(self) -> dict[str, Any]:
        """What a checkpoint of this state must look like to be loaded into it (names, shapes, dtypes):
        a checkpoint of another training is refused instead of half loaded."""
        return {}

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

    def checkpoint_payload(self) -> dict[str, Any]:
        return {**super().checkpoint_payload(), "attributes": dict(self._saved_state)}

    def load_checkpoint_payload(self, payload: dict[str, Any]) -> None:
        super().load_checkpoint_payload(payload)
        self._saved_state = dict(payload["attributes"])
        self._set_attrs()

    def checkpoint_layout(self) -> dict[str, Any]:
        return {**super().checkpoint_layout(), "attributes": sorted(self._saved_state)}

    def sync(self) -> None:
        # The commit count travels too: a checkpoint restored on rank 0 (or a rank that joined) counts on.
        self._commits, self._saved_state = self._bcast_object((self._commits, self._saved_state))
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

    def checkpoint_payload(self) -> dict[str, Any]:
        return {**super().checkpoint_payload(), "variables": list(self._saved_values)}

    def load_checkpoint_payload(self, payload: dict[str, Any]) -> None:
        self._saved_values = list(payload["variables"])
        for variable, value in zip(self._variables, self._saved_values):
            variable.assign(value)
        super().load_checkpoint_payload(payload)

    def checkpoint_layout(self) -> dict[str, Any]:
        shapes = [f"{v.dtype}{list(v.shape)}" for v in self._saved_values]
        return {**super().checkpoint_layout(), "variables": shapes}
