"""Rank program of tests/parallel/test_offered_outputs.py: engine allgathers and alltoalls submitted with an
offered output (c_api.h), whose result fits it or not, an offer that overlaps the input, and hpcdl.torch's
allgather and alltoall. Each case prints ``CASE name where value``: where the result lies (``offered`` or
``copied``: in the engine's own buffer) and whether it is ``right``; a refused offer prints ``refused``."""

from __future__ import annotations

import numpy as np
import torch

import hpcdl.common as hc
import hpcdl.torch as hvd
from hpcdl.common import engine
from hpcdl.common.types import DType, OpType
from hpcdl.torch import _tensors, async_ops


def submit(
    op: OpType, name: str, a: np.ndarray, offered: np.ndarray, splits: list[int] | None = None
) -> tuple[str, np.ndarray]:
    """Runs the operation; where its result lies and whether it is what NumPy says it should be."""
    handle = engine.submit(
        op, name, 0, DType.FLOAT32, a.ctypes.data, offered.ctypes.data, a.shape, splits=splits
    )
    try:
        handle.wait()
        address, _, shape = handle.output_bytes()
        got = handle.output().view(np.float32).reshape(shape)
        return ("offered" if address == offered.ctypes.data else "copied"), got
    finally:
        handle.release()


def rows_of(rank: int, count: int) -> np.ndarray:
    return (np.arange(count, dtype=np.float32) + 1000 * rank).reshape(count, 1)


def main() -> None:
    hvd.init()
    rank, size = hc.rank(), hc.size()
    for count in (8, 300_000):  # the one-step exchange and the chunked paths
        mine = rows_of(rank, count)
        where, got = submit(OpType.ALLGATHER, f"g{count}", mine, np.zeros((size * count, 1), np.float32))
        want = np.concatenate([rows_of(q, count) for q in range(size)])
        print("CASE", f"allgather.equal.{count}", where, "right" if np.array_equal(got, want) else "wrong")
        # every rank a different number of rows (count + rank^2): no rank's offer has the result's size
        theirs = rows_of(rank, count + rank * rank)
        offer = np.zeros((size * (count + rank * rank), 1), np.float32)
        where, got = submit(OpType.ALLGATHER, f"u{count}", theirs, offer)
        want = np.concatenate([rows_of(q, count + q * q) for q in range(size)])
        print("CASE", f"allgather.unequal.{count}", where, "right" if np.array_equal(got, want) else "wrong")
        send = np.arange(size * count, dtype=np.float32).reshape(size * count, 1) + 1000 * rank
        where, got = submit(OpType.ALLTOALL, f"t{count}", send, np.zeros_like(send))
        want = np.concatenate([np.arange(rank * count, (rank + 1) * count) + 1000 * q for q in range(size)])
        print(
            "CASE", f"alltoall.even.{count}", where, "right" if np.array_equal(got.ravel(), want) else "wrong"
        )
        # rank 0 sends everything to the last rank: nobody receives as many rows as it sends (2 ranks and up)
        splits = [0] * (size - 1) + [size * count] if rank == 0 else [count] * size
        where, got = submit(OpType.ALLTOALL, f"s{count}", send, np.zeros_like(send), splits)
        sent = [[0] * (size - 1) + [size * count]] + [[count] * size] * (size - 1)
        starts = [sum(sent[q][:rank]) for q in range(size)]
        want = np.concatenate(
            [np.arange(starts[q], starts[q] + sent[q][rank]) + 1000 * q for q in range(size)]
        ).astype(np.float32)
        print(
            "CASE",
            f"alltoall.uneven.{count}",
            where,
            "right" if np.array_equal(got.ravel(), want) else "wrong",
        )
        overlapping = np.zeros((size * count + count, 1), np.float32)
        try:
            submit(
                OpType.ALLGATHER, f"o{count}", overlapping[:count], overlapping[count // 2 :][: size * count]
            )
            print("CASE", f"allgather.overlapping.{count}", "accepted", "wrong")
        except hc.HpcdlError as error:
            print(
                "CASE",
                f"allgather.overlapping.{count}",
                "refused",
                "right" if "cannot run in place" in str(error) else "wrong",
            )
    # the engine's NumPy helpers: from engine.OFFER_FROM_BYTES on, the result is the array they offered when
    # it fits, else a copy; a smaller one is always copied out
    offers: list[int] = []
    offer = engine._offer

    def remember_offer(a: np.ndarray, rows: int) -> np.ndarray:
        result = offer(a, rows)
        offers.append(result.ctypes.data)
        return result

    engine._offer = remember_offer  # type: ignore[assignment]
    n = engine.OFFER_FROM_BYTES // 4  # rows of one float32: the smallest input that offers
    cases = (("equal", n, 0), ("unequal", n, 1), ("small", 4, 0))  # unequal: no rank's offer fits
    for case, rows, step in cases:
        got = engine.synchronize(engine.allgather_async(rows_of(rank, rows + step * rank * rank), name=case))
        want = np.concatenate([rows_of(q, rows + step * q * q) for q in range(size)])
        where = "offered" if got.ctypes.data in offers else "copied"
        print("CASE", f"allgather.{case}.numpy", where, "right" if np.array_equal(got, want) else "wrong")
    send = np.arange(size * n, dtype=np.float32).reshape(size * n, 1) + 1000 * rank
    sent = [[0] * (size - 1) + [size * n]] + [[n] * size] * (size - 1)  # rank 0 sends everything to the last
    for case, splits in (("even", None), ("uneven", sent[rank])):
        handle = engine.alltoall_async(send, splits=splits, name=f"numpy.{case}")
        got = engine.synchronize(handle)
        received = handle.received_splits()
        handle.release()
        by = sent if case == "uneven" else [[n] * size] * size  # by[q][r]: rows q sends to r
        want = np.concatenate(
            [np.arange(sum(by[q][:rank]), sum(by[q][: rank + 1])) + 1000 * q for q in range(size)]
        ).astype(np.float32)
        right = np.array_equal(got.ravel(), want) and received == [by[q][rank] for q in range(size)]
        where = "offered" if got.ctypes.data in offers else "copied"
        print("CASE", f"alltoall.{case}.numpy", where, "right" if right else "wrong")
    engine._offer = offer  # type: ignore[assignment]
    # hpcdl.torch: the result is the output it offered (no copy) when every rank has its rows
    offered: list[int] = []
    new_result = _tensors.new_result

    def remember(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        result = new_result(shape, dtype)
        offered.append(result.data_ptr())
        return result

    async_ops.new_result = remember  # type: ignore[assignment]
    t = torch.arange(2 * 1_200_000, dtype=torch.float32).reshape(-1, 2) + rank
    gathered = hvd.allgather(t, name="torch.allgather")
    want = torch.cat(
        [torch.arange(2 * 1_200_000, dtype=torch.float32).reshape(-1, 2) + q for q in range(size)]
    )
    where = "offered" if gathered.data_ptr() in offered else "copied"
    print("CASE", "torch.allgather", where, "right" if torch.equal(gathered, want) else "wrong")
    exchanged = hvd.alltoall(t, name="torch.alltoall")
    where = "offered" if exchanged.data_ptr() in offered else "copied"
    part = t.shape[0] // size
    want = torch.cat([t[rank * part : (rank + 1) * part] - rank + q for q in range(size)])
    print("CASE", "torch.alltoall", where, "right" if torch.equal(exchanged, want) else "wrong")
    hvd.shutdown()


if __name__ == "__main__":
    main()
