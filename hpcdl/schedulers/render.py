"""The parts of a batch script a backend computes (``ScriptParts``), laid out through its Jinja2 template in
``templates/batch/``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Optional

import jinja2

from hpcdl._version import __version__


@dataclass
class ScriptParts:
    """Everything a batch template lays out; strings are final shell text (quoted where needed)."""

    scheduler: str
    directives: list[str]
    exports: list[tuple[str, str]]
    modules: list[str]
    setup: list[str]
    python: str  # the interpreter of hpcdl's helpers and of a *.py command, as one shell word
    python_origin: str  # why that one (a comment)
    secret_command: str
    debug_dir_command: str
    rendezvous_command: str
    rendezvous_timeout_s: int
    master_probe_command: Optional[str]
    launch: str
    sweep_variable: Optional[str] = None
    sweep_cases: list[tuple[int, list[tuple[str, str]]]] = field(default_factory=list)
    signal: Optional[str] = None
    signal_timer_s: Optional[int] = None
    requeue_command: Optional[str] = None
    workdir_command: Optional[str] = None


def template_dir() -> Path:
    """``templates/batch`` inside the installed package (the repository's ``templates/`` when editable)."""
    return Path(str(resources.files("hpcdl") / "templates" / "batch"))


def _environment(search: tuple[Path, ...]) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([*(str(d) for d in search), str(template_dir())]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_parts(parts: ScriptParts, search: tuple[Path, ...] = ()) -> str:
    """The script text: ``<scheduler>.sh.j2`` filled with ``parts``, looked up in `search` (the folders of a
    backend that ships its own template), then ``templates/batch``."""
    template = _environment(search).get_template(f"{parts.scheduler}.sh.j2")
    return template.render(version=__version__, **asdict(parts))
