"""Exceptions a user of hpcdl can cause; each message says what to do next."""

from __future__ import annotations


class HpcdlError(Exception):
    """Base class of every error hpcdl raises on purpose."""


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
    """A setting or argument is invalid (bad value, unknown transport, no way to find the peers)."""


class HpcdlAuthError(HpcdlError):
    """Rendezvous authentication failed: the ranks and the launcher do not share the job's secret."""


class HpcdlUnsupportedError(HpcdlError):
    """The build lacks what was asked for (e.g. transport='mpi' without MPI compiled in)."""


# Status codes of c_api.h.
OK = 0
ERR_INVALID = 1
ERR_NOT_INITIALIZED = 2
ERR_TIMEOUT = 3
ERR_PEER_LOST = 4
ERR_MISMATCH = 5
ERR_AUTH = 6
ERR_UNSUPPORTED = 7
ERR_SHUTDOWN = 8
ERR_INTERNAL = 9

_BY_CODE: dict[int, type[HpcdlError]] = {
    ERR_INVALID: HpcdlConfigError,
    ERR_NOT_INITIALIZED: HpcdlNotInitializedError,
    ERR_TIMEOUT: HpcdlTimeoutError,
    ERR_PEER_LOST: HpcdlInternalError,
    ERR_MISMATCH: HpcdlMismatchError,
    ERR_AUTH: HpcdlAuthError,
    ERR_UNSUPPORTED: HpcdlUnsupportedError,
    ERR_SHUTDOWN: HpcdlInternalError,
    ERR_INTERNAL: HpcdlInternalError,
}


def error_for(code: int, message: str) -> HpcdlError:
    """The exception for a C status code, carrying the runtime's message."""
    return _BY_CODE.get(code, HpcdlInternalError)(message or f"hpcdl runtime error (status {code})")
