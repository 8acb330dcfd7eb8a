"""Batch schedulers behind one interface: render a job for Slurm, PBS, Cobalt, LSF or Flux, submit it,
and follow it (status, cancel, logs)."""

from __future__ import annotations

from hpcdl.platforms import scheduler_names
from hpcdl.schedulers.base import JobState, Scheduler
from hpcdl.schedulers.cobalt import Cobalt
from hpcdl.schedulers.errors import (
    JobSpecError,
    JobUnknownError,
    SchedulerError,
    ScriptCheckError,
    SiteConfigError,
)
from hpcdl.schedulers.flux import Flux
from hpcdl.schedulers.job import ArraySpec, JobSpec, SignalSpec, Sweep, parse_walltime
from hpcdl.schedulers.lsf import Lsf
from hpcdl.schedulers.pbs import Pbs
from hpcdl.schedulers.registry import SCHEDULERS, detect_scheduler, get_scheduler
from hpcdl.schedulers.render import ScriptParts
from hpcdl.schedulers.site import SiteConfig, load_site
from hpcdl.schedulers.slurm import Slurm

__all__ = [
    "SCHEDULERS",
    "ArraySpec",
    "Cobalt",
    "Flux",
    "JobSpec",
    "JobSpecError",
    "JobState",
    "JobUnknownError",
    "Lsf",
    "Pbs",
    "Scheduler",
    "SchedulerError",
    "ScriptCheckError",
    "ScriptParts",
    "SignalSpec",
    "SiteConfig",
    "SiteConfigError",
    "Slurm",
    "Sweep",
    "detect_scheduler",
    "get_scheduler",
    "load_site",
    "parse_walltime",
    "scheduler_names",
]
