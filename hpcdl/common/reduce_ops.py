"""Horovod's reduction op constants (``hvd.Average``, ``hvd.Sum``, ...) and the deprecated ``average=``,
shared by the framework APIs."""

from __future__ import annotations

import warnings
from typing import Optional

from hpcdl.common.types import ReduceOp

Average = int(ReduceOp.AVERAGE)
Sum = int(ReduceOp.SUM)
Min = int(ReduceOp.MIN)
Max = int(ReduceOp.MAX)
Product = int(ReduceOp.PRODUCT)
# Not a runtime op: a framework API computes Adasum itself (hpcdl.torch from an allgather) or refuses it.
Adasum = 16

_NAMES = {Average: "Average", Sum: "Sum", Min: "Min", Max: "Max", Product: "Product", Adasum: "Adasum"}


def resolve_op(op: Optional[int], average: Optional[bool]) -> int:
    """Horovod's rule: ``op`` wins; ``average=`` (deprecated) maps to Average/Sum; default Average."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return check_op(op)
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed in v1.0",
            DeprecationWarning,
            stacklevel=3,
        )
        return Average if average else Sum
    return Average


def check_op(op: int) -> int:
    if op not in _NAMES:
        raise ValueError(
            f"unknown reduction op {op!r}; "
            "use hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product or hvd.Adasum"
        )
    return int(op)


_RUNTIME_OPS = {int(o): o for o in ReduceOp}


def runtime_op(op: int) -> ReduceOp:
    """The runtime's enum for an op it implements (everything but Adasum). A table, not ``ReduceOp(op)``:
    it runs once per gradient, and the enum's constructor costs seven times a lookup."""
    try:
        return _RUNTIME_OPS[op]
    except KeyError:
        return ReduceOp(op)  # raises the enum's own error
