"""Tell apart the batch systems that install a command called ``qsub``."""

from __future__ import annotations

import shutil
import subprocess

_PROBE_TIMEOUT_S = 10.0


def qsub_flavour() -> str:
    """``pbs`` or ``cobalt`` for the ``qsub`` on PATH ('' when none, or another, e.g. Slurm's PBS wrapper)."""
    if shutil.which("qsub") is None:
        return ""
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
