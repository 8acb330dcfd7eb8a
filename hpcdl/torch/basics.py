"""Lifecycle, topology and build facts of ``hpcdl.torch`` (Horovod's ``hvd.init()``, ``hvd.rank()``, ...).

Everything here delegates to ``hpcdl.common``; the only torch-specific parts are the build facts that
come from PyTorch itself (NCCL, CUDA, ROCm: hpcdl uses PyTorch's for GPU tensors) and the handle table
that ``init``/``shutdown`` reset.
"""

from __future__ import annotations

import atexit
from collections.abc import Sequence
from typing import Any, Optional, Union

import torch
import torch.distributed as dist

from hpcdl import common
from hpcdl.common import process_sets as _sets
from hpcdl.common.engine import start_timeline as start_timeline  # re-exported: Horovod's basics
from hpcdl.common.engine import stop_timeline as stop_timeline
from hpcdl.common.process_sets import ProcessSet
from hpcdl.torch import _gpu, _handles

_atexit_registered = False


def init(
    comm: Optional[Union[Sequence[int], Any]] = None,
    process_sets: Optional[Union[Sequence[ProcessSet], str]] = None,
) -> None:
    """Start hpcdl in this process (Horovod's ``hvd.init``; ``comm`` and ``process_sets`` as in
    :func:`hpcdl.common.process_sets.init`: a list of world ranks or an mpi4py communicator makes those
    ranks a job of their own). Also sets up what PyTorch's tensors need (the handle table, NCCL for
    CUDA tensors). A second call is a no-op."""
    global _atexit_registered
    if common.is_initialized():
        return  # a second init() is a no-op, as in Horovod
    _sets.init(comm, process_sets)
    _handles.reset()
    _gpu.on_init()
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True


def shutdown() -> None:
    """Stop hpcdl in this process (pending async handles are dropped). Safe to call twice."""
    _handles.reset()
    _gpu.on_shutdown()
    if common.is_initialized():
        common.shutdown()


def is_initialized() -> bool:
    return common.is_initialized()


def size() -> int:
    """Number of ranks in the job."""
    return common.size()


def local_size() -> int:
    """Number of ranks on this host."""
    return common.local_size()


def cross_size() -> int:
    """Number of hosts (ranks that share this process's local rank)."""
    return common.cross_size()


def rank() -> int:
    """This process's rank in the job."""
    return common.rank()


def local_rank() -> int:
    """This process's rank on its host (use it to pick the GPU)."""
    return common.local_rank()


def cross_rank() -> int:
    """The index of this process's host."""
    return common.cross_rank()


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    return common.is_homogeneous()


def mpi_threads_supported() -> bool:
    return common.mpi_threads_supported()


def mpi_enabled() -> bool:
    """True when the runtime moves data or meets its peers over MPI in this job."""
    return common.mpi_enabled()


def mpi_built() -> bool:
    """True when the compiled runtime was built with MPI support."""
    return common.built().mpi.available


def gloo_built() -> bool:
    """True when PyTorch's Gloo backend is present (hpcdl's own TCP controller plays Gloo's role)."""
    return dist.is_available() and dist.is_gloo_available()


def gloo_enabled() -> bool:
    """True when the job runs on the runtime's non-MPI (TCP/shared memory) controller, Gloo's role in
    Horovod."""
    return common.is_initialized() and not common.mpi_enabled()


def nccl_built() -> bool:
    """True when this PyTorch has NCCL, which hpcdl uses for CUDA tensors."""
    return dist.is_available() and dist.is_nccl_available()


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return torch.version.cuda is not None


def rocm_built() -> bool:
    return getattr(torch.version, "hip", None) is not None
