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

from hpcdl.common.exceptions import LibraryNotFoundError

ABI_VERSION = 2


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
    if found != ABI_VERSION:
        raise LibraryNotFoundError(
            f"{path} has ABI version {found}, this hpcdl expects {ABI_VERSION}; reinstall hpcdl"
        )
    lib.hpcdl_build_info.restype = ctypes.c_char_p
    _declare(lib)
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    """ctypes signatures of the data-plane half of c_api.h (the engine module declares its own)."""
    c = ctypes
    i64p = c.POINTER(c.c_int64)
    i32p = c.POINTER(c.c_int32)
    signatures = {
        "hpcdl_last_error": (c.c_char_p, []),
        "hpcdl_init": (c.c_int, [c.c_char_p]),
        "hpcdl_shutdown": (c.c_int, []),
        "hpcdl_is_initialized": (c.c_int, []),
        "hpcdl_rank": (c.c_int, []),
        "hpcdl_size": (c.c_int, []),
        "hpcdl_local_rank": (c.c_int, []),
        "hpcdl_local_size": (c.c_int, []),
        "hpcdl_cross_rank": (c.c_int, []),
        "hpcdl_cross_size": (c.c_int, []),
        "hpcdl_is_homogeneous": (c.c_int, []),
        "hpcdl_transport_name": (c.c_char_p, [c.c_int]),
        "hpcdl_mpi_enabled": (c.c_int, []),
        "hpcdl_mpi_threads_supported": (c.c_int, []),
        "hpcdl_rendezvous_server_start": (c.c_int64, [c.c_char_p, c.c_int, c.c_char_p, c.c_int]),
        "hpcdl_rendezvous_server_port": (c.c_int, [c.c_int64]),
        "hpcdl_rendezvous_server_arrived": (c.c_int, [c.c_int64, i32p, c.c_int]),
        "hpcdl_rendezvous_server_stop": (c.c_int, [c.c_int64]),
        "hpcdl_object_key": (c.c_int, [c.POINTER(c.c_uint8)]),
        "hpcdl_object_sequence": (c.c_int64, [c.c_int, c.c_char_p]),
        "hpcdl_allreduce": (
            c.c_int,
            [c.c_void_p, c.c_void_p, c.c_int64, c.c_int, c.c_int, c.c_double, c.c_double, c.c_int],
        ),
        "hpcdl_allgather": (c.c_int, [c.c_void_p, c.c_int64, c.c_void_p, i64p, c.c_int, c.c_int]),
        "hpcdl_broadcast": (c.c_int, [c.c_void_p, c.c_int64, c.c_int, c.c_int, c.c_int]),
        "hpcdl_alltoall": (c.c_int, [c.c_void_p, i64p, c.c_void_p, i64p, c.c_int, c.c_int]),
        "hpcdl_reducescatter": (
            c.c_int,
            [c.c_void_p, c.c_void_p, i64p, c.c_int, c.c_int, c.c_double, c.c_double, c.c_int],
        ),
        "hpcdl_barrier": (c.c_int, [c.c_int]),
        "hpcdl_add_process_set": (c.c_int, [i32p, c.c_int]),
        "hpcdl_remove_process_set": (c.c_int, [c.c_int]),
        "hpcdl_process_set_rank": (c.c_int, [c.c_int]),
        "hpcdl_process_set_size": (c.c_int, [c.c_int]),
        "hpcdl_process_set_ranks": (c.c_int, [c.c_int, i32p, c.c_int]),
        "hpcdl_process_set_ids": (c.c_int, [i32p, c.c_int]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


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
