"""Which scheduler is this machine's: decided from the commands on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess

from hpcdl.schedulers.errors import SchedulerError

_PROBE_TIMEOUT_S = 10.0


def _qsub_flavour() -> str:
    """``pbs`` or ``cobalt`` for the ``qsub`` on PATH ('' when it is neither, e.g. Slurm's wrapper)."""
    if shutil.which("cqstat") or shutil.which("partlist"):
        return "cobalt"
    try:
        done = subprocess.run(
            ["qsub", "--version"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    text = (done.stdout + done.stderr).lower()
    if "pbs_version" in text:
        return "pbs"
    if "cobalt" in text:
        return "cobalt"
    return ""


def detect_scheduler() -> str:
    """The scheduler to submit to here; a SchedulerError naming what was looked for when none is found."""
    if os.environ.get("FLUX_URI") and shutil.which("flux"):
        return "flux"  # inside a Flux instance (possibly itself inside another scheduler's job)
    if shutil.which("sbatch"):
        return "slurm"  # before qsub: Slurm's PBS wrappers also install a qsub
    if shutil.which("bsub"):
        return "lsf"
    if shutil.which("qsub"):
        flavour = _qsub_flavour()
        if flavour:
            return flavour
    if shutil.which("flux"):
        return "flux"
    raise SchedulerError(
        "no batch scheduler found on PATH (looked for sbatch, bsub, qsub from PBS or Cobalt, flux); "
        "load the scheduler's module, or name one with --scheduler slurm|pbs|cobalt|lsf|flux (--dry-run "
        "renders a script without submitting)"
    )
