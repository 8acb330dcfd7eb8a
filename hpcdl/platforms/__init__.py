"""Every platform hpcdl knows, one module each (Slurm, PBS with PALS, LSF, Flux, Cobalt with ALPS, and the
MPI launchers), and the one registry that discovery, ``hpcdl run``'s allocation and launchers, the
scheduler backends, the site file and the command line's help read.

A platform module holds what a rank or ``hpcdl run`` needs to know about it (its variables, its node list
syntax, how its allocation is read, its step launcher) and names its batch-script backend in
:mod:`hpcdl.schedulers`, which holds the rest (directives, script rules, submit/status/cancel). Adding a
platform is its module here, its backend there, its template, and one line below.

Standard library only: this is read on every rank at ``init``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from hpcdl.platforms import cobalt, flux, lsf, mpi, pbs, slurm
from hpcdl.platforms.base import Found, NativeLauncher, Platform, TaskVariables

_REGISTRY: dict[str, Platform] = {}


def register(platform: Platform) -> Platform:
    """Add a platform (its name must be new); it returns it, for use as a module's last line."""
    if platform.name in _REGISTRY:
        raise ValueError(f"platform {platform.name!r} is registered already")
    _REGISTRY[platform.name] = platform
    return platform


def unregister(name: str) -> None:
    """Remove a platform added with :func:`register` (a test's own)."""
    del _REGISTRY[name]


def platforms() -> list[Platform]:
    """Every registered platform, in registration order."""
    return list(_REGISTRY.values())


def get(name: str) -> Platform:
    return _REGISTRY[name]


def scheduler_names() -> list[str]:
    """The names of the platforms with a batch-script backend (``--scheduler`` NAME)."""
    return [p.name for p in _REGISTRY.values() if p.scheduler]


def task_variables() -> list[TaskVariables]:
    """Every launcher's rank variables, in the order discovery reads them."""
    found = [task for p in _REGISTRY.values() for task in p.tasks]
    return sorted(found, key=lambda task: task.precedence)


def by_priority() -> list[Platform]:
    """The schedulers in the order they are looked for, then the launchers that are no scheduler."""
    return sorted(_REGISTRY.values(), key=lambda p: (not p.scheduler, p.detect_priority))


def job_id_variables() -> list[str]:
    """The variables naming the job a rank belongs to, the batch job's first, then the launchers'."""
    return [name for p in by_priority() for name in p.job_id_variables]


def job_tag_variables() -> list[str]:
    """The variables telling one job (or step) from another, for ranks that meet on ports derived alike."""
    return [name for p in _REGISTRY.values() for name in p.job_tag_variables]


def native_launchers() -> dict[str, type[NativeLauncher]]:
    """Each platform's step launchers by ``--launcher`` name."""
    return {cls.name: cls for p in _REGISTRY.values() for cls in p.launchers}


def detect_allocation(environ: Mapping[str, str]) -> Optional[tuple[Platform, Found]]:
    """The allocation this process runs in, and its platform; None outside one."""
    for platform in by_priority():
        found = platform.allocation(environ) if platform.allocation else None
        if found is not None:
            return platform, found
    return None


def by_title(title: str) -> Platform:
    """The platform whose messages call it `title` (an Allocation's scheduler)."""
    return next(p for p in _REGISTRY.values() if p.title == title)


for _module in (slurm, pbs, cobalt, lsf, flux, mpi):
    register(_module.PLATFORM)

__all__ = [
    "Found",
    "NativeLauncher",
    "Platform",
    "TaskVariables",
    "by_priority",
    "detect_allocation",
    "get",
    "job_id_variables",
    "job_tag_variables",
    "native_launchers",
    "platforms",
    "register",
    "scheduler_names",
    "task_variables",
    "unregister",
]
