"""Lay a backend's ScriptParts out through its Jinja2 template in ``templates/batch/``."""

from __future__ import annotations

from dataclasses import asdict
from importlib import resources
from pathlib import Path

import jinja2

from hpcdl._version import __version__
from hpcdl.schedulers.base import Scheduler, ScriptParts
from hpcdl.schedulers.errors import ScriptCheckError
from hpcdl.schedulers.job import JobSpec
from hpcdl.schedulers.site import SiteConfig


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
    template = _environment().get_template(f"{parts.scheduler}.sh.j2")
    return template.render(version=__version__, **asdict(parts))


def render_script(scheduler: Scheduler, job: JobSpec, site: SiteConfig) -> str:
    """The batch script for ``job``; raises ScriptCheckError if the scheduler would reject it."""
    script = render_parts(scheduler.parts(job, site))
    problems = scheduler.validate(script, site)
    if problems:
        raise ScriptCheckError(scheduler.name, problems)
    return script
