"""What the compiled runtime of this installation can do, read from the library itself; and which MPI
library this process finds now (MPI is chosen at run time, see ``mpi_library``)."""

from __future__ import annotations

from dataclasses import dataclass

from hpcdl.common import config, discovery, library, mpi_library
from hpcdl.common.exceptions import HpcdlError, LibraryNotFoundError


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
    return RuntimeBuild(
        version=info.get("version", ""),
        library=path,
        loaded=True,
        load_error="",
        shm=Capability("shared memory", bool(info.get("shm"))),
        tcp=Capability("TCP", bool(info.get("tcp"))),
        mpi=_mpi(info),
        raw=info,
    )


def _mpi(info: dict) -> Capability:
    """MPI as this process finds it now: the library a job here would load, and why not the others."""
    if not info.get("mpi"):
        return Capability("MPI", False, info.get("mpi_missing", "").strip() or "this hpcdl has no MPI shim")
    try:
        requested = config.resolve().values["mpi"]
        report = mpi_library.report(requested, discovery.discover().launcher)
    except HpcdlError as exc:
        return Capability("MPI", False, str(exc))
    if report.used is None:
        return Capability("MPI", False, report.missing)
    others = "".join(f"; {family.name}: {why}" for family, why in report.others)
    used = report.used.describe()
    return Capability("MPI", True, detail=f"{used}, found at run time ({report.why_used}){others}")
