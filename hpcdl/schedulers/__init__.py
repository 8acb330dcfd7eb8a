"""Batch schedulers behind one interface: render a job for Slurm, PBS, Cobalt, LSF or Flux, submit it,
and follow it (status, cancel, logs)."""

from __future__ import annotations

from hpcdl.schedulers.base import JobState, Scheduler, ScriptParts
from hpcdl.schedulers.cobalt import Cobalt
from hpcdl.schedulers.detect import detect_scheduler
from hpcdl.schedulers.errors import JobSpecError, SchedulerError, ScriptCheckError, SiteConfigError
from hpcdl.schedulers.flux import Flux
from hpcdl.schedulers.job import ArraySpec, JobSpec, SignalSpec, Sweep, parse_walltime
from hpcdl.schedulers.lsf import Lsf
from hpcdl.schedulers.pbs import Pbs
from hpcdl.schedulers.render import render_script
from hpcdl.schedulers.site import SCHEDULER_NAMES, SiteConfig, load_site
from hpcdl.schedulers.slurm import Slurm

SCHEDULERS: dict[str, type[Scheduler]] = {
    "slurm": Slurm,
    "pbs": Pbs,
    "cobalt": Cobalt,
    "lsf": Lsf,
    "flux": Flux,
}


def get_scheduler(name: str) -> Scheduler:
    """The backend called ``name``; ``auto`` detects it from the commands on PATH."""
    if name == "auto":
        name = detect_scheduler()
    if name not in SCHEDULERS:
        raise SchedulerError(f"unknown scheduler {name!r}; use auto or one of {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name]()


__all__ = [
    "SCHEDULERS",
    "SCHEDULER_NAMES",
    "ArraySpec",
    "JobSpec",
    "JobSpecError",
    "JobState",
    "Scheduler",
    "SchedulerError",
    "ScriptCheckError",
    "ScriptParts",
    "SignalSpec",
    "SiteConfig",
    "SiteConfigError",
    "Sweep",
    "detect_scheduler",
    "get_scheduler",
    "load_site",
    "parse_walltime",
    "render_script",
]
