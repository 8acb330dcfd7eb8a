"""The C hot path (``hpcdl.common._hotpath``), bound to the loaded runtime once per process.

``_hotpath`` links to nothing: it calls the runtime through the addresses of the functions
:data:`hpcdl.common.abi.HOTPATH` lists, taken from the library ``hpcdl.common.library`` loaded (so
``HPCDL_LIBRARY`` selects the runtime for it too). The engine's submissions and handles and the direct
in-place allreduce of :mod:`hpcdl.common.ops` go through it.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from hpcdl.common import _hotpath, abi
from hpcdl.common.exceptions import HpcdlError, error_for
from hpcdl.common.library import load
from hpcdl.common.types import buffer_formats

_bound = False
_lock = threading.Lock()


def runtime() -> ctypes.CDLL:
    """The runtime, with ``_hotpath`` bound to it (the first call binds it)."""
    global _bound
    lib = load()
    if not _bound:
        with _lock:
            if not _bound:
                _hotpath.bind(
                    *abi.addresses(lib, abi.HOTPATH), raise_status, HpcdlError, np.ndarray, buffer_formats()
                )
                _bound = True
    return lib


def raise_status(status: int) -> None:
    """Raise the hpcdl exception for a failed C call, with the runtime's message."""
    raise error_for(status, (load().hpcdl_last_error() or b"").decode(errors="replace"))
