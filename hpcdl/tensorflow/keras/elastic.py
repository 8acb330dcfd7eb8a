"""``horovod.tensorflow.keras.elastic``: the elastic state, callbacks and ``run`` of ``hpcdl.keras``."""

from __future__ import annotations

from hpcdl.keras.elastic import (
    CommitStateCallback,
    KerasState,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
    run,
)

__all__ = [
    "CommitStateCallback",
    "KerasState",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]
