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
from hpcdl.scaling.steps import StepTimer
from hpcdl.torch import elastic
from hpcdl.torch.async_ops import (
    allgather_async,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    barrier,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from hpcdl.torch.basics import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hpcdl.torch.compression import Compression
from hpcdl.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hpcdl.torch.helpers import LearningRateWarmup, Metric, metric_average, warmup_factor
from hpcdl.torch.ops import (
    allgather,
    allreduce,
    allreduce_,
    alltoall,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_reducescatter,
    reducescatter,
)
from hpcdl.torch.optimizer import DistributedOptimizer
from hpcdl.torch.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from hpcdl.torch.reduce_ops import Adasum, Average, Max, Min, Product, Sum
from hpcdl.torch.sync_batch_norm import SyncBatchNorm, convert_sync_batchnorm

# Horovod's names for the errors its users catch: a failed collective (timeout, lost peer, mismatch,
# shutdown) and, in elastic training, a change of hosts. Both are RuntimeErrors, as in Horovod.
HorovodInternalError = HpcdlInternalError

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "HpcdlError",
    "HpcdlInternalError",
    "LearningRateWarmup",
    "Max",
    "Metric",
    "Min",
    "ProcessSet",
    "Product",
    "StepTimer",
    "Sum",
    "SyncBatchNorm",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "convert_sync_batchnorm",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "metric_average",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "synchronize",
    "warmup_factor",
]
