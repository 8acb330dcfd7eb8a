"""Lifecycle and build facts of ``hpcdl.tensorflow`` (Horovod's ``hvd.init()``, ``hvd.nccl_built()``, ...);
the topology (``rank``, ``size``, ...) is ``hpcdl.common``'s own.

Everything delegates to ``hpcdl.common``. TensorFlow tensors reach the runtime through host memory (a
GPU tensor is copied to the host and back), so the GPU build facts of Horovod's TensorFlow extension (NCCL,
CUDA, ROCm, DDL, CCL) are all False here, whatever the installed TensorFlow was built with.
"""

from __future__ import annotations

from hpcdl import common
from hpcdl.common.engine import start_timeline, stop_timeline
from hpcdl.common.process_sets import init

__all__ = [
    "ccl_built",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
    "init",
    "mpi_built",
    "nccl_built",
    "rocm_built",
    "shutdown",
    "start_timeline",
    "stop_timeline",
]


def shutdown() -> None:
    """Stop hpcdl in this process. Safe to call twice."""
    if common.is_initialized():
        common.shutdown()


def mpi_built() -> bool:
    """True when the compiled runtime was built with MPI support."""
    return common.built().mpi.available


def gloo_built() -> bool:
    """True when the runtime has its TCP controller, which plays Gloo's role in Horovod."""
    return common.built().tcp.available


def gloo_enabled() -> bool:
    """True when the job runs on the runtime's non-MPI (TCP/shared memory) controller."""
    return common.is_initialized() and not common.mpi_enabled()


def nccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False
