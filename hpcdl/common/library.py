"""Locate and load the compiled runtime (``collectives/``) through ctypes.

The library is installed inside the package as ``hpcdl/_collectives.so`` (one file for every CPython: it does
not depend on Python), with the MPI shims beside it (see ``mpi_library``); ``HPCDL_LIBRARY`` may point at
another build (a development tree, or a build configured without MPI).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import json
import os
from pathlib import Path

from hpcdl.common import abi
from hpcdl.common.exceptions import LibraryNotFoundError


def library_path() -> Path:
    """Path of the runtime library this process will load."""
    override = os.environ.get("HPCDL_LIBRARY")
    if override:
        path = Path(override)
        if not path.is_file():
            raise LibraryNotFoundError(
                f"HPCDL_LIBRARY={override} does not name a file; unset it or point it at a built "
                "_collectives.so"
            )
        return path
    spec = importlib.util.find_spec("hpcdl._collectives")
    if spec is None or spec.origin is None:
        raise LibraryNotFoundError(
            "hpcdl's compiled runtime is not installed (no hpcdl/_collectives.so); install the binary "
            "wheel, or reinstall with 'pip install .' from the source tree and read the build log"
        )
    return Path(spec.origin)


@functools.cache
def load() -> ctypes.CDLL:
    """Load the runtime once per process and check its ABI version."""
    path = library_path()
    try:
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise LibraryNotFoundError(
            f"cannot load hpcdl's runtime {path}: {exc}; it needs nothing but the C and C++ runtimes "
            "(MPI is loaded later, when a job asks for it): reinstall hpcdl, or install its binary wheel"
        ) from exc
    lib.hpcdl_abi_version.restype = ctypes.c_int
    found = lib.hpcdl_abi_version()
    if found != abi.VERSION:
        raise LibraryNotFoundError(
            f"{path} has ABI version {found}, this hpcdl expects {abi.VERSION}; reinstall hpcdl"
        )
    abi.declare(lib)
    return lib


def last_error() -> str:
    """The runtime's message for the last failed call on this thread."""
    return (load().hpcdl_last_error() or b"").decode(errors="replace")


def check(code: int) -> None:
    """Raise the hpcdl exception matching a C status code (0 passes)."""
    if code != 0:
        from hpcdl.common.exceptions import error_for

        raise error_for(code, last_error())


@functools.cache
def build_info() -> dict:
    """The runtime's own description of its build (see ``hpcdl_build_info`` in c_api.h)."""
    return json.loads(load().hpcdl_build_info().decode())
