"""What the compiled runtime of this installation can do, read from the library itself."""

from __future__ import annotations

from dataclasses import dataclass

from hpcdl.common import library
from hpcdl.common.exceptions import LibraryNotFoundError


@dataclass(frozen=True)
class Capability:
    """One line of the check-build matrix: a feature, whether it works here, and why not."""

    name: str
    available: bool
    reason: str = ""  # why it is missing and what to do; empty when available
    detail: str = ""  # e.g. the MPI vendor and version


@dataclass(frozen=True)
class RuntimeBuild:
    version: str
    library: str
    loaded: bool
    load_error: str
    shm: Capability
    tcp: Capability
    mpi: Capability
    raw: dict


def built() -> RuntimeBuild:
    """Describe the compiled runtime: version, library path and its transports (shm, TCP, MPI).

    Never raises: a runtime that cannot be loaded is reported with the reason, so that
    ``hpcdl check-build`` can tell the user what to do.
    """
    try:
        path = str(library.library_path())
        info = library.build_info()
    except LibraryNotFoundError as exc:
        reason = str(exc)
        return RuntimeBuild(
            version="",
            library="",
            loaded=False,
            load_error=reason,
            shm=Capability("shared memory", False, reason),
            tcp=Capability("TCP", False, reason),
            mpi=Capability("MPI", False, reason),
            raw={},
        )
    mpi_detail = " ".join(x for x in (info.get("mpi_vendor", ""), info.get("mpi_version", "")) if x)
    return RuntimeBuild(
        version=info.get("version", ""),
        library=path,
        loaded=True,
        load_error="",
        shm=Capability("shared memory", bool(info.get("shm"))),
        tcp=Capability("TCP", bool(info.get("tcp"))),
        mpi=Capability(
            "MPI",
            bool(info.get("mpi")),
            "" if info.get("mpi") else info.get("mpi_reason", "not compiled in"),
            mpi_detail,
        ),
        raw=info,
    )
