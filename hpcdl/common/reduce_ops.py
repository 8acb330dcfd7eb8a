"""Horovod's reduction op constants (``hvd.Average``, ``hvd.Sum``, ...) and the deprecated ``average=``,
shared by the framework APIs."""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from typing import Any, Callable, Optional, TypeVar, Union

from hpcdl.common.types import ReduceOp

T = TypeVar("T")

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


def split_list(items: Sequence[T], parts: int) -> list[list[T]]:
    """Split ``items`` into ``parts`` contiguous pieces whose lengths differ by at most one."""
    d, r = divmod(len(items), parts)
    return [list(items[i * d + min(i, r) : (i + 1) * d + min(i + 1, r)]) for i in range(parts)]


def group_order(
    groups: Union[int, Sequence[Sequence[Any]], None],
    positions: Sequence[int],
    keys: Sequence[Hashable],
    key_of: Callable[[Any], Hashable],
) -> tuple[list[int], list[int]]:
    """Horovod's ``groups`` option of the distributed optimizers: in which order to submit the gradients at
    ``positions`` (whose variables have ``keys``), and the sizes of their consecutive atomic groups.

    None: each gradient alone. An int: that many contiguous groups. A list of lists of variables (mapped to
    keys by ``key_of``): those variables' gradients together, every other gradient alone.
    """
    if groups is None:
        return list(positions), [1] * len(positions)
    if isinstance(groups, int):
        pieces = [piece for piece in split_list(positions, groups) if piece]
    else:
        where = dict(zip(keys, positions))
        pieces, taken = [], set()
        for group in groups:
            members = [key_of(v) for v in group]
            piece = [where[k] for k in members if k in where and k not in taken]
            taken.update(members)
            if piece:
                pieces.append(piece)
        pieces += [[p] for p, k in zip(positions, keys) if k not in taken]
    return [p for piece in pieces for p in piece], [len(piece) for piece in pieces]
