"""The launcher's error: something the user asked ``hpcdl run`` for cannot be done as given."""

from __future__ import annotations

from hpcdl.errors import LaunchError

__all__ = ["LaunchError"]
