"""Scaling studies: measure how a workload scales with the number of workers and read it against the model
T(W) = G·f(W) + C(W) (``hpcdl scaling run|collect|report``).

- :mod:`~hpcdl.common.steps`: :class:`StepTimer`, the step-time helper for training scripts;
- :mod:`~hpcdl.scaling.study`: the study's definition and directory;
- :mod:`~hpcdl.scaling.local` / :mod:`~hpcdl.scaling.cluster`: running the points through ``hpcdl run``
  here, or as batch jobs through :mod:`hpcdl.schedulers`;
- :mod:`~hpcdl.scaling.results`: the figures of each point from the ranks' records;
- :mod:`~hpcdl.scaling.costmodel`: the fit; :mod:`~hpcdl.scaling.report`, :mod:`~hpcdl.scaling.publish`,
  :mod:`~hpcdl.scaling.plots`, :mod:`~hpcdl.scaling.textplot`: what is written and drawn.

Importing this package imports neither torch nor matplotlib.
"""

from __future__ import annotations

from hpcdl.common.steps import StepTimer
from hpcdl.scaling.study import StudyError, StudySpec, Workload

__all__ = ["StepTimer", "StudyError", "StudySpec", "Workload"]
