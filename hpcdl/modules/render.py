"""Render modulefile templates and write them without clobbering what a user made."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from hpcdl._version import __version__
from hpcdl.common.exceptions import HpcdlError

FORMATS = ("lua", "tcl")
# Characters that Lua double-quoted strings or Tcl double-quoted words would interpret.
_UNSAFE = re.compile(r'["\\$\[\]{}\n\r`]')


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
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )


def _check_values(value: object, where: str) -> None:
    if isinstance(value, str):
        if _UNSAFE.search(value):
            raise ModuleWriteError(
                f"{where}: '{value}' contains a quote, backslash, $, bracket, brace or newline, which a "
                "modulefile would interpret; install into a path without them"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_values(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_values(item, where)


def render(template: str, **context: object) -> str:
    """Render `templates/modules/<template>` after checking every value is safe to embed."""
    for key, value in context.items():
        if key not in ("description", "help"):
            _check_values(value, key)
    for key in ("description",):
        if key in context:
            context[key] = str(context[key]).replace('"', "'").replace("[", "(").replace("]", ")")
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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return Written(path, True)
