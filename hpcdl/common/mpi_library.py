"""Which MPI library this process uses, found at run time (never decided when hpcdl was built).

MPI has two binary families: Open MPI (``libmpi.so.40``) and MPICH with its ABI-compatible derivatives
(Intel MPI, MVAPICH, Cray MPICH: ``libmpi.so.12``, Debian's ``libmpich.so.12``, Cray's
``libmpi_cray.so.12``). The runtime links neither; it has one shim per family beside it
(``_mpi_openmpi.so``, ``_mpi_mpich.so``, see ``collectives/src/mpi/mpi_shim.h``). A job uses the family of
the launcher that started it (Open MPI's ``mpirun``, or an MPICH-family ``mpiexec``); ``HPCDL_MPI`` may name
a family (``openmpi``, ``mpich``) or a library path instead. The library itself is the first that loads of:
a directory named by the family's own variables (``OPAL_PREFIX`` that a relocated Open MPI and its mpirun
set, ``I_MPI_ROOT``, ``MPICH_DIR``), then the dynamic loader's search (``LD_LIBRARY_PATH`` from the loaded
module or from what mpirun exported, the loader's cache).

:func:`activate` loads it with ``RTLD_GLOBAL`` (Open MPI's plugins and the shim resolve MPI's symbols
there) and returns the shim for the runtime's ``mpi_shim`` option; :func:`report` says what
``hpcdl check-build`` shows: the MPI used and why another was not.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hpcdl.common import discovery, library
from hpcdl.common.exceptions import HpcdlConfigError, LibraryNotFoundError

_VERSION_BYTES = 8192  # MPICH's MPI_MAX_LIBRARY_VERSION_STRING (Open MPI's is 256)


@dataclass(frozen=True)
class Family:
    key: str  # the shim's name and an HPCDL_MPI value
    name: str  # as MPI_Get_library_version and discovery name it
    sonames: tuple[str, ...]
    roots: tuple[tuple[str, str], ...]  # (variable, subdirectory): where the family's install says it is
    members: str  # for messages


FAMILIES: tuple[Family, ...] = (
    Family("openmpi", "Open MPI", ("libmpi.so.40",), (("OPAL_PREFIX", "lib"),), "Open MPI 3.x to 5.x"),
    Family(
        "mpich",
        "MPICH",
        ("libmpi.so.12", "libmpich.so.12", "libmpi_cray.so.12"),
        (("I_MPI_ROOT", "lib/release"), ("I_MPI_ROOT", "lib"), ("MPICH_DIR", "lib")),
        "MPICH 3.1+, Intel MPI, MVAPICH, Cray MPICH",
    ),
)
_BY_KEY = {f.key: f for f in FAMILIES}
_BY_NAME = {f.name: f for f in FAMILIES}


@dataclass(frozen=True)
class Found:
    """One family's library as this process would load it (``path`` empty when none loads)."""

    family: Family
    path: str = ""
    version: str = ""  # the first line of MPI_Get_library_version, e.g. "Open MPI v4.1.4"
    tried: tuple[str, ...] = ()  # why each candidate did not serve

    @property
    def ok(self) -> bool:
        return bool(self.path)

    def describe(self) -> str:
        if self.ok:
            return f"{self.version} at {self.path}"
        return f"no {self.family.name} library loads ({'; '.join(self.tried)})"


@dataclass(frozen=True)
class Report:
    """What ``hpcdl check-build`` says about MPI: the family this process uses and why not the others."""

    used: Optional[Found]
    why_used: str
    others: list[tuple[Family, str]] = field(default_factory=list)  # (family, why it is not used)
    missing: str = ""  # no MPI at all: why, and what to do


def shim(family: Family) -> Optional[Path]:
    """The family's shim beside the runtime, or None when this installation has none."""
    try:
        path = library.library_path().with_name(f"_mpi_{family.key}.so")
    except LibraryNotFoundError:
        return None
    return path if path.is_file() else None


def _shim_missing(family: Family) -> str:
    missing = library.build_info().get("mpi_missing", "")
    return (
        f"this hpcdl has no {family.name} shim ({missing.strip() or 'not built'}); "
        "install hpcdl's binary wheel, which has both MPI families"
    )


def family_of_launcher(launcher: str) -> Optional[Family]:
    name = discovery.launcher_mpi(launcher)
    return _BY_NAME.get(name) if name else None


def requested_family(requested: str, launcher: str) -> tuple[Optional[Family], str]:
    """(family, why) from HPCDL_MPI (a family or a path: None) or else the launcher."""
    value = (requested or "auto").strip()
    if value.lower() in _BY_KEY:
        return _BY_KEY[value.lower()], f"HPCDL_MPI={value}"
    if value.lower() != "auto":
        if "/" not in value:
            raise HpcdlConfigError(
                f"HPCDL_MPI={value!r} is not one of auto, {', '.join(_BY_KEY)} nor a path to a libmpi"
            )
        return None, f"HPCDL_MPI={value}"
    family = family_of_launcher(launcher)
    if family is not None:
        return family, f"this process was started by {launcher}"
    return None, ""


def _candidates(family: Family, env: Mapping[str, str]) -> list[str]:
    found = []
    for variable, sub in family.roots:
        root = env.get(variable, "")
        for soname in family.sonames if root else ():
            path = Path(root) / sub / soname
            if path.is_file() and str(path) not in found:
                found.append(str(path))
    return [*found, *family.sonames]


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _loaded_path(function: ctypes._CFuncPtr) -> str:
    """The file a loaded function lives in, as the loader named it (dladdr)."""
    libc = ctypes.CDLL(None)
    info = _DlInfo()
    if not libc.dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return ""
    return os.path.abspath(info.dli_fname.decode())


