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
