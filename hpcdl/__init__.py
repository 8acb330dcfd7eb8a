"""hpcdl: distributed deep learning on HPC clusters.

Doors: ``import hpcdl.torch as hvd`` (Horovod-compatible PyTorch API), ``hpcdl.common`` (the runtime on
NumPy arrays), and the ``hpcdl`` command (run, submit, check-build, stack, module, bench).
"""

from __future__ import annotations

from hpcdl._version import __version__

__all__ = ["__version__"]
