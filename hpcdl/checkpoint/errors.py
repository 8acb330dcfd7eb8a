"""The checkpoint package's error."""

from __future__ import annotations

from hpcdl.common.exceptions import HpcdlError


class CheckpointError(HpcdlError):
    """A checkpoint cannot be written or loaded (the message says where and what to do); raised on every
    rank alike, so that no rank is left waiting for the others."""
