"""Lay a backend's ScriptParts out through its Jinja2 template in ``templates/batch/``."""

from __future__ import annotations

from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

from hpcdl._version import __version__

if TYPE_CHECKING:
    from hpcdl.schedulers.base import ScriptParts


def template_dir() -> Path:
    """``templates/batch`` inside the installed package (the repository's ``templates/`` when editable)."""
    return Path(str(resources.files("hpcdl") / "templates" / "batch"))


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_parts(parts: ScriptParts) -> str:
    """The script text: ``templates/batch/<scheduler>.sh.j2`` filled with ``parts``."""
    template = _environment().get_template(f"{parts.scheduler}.sh.j2")
    return template.render(version=__version__, **asdict(parts))
