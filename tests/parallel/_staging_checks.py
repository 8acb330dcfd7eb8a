"""Rank program of the staging-store tests: collectives whose shared-memory pieces are large enough for
streaming stores (run with HPCDL_SHM_CHUNK_BYTES=65536), at sizes around chunk boundaries and from
misaligned buffers, checked exactly against NumPy. Prints ``RESULT {"failures": [...], "checks": N}``."""

from __future__ import annotations

import json
import traceback

import numpy as np

import hpcdl.common as hc
from hpcdl.common import ReduceOp, engine

failures: list[str] = []
checks = 0


def check(what: str, ok: bool) -> None:
    global checks
    checks += 1
    if not ok:
        failures.append(what)


def data(rank: int, count: int, salt: int, dtype: type = np.float32) -> np.ndarray:
    """Small integers, exact in float32 sums; each rank can rebuild every rank's data."""
    return ((np.arange(count, dtype=np.int64) * 7 + rank * 13 + salt) % 11 - 5).astype(dtype)


def misaligned(values: np.ndarray) -> np.ndarray:
    """A copy of `values` that starts 1 byte past a 64-byte boundary (so copies have ragged heads)."""
    raw = np.empty(values.nbytes + 65, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + 1
    view = raw[start : start + values.nbytes].view(values.dtype)
    view[:] = values
    return view


def everyone(n: int, count: int, salt: int, dtype: type = np.float32) -> list[np.ndarray]:
    return [data(q, count, salt, dtype) for q in range(n)]


def check_direct(n: int, r: int, count: int, salt: int) -> None:
    got = hc.allreduce(data(r, count, salt))
    check(f"allreduce {count}", np.array_equal(got, sum(everyone(n, count, salt))))
    got = hc.allreduce(misaligned(data(r, count, salt, np.int8)), op=ReduceOp.MAX)
    want = np.max(everyone(n, count, salt, np.int8), axis=0)
    check(f"allreduce int8 MAX misaligned {count}", np.array_equal(got, want))
    gathered = hc.allgather(misaligned(data(r, count + r, salt)))
    want = np.concatenate([data(q, count + q, salt) for q in range(n)])
    check(f"allgather {count}", np.array_equal(gathered, want))
    b = data(r, count, salt) if r == n - 1 else np.zeros(count, dtype=np.float32)
    check(f"broadcast {count}", np.array_equal(hc.broadcast(b, root=n - 1), data(n - 1, count, salt)))
    rows = np.arange(n * count, dtype=np.int32).reshape(n, count) + 1000 * r
    got, _ = hc.alltoall(rows)
    mine = np.arange(r * count, (r + 1) * count)
    check(f"alltoall {count}", np.array_equal(got, np.stack([mine + 1000 * q for q in range(n)])))
    got = hc.reducescatter(data(r, n * count, salt).reshape(n, count))
    want = sum(everyone(n, n * count, salt)).reshape(n, count)[r : r + 1]
    check(f"reducescatter {count}", np.array_equal(got, want))


def check_engine(n: int, r: int) -> None:
    # The engine fuses these into one segmented allreduce of about 5 MB: many full chunks, so under
    # HPCDL_SHM_STORES=auto the trials and switches run in the middle of it.
    shapes = [(1000 + 37 * i,) if i % 3 else (64, 311 + i) for i in range(60)]
    for step in range(4):
        tensors = [data(r, int(np.prod(s)), i + step).reshape(s) for i, s in enumerate(shapes)]
        handles = [
            engine.allreduce_async(t, name=f"t{i}", op=ReduceOp.SUM, out=t) for i, t in enumerate(tensors)
        ]
        for h in handles:
            h.wait()
        wants = [sum(everyone(n, t.size, i + step)).reshape(t.shape) for i, t in enumerate(tensors)]
        ok = all(np.array_equal(t, want) for t, want in zip(tensors, wants))
        check(f"engine step {step}", ok)


def check_large_results(n: int, r: int) -> None:
    """An allreduce of 32 MiB and more writes an out-of-place result with streaming stores (an in-place one
    stays cached): a fresh output, an ``out=`` starting 1 byte past a cache line, in place, and an engine
    batch where such a tensor is one segment and small ones reduce in the fusion buffer."""
    count = (32 << 20) // 4 + 4099
    want = sum(everyone(n, count, 40))
    check("allreduce 32 MiB out of place", np.array_equal(hc.allreduce(data(r, count, 40)), want))
    out = misaligned(np.zeros(count, dtype=np.float32))
    hc.allreduce(data(r, count, 40), out=out)
    check("allreduce 32 MiB into a misaligned out", np.array_equal(out, want))
    mine = data(r, count, 40)
    check("allreduce 32 MiB in place", np.array_equal(hc.allreduce(mine, out=mine), want))
    sizes = [(33 << 20) // 4 + 3, 1000, (1 << 20) // 4 + 11, 77, 5000]
    tensors = [data(r, size, 50 + i) for i, size in enumerate(sizes)]
    handles = [engine.allreduce_async(t, name=f"large{i}", op=ReduceOp.SUM) for i, t in enumerate(tensors)]
    got = [engine.synchronize(h) for h in handles]
    wants = [sum(everyone(n, size, 50 + i)) for i, size in enumerate(sizes)]
    check("engine batch with a 33 MiB tensor", all(np.array_equal(g, w) for g, w in zip(got, wants)))


def main() -> None:
    hc.init(timeout=60)
    n, r = hc.size(), hc.rank()
    chunk = 65536 // 4  # float32 elements per staging chunk
    for salt, count in enumerate([chunk - 1, chunk, 3 * chunk + 5, 40 * chunk + 17]):
        check_direct(n, r, count, salt)
    check_engine(n, r)
    check_large_results(n, r)
    hc.shutdown()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        failures.append(traceback.format_exc())
    print("RESULT " + json.dumps({"failures": failures, "checks": checks}), flush=True)
