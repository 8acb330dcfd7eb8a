"""Rank program for test_security_objects.py: rank 0 tampers with what its object collectives put on the
wire, as something on the path between the ranks could, and rank 1 reports what became of it.

    python object_attack_checks.py FRAMEWORK MODE MARKER

FRAMEWORK: ``torch`` or ``tensorflow`` (each has its own object collectives). MODE: ``altered-broadcast``
(the payload of broadcast_object replaced by a pickle that would create MARKER), ``replayed-broadcast`` (the
second broadcast_object of a name gets the first's payload) or ``altered-allgather`` (rank 0's piece of
allgather_object replaced like the first). Rank 1 prints ``RESULT {"outcome": ..., "unpickled": n,
"marker": bool}``: what the tampered call returned or raised, how many times cloudpickle.loads ran in it,
and whether MARKER exists.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from typing import Any, Callable

import cloudpickle

FRAMEWORK, MODE, MARKER = sys.argv[1], sys.argv[2], sys.argv[3]
if FRAMEWORK == "torch":
    import hpcdl.torch as hvd
else:
    import hpcdl.tensorflow as hvd


class Planted:
    """Unpickling this creates MARKER: what a forged pickle could run on the ranks that receive it."""

    def __reduce__(self) -> tuple:
        return (os.mkdir, (MARKER,))


class Tamper:
    """What rank 0 does to the bytes of each payload (``name.t``) it sends."""

    def __init__(self) -> None:
        self.first: bytes | None = None

    def __call__(self, payload: bytes) -> bytes:
        if MODE == "replayed-broadcast":
            self.first = self.first or payload
            return self.first
        forged = pickle.dumps(Planted())
        assert len(forged) < len(payload)
        return forged + payload[len(forged) :]  # pickle ignores what follows its end


def tamper_torch(change: Callable[[bytes], bytes]) -> None:
    import torch

    import hpcdl.torch.functions as functions

    real_broadcast, real_allgather = functions.broadcast_, functions.allgather

    def altered(tensor: torch.Tensor, name: str) -> None:
        if name.endswith(".t"):
            tensor.copy_(torch.frombuffer(bytearray(change(tensor.numpy().tobytes())), dtype=torch.uint8))

    def broadcast(tensor: torch.Tensor, root: int, name: str, process_set: Any) -> Any:
        altered(tensor, name)
        return real_broadcast(tensor, root, name, process_set)

    def allgather(tensor: torch.Tensor, name: str, process_set: Any) -> Any:
        altered(tensor, name)
        return real_allgather(tensor, name=name, process_set=process_set)

    functions.broadcast_, functions.allgather = broadcast, allgather


def tamper_common(change: Callable[[bytes], bytes]) -> None:
    """hpcdl.tensorflow's object collectives are hpcdl.common.objects', over the engine's numpy calls."""
    import numpy as np

    from hpcdl.common import engine

    real_broadcast, real_allgather = engine.broadcast_async, engine.allgather_async

    def altered(array: np.ndarray, name: str | None) -> None:
        if name is not None and name.endswith(".t"):
            array[:] = np.frombuffer(change(array.tobytes()), dtype=np.uint8)

    def broadcast(array: np.ndarray, root: int = 0, name: str | None = None, process_set: int = 0) -> Any:
        altered(array, name)
        return real_broadcast(array, root, name, process_set)

    def allgather(array: np.ndarray, name: str | None = None, process_set: int = 0) -> Any:
        altered(array, name)
        return real_allgather(array, name, process_set)

    engine.broadcast_async, engine.allgather_async = broadcast, allgather


def count_unpickling() -> list[int]:
    calls = [0]
    real_loads = cloudpickle.loads

    def loads(data: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real_loads(data, *args, **kwargs)

    cloudpickle.loads = loads
    return calls


def main() -> None:
    hvd.init()
    if hvd.rank() == 0:
        (tamper_torch if FRAMEWORK == "torch" else tamper_common)(Tamper())
    if MODE == "replayed-broadcast":
        assert hvd.broadcast_object("a" * 1000, root_rank=0, name="state") == "a" * 1000
    calls = count_unpickling()
    try:
        if MODE == "altered-allgather":
            outcome: Any = hvd.allgather_object("x" * 1000)
        elif MODE == "altered-broadcast":
            outcome = hvd.broadcast_object("x" * 1000, root_rank=0)
        else:  # the second broadcast of the name, which rank 0 replaces by the first's payload
            outcome = hvd.broadcast_object("b" * 1000, root_rank=0, name="state")
        outcome = ["returned", repr(outcome)[:12]]
    except RuntimeError as exc:
        outcome = ["raised", type(exc).__name__, str(exc)]
    report = {"outcome": outcome, "unpickled": calls[0], "marker": os.path.exists(MARKER)}
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
