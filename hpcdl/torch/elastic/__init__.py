"""Elastic training basics (Horovod's ``hvd.elastic``): state objects that commit, restore and
synchronize, an elastic sampler, and the ``run`` decorator that retries after a failed collective.

``run`` catches ``HorovodInternalError`` (a collective failed or timed out), restores the last committed
state, re-initializes hpcdl (``shutdown(); init()``) and synchronizes the state from rank 0 before calling
the training function again. Under ``hpcdl run --min-np A --max-np B [--host-discovery-script S]`` the
re-initialization joins the launcher's next round of workers (``hpcdl.common.elastic``): a failed worker is
dropped, new workers join, and ``State.commit`` raises ``HostsUpdatedInterrupt`` on every rank when a newer
round has formed. The protocol is :mod:`hpcdl.common.elastic_state`'s, shared with ``hpcdl.tensorflow``.
"""

from __future__ import annotations

from typing import Any, Callable

from hpcdl.common.elastic_state import run_fn
from hpcdl.common.exceptions import HostsUpdatedInterrupt
from hpcdl.torch.basics import init, shutdown
from hpcdl.torch.elastic.sampler import ElasticSampler
from hpcdl.torch.elastic.state import ObjectState, State, TorchState


def _reset() -> None:
    shutdown()
    init()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``train(state, ...)``: sync ``state`` from rank 0, call ``train``; on a failed collective
    restore the committed state, re-initialize and try again. No collective may run before the decorated
    function is called (new ranks would deadlock)."""
    return run_fn(func, _reset)


__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run"]
