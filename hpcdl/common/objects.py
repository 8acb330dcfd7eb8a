"""Python objects between ranks (Horovod's ``broadcast_object`` and ``allgather_object``) without a
framework: each object is serialized with cloudpickle and sealed with its MAC (:mod:`hpcdl.common.payloads`)
into a uint8 array that goes through the engine, its length first; receivers check the MAC before they
unpickle. The framework APIs' own functions check their arguments and come here."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from hpcdl.common import basics, engine, payloads


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: int = 0) -> Any:
    """Return ``root_rank``'s ``obj`` (``root_rank`` is a rank of the job, a member of the set) on every
    member of the process set. Other ranks may pass anything (e.g. None): the operations' names do not
    depend on the object."""
    name = name or "broadcast_object"
    operation = payloads.operation("broadcast_object", process_set, name)
    is_root = basics.rank() == root_rank
    if is_root:  # the root's buffer is also its output: writeable
        payload = np.frombuffer(operation.pickle(root_rank, obj), dtype=np.uint8)
    length = np.array([payload.size if is_root else 0], dtype=np.int64)
    engine.synchronize(engine.broadcast_async(length, root_rank, f"{name}.sz", process_set))
    if not is_root:
        payload = np.empty(operation.check_length(root_rank, int(length[0])), dtype=np.uint8)
    engine.synchronize(engine.broadcast_async(payload, root_rank, f"{name}.t", process_set))
    return obj if is_root else operation.unpickle(root_rank, payload)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: int = 0) -> list[Any]:
    """Every member's ``obj``, in the set's rank order (objects may differ in type and size); every piece
    is checked against its MAC before any is unpickled."""
    name = name or "allgather_object"
    operation = payloads.operation("allgather_object", process_set, name)
    payload = np.frombuffer(operation.pickle(basics.process_set_rank(process_set), obj), dtype=np.uint8)
    lengths = engine.allgather_async(np.array([payload.size], dtype=np.int64), f"{name}.sz", process_set)
    gathered = engine.synchronize(engine.allgather_async(payload, f"{name}.t", process_set))
    return operation.unpickle_pieces(engine.synchronize(lengths).tolist(), gathered)
