"""Horovod's reduction op constants in ``hpcdl.torch`` (``hvd.Average``, ``hvd.Sum``, ...) and the deprecated
``average=``: the framework-free definitions of :mod:`hpcdl.common.reduce_ops`. ``hpcdl.torch`` computes
``Adasum`` itself from an allgather (see ``_adasum.py``)."""

from __future__ import annotations

from hpcdl.common.reduce_ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    check_op,
    resolve_op,
    runtime_op,
)

__all__ = ["Adasum", "Average", "Max", "Min", "Product", "Sum", "check_op", "resolve_op", "runtime_op"]
