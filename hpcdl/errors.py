"""The base of hpcdl's errors, on the lowest floor so that every room can raise them: ``HpcdlError`` (every
error hpcdl raises on purpose; see :mod:`hpcdl.common.exceptions` for the runtime's) and ``LaunchError``
(``hpcdl run``'s, also raised by the platform modules that read an allocation or build a launcher's
command). Standard library only."""

from __future__ import annotations


class HpcdlError(RuntimeError):
    """Base class of every error hpcdl raises on purpose."""


class LaunchError(HpcdlError):
    """Bad hosts, hostfile, flags or environment; the message says what to change."""
