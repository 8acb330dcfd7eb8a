"""Preemption-proof training: one call in the training script, for every framework API.

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
    hpcdl.checkpoint.run(train, state, path="/scratch/me/run1")

``train(state)`` calls ``state.commit()`` at its commit points (every step, or every N). When the
scheduler's warning signal (Slurm ``--signal``, SIGTERM of a preemption...) reaches any rank, every rank
stops at the same commit, the committed state is written atomically (the previous checkpoint stays until
the new one is complete), rank 0 requeues the job, and the next run resumes from that step on every rank,
an ``ElasticSampler``'s position included. See :func:`run` and README "Preemption-proof training".
"""

from __future__ import annotations

from hpcdl.checkpoint import contract
from hpcdl.checkpoint.errors import CheckpointError
from hpcdl.checkpoint.loop import preemptible, run
from hpcdl.checkpoint.protocol import Shard, load
from hpcdl.checkpoint.random_state import RandomState
from hpcdl.checkpoint.store import CheckpointStore, Manifest
from hpcdl.common.elastic_state import PreemptionInterrupt, request_stop

__all__ = [
    "CheckpointError",
    "CheckpointStore",
    "Manifest",
    "PreemptionInterrupt",
    "RandomState",
    "Shard",
    "contract",
    "load",
    "preemptible",
    "request_stop",
    "run",
]
