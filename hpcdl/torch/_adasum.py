"""Adasum (``op=hvd.Adasum``): adaptive summation of gradients (Maleki et al., 2020).

The runtime has no Adasum kernel, so every rank allgathers the flattened tensors through the engine and
combines them locally with the same binary tree Horovod uses (pairs (0,1), (2,3), ... then pairs of
pairs), so all ranks compute identical results:

    adasum(a, b) = (1 - a·b / (2|a|²)) a + (1 - a·b / (2|b|²)) b

with a coefficient of 1 for a vector whose squared norm is below 1e-8. The arithmetic runs in float64.
"""

from __future__ import annotations

from typing import Optional

import torch

from hpcdl import common
from hpcdl.common import engine
from hpcdl.common.types import OpType
from hpcdl.torch import _handles
from hpcdl.torch._tensors import buffer_of, tensor_from_output
from hpcdl.torch.process_sets import ProcessSet

_NORM_FLOOR = 1e-8


def combine_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    dot = torch.dot(a, b)
    a_norm_sq = torch.dot(a, a)
    b_norm_sq = torch.dot(b, b)
    a_coeff = 1.0 - dot / a_norm_sq * 0.5 if a_norm_sq >= _NORM_FLOOR else torch.ones((), dtype=a.dtype)
    b_coeff = 1.0 - dot / b_norm_sq * 0.5 if b_norm_sq >= _NORM_FLOOR else torch.ones((), dtype=a.dtype)
    return a_coeff * a + b_coeff * b


def combine(rows: torch.Tensor) -> torch.Tensor:
    """Adasum of the rows of a (ranks, elements) tensor, reduced as a binary tree in rank order."""
    vectors = [row.to(torch.float64) for row in rows]
    while len(vectors) > 1:
        vectors = [combine_pair(vectors[i], vectors[i + 1]) for i in range(0, len(vectors), 2)]
    return vectors[0]


def check_supported(process_set: ProcessSet) -> None:
    if process_set.process_set_id != 0:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    n = common.size()
    if n & (n - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")


def allreduce_launch(
    tensors: list[torch.Tensor], outputs: list[torch.Tensor], name: Optional[str], process_set: ProcessSet
) -> int:
    check_supported(process_set)
    for t in tensors:
        if not t.dtype.is_floating_point:
            raise ValueError(f"Adasum needs floating-point tensors, got {t.dtype}")
    handles, inputs = [], []
    for i, t in enumerate(tensors):
        flat = t.detach().to("cpu").reshape(1, -1).contiguous()
        inputs.append(flat)
        member = None if name is None else (name if len(tensors) == 1 else f"{name}.{i}")
        handles.append(engine.enqueue(OpType.ALLGATHER, buffer_of(flat), None, name=member))

    def finish() -> list[torch.Tensor]:
        results = []
        for h, t, out in zip(handles, tensors, outputs):
            rows = tensor_from_output(h, t.dtype)
            reduced = combine(rows).to(t.dtype).reshape(t.shape)
            with torch.no_grad():
                out.copy_(reduced)
            results.append(out)
        return results

    return _handles.register(handles, finish, keep_alive=(tensors, outputs, inputs))
