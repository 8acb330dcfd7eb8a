"""What the ``qsub`` on PATH says it is: PBS and Cobalt both install a command called ``qsub``, and each
backend's ``detect`` reads this answer for its own mark."""

from __future__ import annotations

import shutil
import subprocess

_PROBE_TIMEOUT_S = 10.0


def qsub_version() -> str:
    """``qsub --version`` in lower case ('' when there is no qsub, or it does not answer)."""
    if shutil.which("qsub") is None:
        return ""
    try:
        done = subprocess.run(
            ["qsub", "--version"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout + done.stderr).lower()
