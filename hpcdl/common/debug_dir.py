"""Where a job's diagnostic files go (flight recorder dumps, Python stacks of its ranks).

``HPCDL_DEBUG_DIR`` when set (``hpcdl run`` and generated batch scripts set it), otherwise
``./hpcdl-debug/<job id>`` with the launcher's job id. Standard library only; creates nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

DEBUG_DIR_ENV = "HPCDL_DEBUG_DIR"
# The launchers' job ids, first found wins (a bare mpirun has none of these: "job").
_JOB_ID_VARIABLES = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "COBALT_JOBID")


def debug_dir() -> Path:
    """This job's directory for diagnostic files (not created here)."""
    explicit = os.environ.get(DEBUG_DIR_ENV)
    if explicit:
        return Path(explicit)
    job = next((os.environ[v] for v in _JOB_ID_VARIABLES if os.environ.get(v)), "job")
    return Path.cwd() / "hpcdl-debug" / job.replace(os.sep, "_")
