"""Python objects between ranks (Horovod's ``broadcast_object`` and ``allgather_object``) without a
framework: each object is serialized with cloudpickle into a uint8 array that goes through the engine,
its length first. The framework APIs' own functions check their arguments and come here."""

from __future__ import annotations

from typing import Any, Optional

import cloudpickle
import numpy as np

from hpcdl.common import basics, engine


def _payload(obj: Any) -> np.ndarray:
    """``obj`` serialized, in a writeable array (a broadcast's root buffer is also its output)."""
    return np.frombuffer(bytearray(cloudpickle.dumps(obj)), dtype=np.uint8)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: int = 0) -> Any:
    """Return ``root_rank``'s ``obj`` (``root_rank`` is a rank of the job, a member of the set) on every
    member of the process set. Other ranks may pass anything (e.g. None): the operations' names do not
    depend on the object."""
    name = name or "broadcast_object"
    is_root = basics.rank() == root_rank
    payload = _payload(obj) if is_root else np.zeros(0, dtype=np.uint8)
    length = np.array([payload.size], dtype=np.int64)
    engine.synchronize(engine.broadcast_async(length, root_rank, f"{name}.sz", process_set))
    buffer = payload if is_root else np.empty(int(length[0]), dtype=np.uint8)
    engine.synchronize(engine.broadcast_async(buffer, root_rank, f"{name}.t", process_set))
    return obj if is_root else cloudpickle.loads(buffer.tobytes())


def allgather_object(obj: Any, name: Optional[str] = None, process_set: int = 0) -> list[Any]:
    """Every member's ``obj``, in the set's rank order (objects may differ in type and size)."""
    name = name or "allgather_object"
    payload = _payload(obj)
    lengths = engine.allgather_async(np.array([payload.size], dtype=np.int64), f"{name}.sz", process_set)
    gathered = engine.synchronize(engine.allgather_async(payload, f"{name}.t", process_set))
    objects, start = [], 0
    for length in engine.synchronize(lengths).tolist():
        objects.append(cloudpickle.loads(gathered[start : start + length].tobytes()))
        start += length
    return objects
