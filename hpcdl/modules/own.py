"""hpcdl's own modulefile: self-locating (shipped in ``modulefiles/``) or rendered for one installation."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from hpcdl._version import __version__
from hpcdl.modules.render import FORMATS, ModuleWriteError, Written, render, write_file


@dataclass(frozen=True)
class Installation:
    """Where an hpcdl installation lives and what a module must set to reach it."""

    prefix: Path
    bin: Path | None  # holds the `hpcdl` script (and, in a venv, its python)
    site: Path | None  # goes on PYTHONPATH; None for a virtual environment, whose python finds it itself


def find_installation(prefix: Path) -> Installation:
    """Inspect PREFIX (a venv, a Python installation, or a `pip install --prefix` tree) for hpcdl."""
    prefix = prefix.resolve()
    found = sorted(prefix.glob("lib/python*/site-packages/hpcdl-*.dist-info"))
    if not found:
        raise ModuleWriteError(
            f"no hpcdl installed under {prefix} (looked for lib/python*/site-packages/hpcdl-*.dist-info); "
            f"install it there first, e.g. `pip install --prefix {prefix} hpcdl` or into a venv at {prefix}"
        )
    site = found[-1].parent
    script = prefix / "bin" / "hpcdl"
    # A venv or Python installation brings its own python, which finds site-packages (and editable
    # installs, whose .pth hooks PYTHONPATH would skip); a bare --prefix tree needs PYTHONPATH.
    own_python = (prefix / "pyvenv.cfg").is_file() or (prefix / "bin" / "python3").exists()
    return Installation(prefix, script.parent if script.is_file() else None, None if own_python else site)


def current_installation() -> Installation:
    """The installation this process runs from (sys.prefix when hpcdl is inside it)."""
    return find_installation(Path(sys.prefix))


def render_own(fmt: str, installation: Installation | None, depends_on: list[str]) -> str:
    """Lua or Tcl text; `installation` None renders the self-locating file shipped in modulefiles/."""
    if installation is None:
        return render(
            f"hpcdl.{fmt}.j2",
            version=__version__,
            origin="shipped inside the hpcdl package",
            relocatable=True,
            depends_on=depends_on,
        )
    return render(
        f"hpcdl.{fmt}.j2",
        version=__version__,
        origin=f"written for the installation in {installation.prefix}",
        relocatable=False,
        prefix=str(installation.prefix),
        bin=str(installation.bin) if installation.bin else "",
        site=str(installation.site) if installation.site else "",
        depends_on=depends_on,
    )


def write_own(
    root: Path,
    installation: Installation | None,
    depends_on: list[str] = (),
    formats: tuple[str, ...] = FORMATS,
    force: bool = False,
) -> list[Written]:
    """Write ROOT/hpcdl/<version>.lua and/or ROOT/hpcdl/<version> (Tcl)."""
    written = []
    for fmt in formats:
        name = f"{__version__}.lua" if fmt == "lua" else __version__
        written.append(
            write_file(root / "hpcdl" / name, render_own(fmt, installation, list(depends_on)), force)
        )
    return written
