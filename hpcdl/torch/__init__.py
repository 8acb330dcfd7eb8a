"""Horovod's PyTorch API on hpcdl's runtime: change ``import horovod.torch as hvd`` to
``import hpcdl.torch as hvd`` and the script runs unchanged.

The ten steps of a Horovod script all work: ``hvd.init()``; pin the GPU with ``hvd.local_rank()``; scale
the learning rate by ``hvd.size()``; wrap the optimizer in ``hvd.DistributedOptimizer``; broadcast the
initial state with ``hvd.broadcast_parameters``/``hvd.broadcast_optimizer_state``; shard the data by
``hvd.rank()``; average metrics (``hvd.allreduce`` or ``hvd.metric_average``); checkpoint on rank 0; warm
the learning rate up (``hvd.LearningRateWarmup``).
"""

from __future__ import annotations

from hpcdl.common.exceptions import HostsUpdatedInterrupt, HpcdlError, HpcdlInternalError
from hpcdl.common.steps import StepTimer
from hpcdl.torch import elastic, mpi_ops
from hpcdl.torch.compression import Compression
from hpcdl.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hpcdl.torch.helpers import LearningRateWarmup, Metric, metric_average, warmup_factor
from hpcdl.torch.mpi_ops import *  # noqa: F403  (the ops layer, listed once: mpi_ops.__all__)
from hpcdl.torch.optimizer import DistributedOptimizer
from hpcdl.torch.sync_batch_norm import SyncBatchNorm, convert_sync_batchnorm

# Horovod's names for the errors its users catch: a failed collective (timeout, lost peer, mismatch,
# shutdown) and, in elastic training, a change of hosts. Both are RuntimeErrors, as in Horovod.
HorovodInternalError = HpcdlInternalError

__all__ = [
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "HpcdlError",
    "HpcdlInternalError",
    "LearningRateWarmup",
    "Metric",
    "StepTimer",
    "SyncBatchNorm",
    "allgather_object",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "convert_sync_batchnorm",
    "elastic",
    "metric_average",
    "warmup_factor",
]
__all__ += mpi_ops.__all__