def _version(lib: ctypes.CDLL) -> str:
    text = ctypes.create_string_buffer(_VERSION_BYTES)
    length = ctypes.c_int(0)
    lib.MPI_Get_library_version(text, ctypes.byref(length))
    first = text.value.decode(errors="replace").strip().splitlines()[0] if text.value else "unknown MPI"
    return re.sub(r"\s*Version:\s*", " ", first).split(",")[0].strip()


def _load(candidate: str, mode: int) -> tuple[Optional[ctypes.CDLL], str]:
    try:
        lib = ctypes.CDLL(candidate, mode=mode)
    except OSError as exc:
        return None, str(exc)
    if not hasattr(lib, "MPI_Get_library_version"):
        return None, f"{candidate} has no MPI_Get_library_version, so it is not an MPI-3 library"
    return lib, ""


def _family_of(version: str) -> Family:
    return _BY_KEY["openmpi"] if version.startswith("Open MPI") else _BY_KEY["mpich"]


def find(family: Family, env: Optional[Mapping[str, str]] = None, path: str = "") -> Found:
    """Load (privately: RTLD_LOCAL) the first library of `family`, or the given path, and read its version."""
    env = os.environ if env is None else env
    tried = []
    for candidate in [path] if path else _candidates(family, env):
        lib, why = _load(candidate, os.RTLD_NOW | os.RTLD_LOCAL)
        if lib is None:
            tried.append(why)
            continue
        version = _version(lib)
        if _family_of(version) is not family:
            tried.append(f"{candidate} is {version}, not of the {family.name} family")
            continue
        return Found(family, _loaded_path(lib.MPI_Get_library_version) or candidate, version, tuple(tried))
    if not path:
        where = env.get("LD_LIBRARY_PATH", "")
        tried.append(f"searched LD_LIBRARY_PATH={where or '(unset)'} and the loader's cache")
    return Found(family, tried=tuple(tried))


_active: Optional[Found] = None


def _wanted(requested: str, launcher: str) -> tuple[list[Family], str, str]:
    """(families to try in order, a library path HPCDL_MPI names or "", why these)."""
    family, why = requested_family(requested, launcher)
    path = requested.strip() if family is None and why else ""
    if path:  # a library HPCDL_MPI names must be of the launcher's family, when it has one
        family = family_of_launcher(launcher)
    return ([family] if family else list(FAMILIES)), path, why


def job_family(requested: str, launcher: str) -> str:
    """The MPI family ("Open MPI", "MPICH") this job would use through a shim it has, or ""."""
    families, _, _ = _wanted(requested, launcher)
    return families[0].name if len(families) == 1 and shim(families[0]) is not None else ""


def activate(requested: str, launcher: str, env: Optional[Mapping[str, str]] = None) -> tuple[Found, Path]:
    """Load this job's MPI library for good (RTLD_GLOBAL) and return it with its family's shim.

    Raises HpcdlConfigError saying what was tried and what to do when none can be used."""
    global _active
    families, path, why = _wanted(requested, launcher)
    if _active is not None:
        if _active.family in families and (not path or os.path.realpath(path) == _active.path):
            return _active, shim(_active.family)  # type: ignore[return-value]
        raise HpcdlConfigError(
            f"this process already uses {_active.describe()}; a process can hold one MPI library only"
        )
    tried = []
    for family in families:
        located = shim(family)
        if located is None:
            tried.append(_shim_missing(family))
            continue
        found = find(family, env, path)
        if found.ok:
            ctypes.CDLL(found.path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
            _active = found
            return found, located
        tried.append(found.describe())
    wanted = " or ".join(f"{f.name} ({f.members})" for f in families)
    raise HpcdlConfigError(
        f"{why or 'transport=mpi'}, so hpcdl needs {wanted}, but none can be used: {'; '.join(tried)}. "
        "Load the MPI module your mpirun/mpiexec comes from (its lib directory on LD_LIBRARY_PATH), or set "
        "HPCDL_MPI to the path of its libmpi.so; 'hpcdl check-build --verbose' shows what hpcdl finds"
    )


def active() -> Optional[Found]:
    """The MPI library this process loaded for its job (see activate), if any."""
    return _active


def report(requested: str = "auto", launcher: str = "none") -> Report:
    """Which MPI this process uses or would use, and why not the others."""
    if _active is not None:
        return Report(_active, "loaded by this process")
    return _probe(requested, launcher)


@functools.cache
def _probe(requested: str, launcher: str) -> Report:
    """report() before any MPI is loaded: each family's library is looked for once per process."""
    families, path, why = _wanted(requested, launcher)
    probed = {f: find(f, path=path) for f in families if shim(f) is not None}
    used = next((f for f in families if f in probed and probed[f].ok), None)
    if used is not None and not why:
        why = "the first family found, as no MPI launcher started this process; a job uses its launcher's MPI"
    others = []
    for family in FAMILIES:
        if family is used:
            continue
        if shim(family) is None:
            others.append((family, _shim_missing(family)))
        elif family not in probed:
            others.append((family, f"not used, {why}"))
        elif not probed[family].ok:
            others.append((family, probed[family].describe()))
        else:
            starter = discovery.mpi_launcher(family.name)
            others.append((family, f"{probed[family].describe()} is used by jobs that {starter} starts"))
    if used is None:
        text = "; ".join(f"{f.name}: {reason}" for f, reason in others)
        return Report(None, "", others, missing=f"no MPI library can be used ({text})")
    return Report(probed[used], why, others)
