"""Render modulefile templates and write them without clobbering what a user made."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jinja2

from hpcdl._version import __version__
from hpcdl.common.exceptions import HpcdlError
from hpcdl.common.output_file import OutputFileError, write_output_file
from hpcdl.modules.quote import CONTROL, ENV_NAME, lua, module_name_problem, tcl

FORMATS = ("lua", "tcl")


class ModuleWriteError(HpcdlError):
    """A modulefile could not be written; the message says why and what to do."""


def package_root() -> Path:
    """The directory holding templates/ and modulefiles/: the installed package, or the source tree."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / "templates").is_dir() else here.parent


def templates_dir() -> Path:
    return package_root() / "templates" / "modules"


def shipped_modulefiles() -> Path:
    return package_root() / "modulefiles"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    env.filters.update(lua=lua, tcl=tcl)
    return env


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def check_context(context: dict[str, object]) -> None:
    """Refuse what no quoting makes right: control characters anywhere, module names that are not names
    (name, version, family, depends_on) and environment variable names that are not names."""
    for key, value in context.items():
        for text in _strings(value):
            if CONTROL.search(text):
                raise ModuleWriteError(
                    f"{key}: {text!r} contains a control character (newline, tab, escape...), which has no "
                    "place in a modulefile; remove it"
                )
    names = [str(context[k]) for k in ("name", "version", "family") if context.get(k)]
    for module in [*names, *map(str, context.get("depends_on") or ())]:
        if module_name_problem(module):
            raise ModuleWriteError(module_name_problem(module))
    for key in ("setenv", "prepend_path"):
        for variable, _ in context.get(key) or ():
            if not ENV_NAME.match(str(variable)):
                raise ModuleWriteError(f"{key}: '{variable}' is not an environment variable name")


def render(template: str, **context: object) -> str:
    """Render `templates/modules/<template>`; every value reaches the text through the lua/tcl filters."""
    check_context(context)
    return _environment().get_template(template).render(hpcdl_version=__version__, **context)


@dataclass(frozen=True)
class Written:
    path: Path
    changed: bool  # False when an identical file was already there


def write_file(path: Path, text: str, force: bool) -> Written:
    """Write `text`; an existing file with other content is replaced only with `force`."""
    if path.exists():
        if path.is_file() and path.read_text(errors="replace") == text:
            return Written(path, False)
        if not force:
            raise ModuleWriteError(f"{path} exists with other content; pass --force to overwrite it")
    try:  # modulefiles are for others to read: the umask decides, as for any file
        write_output_file(path, "modulefile", text, replace=force, parents=True, mode=0o666)
    except OutputFileError as exc:
        raise ModuleWriteError(str(exc)) from None
    return Written(path, True)
