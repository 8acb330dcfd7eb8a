"""Rank program of tests/parallel/test_overlapping_buffers.py: collectives whose output overlaps the input
other than in place, through hpcdl.common, the engine and the C ABI. Each case prints ``CASE name outcome``:
``refused`` (the call raised, naming the overlap), ``right`` or ``wrong`` (what the output holds)."""

from __future__ import annotations

import ctypes
from functools import partial
from typing import Callable

import numpy as np

import hpcdl.common as hc
from hpcdl.common import engine, library
from hpcdl.common.types import DType

SUM = hc.ReduceOp.SUM
FLOAT32 = int(DType.FLOAT32)


def ran(call: Callable[[], object]) -> bool:
    """Whether the call ran; False when it was refused for the overlap."""
    try:
        call()
    except hc.HpcdlError as error:
        assert "overlaps the input buffer" in str(error), error
        return False
    return True


def show(name: str, call: Callable[[], object], right: Callable[[], bool]) -> None:
    outcome = ("right" if right() else "wrong") if ran(call) else "refused"
    print("CASE", name, outcome, flush=True)


def engine_allreduce(a: np.ndarray, name: str, out: np.ndarray) -> None:
    engine.allreduce_async(a, name=name, op=SUM, out=out).wait()


def c_allgather(send: np.ndarray, recv: np.ndarray) -> None:
    lib = library.load()
    library.check(lib.hpcdl_allgather(send.ctypes.data, send.size, recv.ctypes.data, None, FLOAT32, 0))


def c_alltoall(send: np.ndarray, recv: np.ndarray, size: int) -> None:
    counts = (ctypes.c_int64 * size)(*([send.size // size] * size))
    lib = library.load()
    library.check(lib.hpcdl_alltoall(send.ctypes.data, counts, recv.ctypes.data, counts, FLOAT32, 0))


def gathered_right(out: np.ndarray, count: int, size: int) -> bool:
    return all(np.array_equal(out[q * count : (q + 1) * count], np.arange(count) + q) for q in range(size))


def main() -> None:
    hc.init()
    rank, size = hc.rank(), hc.size()
    for count in (10, 300_000):  # the exchange and the chunked paths
        mine = np.arange(count, dtype=np.float32) + rank
        want = sum(np.arange(count, dtype=np.float32) + q for q in range(size))
        for shift in (1, -1, count // 2):
            buf = np.zeros(3 * count, np.float32)
            src, out = buf[count : 2 * count], buf[count + shift : 2 * count + shift]
            for api, call in (
                ("allreduce", partial(hc.allreduce, src, op=SUM, out=out)),
                ("engine", partial(engine_allreduce, src, f"e{count}.{shift}", out)),
            ):
                src[:] = mine
                show(f"{api}.{count}.{shift}", call, partial(np.array_equal, out, want))
        inplace = mine.copy()
        show(
            f"allreduce.{count}.inplace",
            partial(hc.allreduce, inplace, op=SUM, out=inplace),
            partial(np.array_equal, inplace, want),
        )
        apart = np.empty_like(mine)
        show(
            f"engine.{count}.apart",
            partial(engine_allreduce, mine, f"a{count}", apart),
            partial(np.array_equal, apart, want),
        )
        # allgather: the input one element past this rank's place in the output, then exactly there
        shifted = np.zeros(size * count + 1, np.float32)
        at = shifted[rank * count + 1 : rank * count + 1 + count]
        at[:] = mine
        show(
            f"allgather.{count}.shifted",
            partial(c_allgather, at, shifted),
            partial(gathered_right, shifted, count, size),
        )
        gathered = np.zeros(size * count, np.float32)
        own = gathered[rank * count : (rank + 1) * count]
        own[:] = mine
        show(
            f"allgather.{count}.inplace",
            partial(c_allgather, own, gathered),
            partial(gathered_right, gathered, count, size),
        )
        both = np.zeros(size * count + 1, np.float32)
        both[: size * count] = np.tile(mine, size)
        show(
            f"alltoall.{count}.shifted",
            partial(c_alltoall, both[: size * count], both[1:], size),
            partial(bool, False),
        )
    hc.shutdown()


if __name__ == "__main__":
    main()
