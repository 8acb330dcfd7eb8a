"""The scheduler backends by name, and which one this machine has."""

from __future__ import annotations

import os

from hpcdl.schedulers.base import Scheduler
from hpcdl.schedulers.cobalt import Cobalt
from hpcdl.schedulers.errors import SchedulerError
from hpcdl.schedulers.flux import Flux
from hpcdl.schedulers.lsf import Lsf
from hpcdl.schedulers.pbs import Pbs
from hpcdl.schedulers.slurm import Slurm

SCHEDULERS: dict[str, type[Scheduler]] = {
    "slurm": Slurm,
    "pbs": Pbs,
    "cobalt": Cobalt,
    "lsf": Lsf,
    "flux": Flux,
}
# Slurm before PBS/Cobalt: Slurm's PBS wrappers also install a qsub. Flux last unless we are inside an
# instance (FLUX_URI), where it wins even within another scheduler's job.
_DETECTION_ORDER: tuple[type[Scheduler], ...] = (Slurm, Lsf, Pbs, Cobalt, Flux)


def detect_scheduler() -> str:
    """The scheduler to submit to here; a SchedulerError naming what was looked for when none is found."""
    if os.environ.get("FLUX_URI") and Flux.detect():
        return Flux.name
    for backend in _DETECTION_ORDER:
        if backend.detect():
            return backend.name
    raise SchedulerError(
        "no batch scheduler found on PATH (looked for sbatch, bsub, qsub from PBS or Cobalt, flux); "
        "load the scheduler's module, or name one with --scheduler slurm|pbs|cobalt|lsf|flux (--dry-run "
        "renders a script without submitting)"
    )


def get_scheduler(name: str) -> Scheduler:
    """The backend called ``name``; ``auto`` detects it from the commands on PATH."""
    if name == "auto":
        name = detect_scheduler()
    if name not in SCHEDULERS:
        raise SchedulerError(f"unknown scheduler {name!r}; use auto or one of {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name]()
