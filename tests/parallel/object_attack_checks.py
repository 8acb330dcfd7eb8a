"""Rank program for test_security_objects.py: rank 0 tampers with what its object collectives put on the
wire, as something on the path between the ranks could, and rank 1 reports what became of it.

    python object_attack_checks.py MODE MARKER

MODE: ``altered-broadcast`` (the payload of broadcast_object replaced by a pickle that would create MARKER),
``replayed-broadcast`` (the second broadcast_object of a name gets the first's payload) or
``altered-allgather`` (rank 0's piece of allgather_object replaced like the first). Rank 1 prints
``RESULT {"outcome": ..., "unpickled": n, "marker": bool}``: what the tampered call returned or raised, how
many times cloudpickle.loads ran in it, and whether MARKER exists.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from typing import Any

import cloudpickle
import torch

import hpcdl.torch as hvd
import hpcdl.torch.functions as functions

MODE, MARKER = sys.argv[1], sys.argv[2]


class Planted:
    """Unpickling this creates MARKER: what a forged pickle could run on the ranks that receive it."""

    def __reduce__(self) -> tuple:
        return (os.mkdir, (MARKER,))


def plant(payload: torch.Tensor) -> None:
    forged = pickle.dumps(Planted())
    assert len(forged) < payload.numel()
    payload[: len(forged)] = torch.frombuffer(bytearray(forged), dtype=torch.uint8)  # the rest is ignored


def tamper_on_rank_zero() -> None:
    sent: list[torch.Tensor] = []
    real_broadcast, real_allgather = functions.broadcast_, functions.allgather

    def broadcast(tensor: torch.Tensor, root: int, name: str, process_set: Any) -> Any:
        if name.endswith(".t"):
            if MODE == "altered-broadcast":
                plant(tensor)
            elif MODE == "replayed-broadcast":
                sent.append(tensor.clone())
                tensor.copy_(sent[0])
        return real_broadcast(tensor, root, name, process_set)

    def allgather(tensor: torch.Tensor, name: str, process_set: Any) -> Any:
        if name.endswith(".t"):
            plant(tensor)
        return real_allgather(tensor, name=name, process_set=process_set)

    functions.broadcast_ = broadcast
    functions.allgather = allgather


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
        tamper_on_rank_zero()
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
    except hvd.HpcdlError as exc:
        outcome = ["raised", type(exc).__name__, str(exc)]
    report = {"outcome": outcome, "unpickled": calls[0], "marker": os.path.exists(MARKER)}
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
