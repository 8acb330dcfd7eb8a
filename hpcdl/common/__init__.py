"""The framework-free Python face of hpcdl's compiled runtime."""

from __future__ import annotations

from hpcdl.common.build import Capability, built
from hpcdl.common.exceptions import (
    HpcdlError,
    HpcdlInternalError,
    HpcdlMismatchError,
    HpcdlNotInitializedError,
    HpcdlTimeoutError,
    LibraryNotFoundError,
)

__all__ = [
    "Capability",
    "HpcdlError",
    "HpcdlInternalError",
    "HpcdlMismatchError",
    "HpcdlNotInitializedError",
    "HpcdlTimeoutError",
    "LibraryNotFoundError",
    "built",
]
