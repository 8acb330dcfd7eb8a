"""The launcher's error: something the user asked ``hpcdl run`` for cannot be done as given."""

from __future__ import annotations

from hpcdl.common.exceptions import HpcdlError


class LaunchError(HpcdlError):
    """Bad hosts, hostfile, flags or environment; the message says what to change."""
