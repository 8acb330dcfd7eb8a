"""The value collectives of Horovod's Keras APIs (``hvd.allreduce(value)``, ...): any tensor-compatible
value in, a framework tensor out."""

from __future__ import annotations

from typing import Any, Optional

from hpcdl._keras.framework import Framework
from hpcdl.common.reduce_ops import Average


def allreduce(
    framework: Framework,
    value: Any,
    name: Optional[str],
    average: Optional[bool],
    prescale_factor: float,
    postscale_factor: float,
    op: Optional[int],
    compression: Any,
) -> Any:
    """Reduce a value over all ranks (default op Average)."""
    hvd = framework.hvd
    return hvd.allreduce(
        framework.tensor(value),
        average=average,
        name=name,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        compression=compression or hvd.Compression.none,
    )


def allgather(framework: Framework, value: Any, name: Optional[str]) -> Any:
    """Concatenate a value from every rank along its first dimension."""
    return framework.hvd.allgather(framework.tensor(value), name=name)


def broadcast(framework: Framework, value: Any, root_rank: int, name: Optional[str]) -> Any:
    """A value as it is on ``root_rank``."""
    return framework.hvd.broadcast(framework.tensor(value), root_rank, name=name)


def reducescatter(framework: Framework, value: Any, name: Optional[str], op: int = Average) -> Any:
    """Reduce a value over all ranks and keep this rank's block of its first dimension."""
    return framework.hvd.reducescatter(framework.tensor(value), name=name, op=op)
