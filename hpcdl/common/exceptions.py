"""Exceptions a user of hpcdl can cause; each message says what to do next.

Every one is a ``RuntimeError``, as Horovod's are, so that ``except RuntimeError`` (and Horovod's own
``except HorovodInternalError``, an alias of :class:`HpcdlInternalError`) catches what hpcdl raises. Errors
about an argument are also ``ValueError``s, as Horovod raises those.
"""

from __future__ import annotations

from hpcdl.common.abi import Status
from hpcdl.errors import HpcdlError


class LibraryNotFoundError(HpcdlError):
    """The compiled runtime could not be found or loaded."""


class HpcdlInternalError(HpcdlError):
    """A collective failed (peer lost, timeout, mismatch); Horovod's ``HorovodInternalError``."""


class HpcdlTimeoutError(HpcdlInternalError):
    """A blocking wait passed its deadline; the message names the ranks and the operation."""


class HpcdlMismatchError(HpcdlInternalError):
    """Ranks submitted the same tensor name with different shapes, dtypes, ops or roots."""


class HpcdlNotInitializedError(HpcdlError):
    """A runtime function was called before ``init()``."""


class HpcdlConfigError(HpcdlError, ValueError):
    """A setting or argument is invalid (bad value, unknown transport, no way to find the peers), or an
    operation name is already in use on this rank (Horovod raises ``ValueError`` for that too)."""


class HpcdlShutdownError(HpcdlInternalError):
    """The operation was cancelled by a shutdown: the job's (this rank, or another that called
    ``shutdown()`` or exited, which the message names) or, with ``HPCDL_STALL_SHUTDOWN_TIME_SECONDS``, the
    stall inspector's (the message says which operation stalled, and the job goes on)."""


class HpcdlJoinError(HpcdlInternalError):
    """An operation that cannot take joined ranks (allgather, broadcast, alltoall, reducescatter) ran while
    a member of its process set had called ``join()``; it failed on every member that submitted it."""


class HostsUpdatedInterrupt(HpcdlError):
    """Elastic training: the set of hosts changed. ``hvd.elastic.run`` resets without restoring the committed
    state; ``skip_sync`` is True when only hosts were removed (the survivors' state is already consistent)."""

    def __init__(self, skip_sync: bool) -> None:
        super().__init__("the set of hosts in the job changed")
        self.skip_sync = skip_sync


class HpcdlAuthError(HpcdlError):
    """Rendezvous authentication failed: the ranks and the launcher do not share the job's secret."""


class HpcdlIntegrityError(HpcdlAuthError):
    """A payload that will be unpickled (an object collective's) failed its MAC: altered or replayed on the
    way. It was refused before anything read it."""


class HpcdlUnsupportedError(HpcdlError):
    """The build lacks what was asked for (e.g. transport='mpi' without MPI compiled in)."""


_BY_CODE: dict[int, type[HpcdlError]] = {
    Status.ERR_INVALID: HpcdlConfigError,
    Status.ERR_NOT_INITIALIZED: HpcdlNotInitializedError,
    Status.ERR_TIMEOUT: HpcdlTimeoutError,
    Status.ERR_PEER_LOST: HpcdlInternalError,
    Status.ERR_MISMATCH: HpcdlMismatchError,
    Status.ERR_AUTH: HpcdlAuthError,
    Status.ERR_UNSUPPORTED: HpcdlUnsupportedError,
    Status.ERR_SHUTDOWN: HpcdlShutdownError,
    Status.ERR_INTERNAL: HpcdlInternalError,
    Status.ERR_JOINED: HpcdlJoinError,
}


def error_for(code: int, message: str) -> HpcdlError:
    """The exception for a C status code, carrying the runtime's message."""
    return _BY_CODE.get(code, HpcdlInternalError)(message or f"hpcdl runtime error (status {code})")
