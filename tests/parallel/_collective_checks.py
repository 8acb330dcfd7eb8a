"""Rank program of the collective tests: every op x dtype x shape, checked against NumPy on each rank.

Each rank can rebuild every other rank's input (inputs depend only on rank and a salt), so it computes
the expected result itself. Prints ``RESULT {"failures": [...], ...}``; the test asserts it is empty.
"""

from __future__ import annotations

import faulthandler
import json
import sys
import traceback

import numpy as np

import hpcdl.common as hc
from hpcdl.common import DType, ReduceOp

DTYPES = list(DType)
OPS = list(ReduceOp)
NUMPY = {
    DType.UINT8: np.uint8,
    DType.INT8: np.int8,
    DType.INT16: np.int16,
    DType.INT32: np.int32,
    DType.INT64: np.int64,
    DType.FLOAT16: np.float16,
    DType.BFLOAT16: np.uint16,  # bfloat16 travels as its bit pattern
    DType.FLOAT32: np.float32,
    DType.FLOAT64: np.float64,
    DType.BOOL: np.bool_,
}
faulthandler.enable()
TOLERANCE = {DType.FLOAT16: 2e-3, DType.BFLOAT16: 1.6e-2, DType.FLOAT32: 1e-6, DType.FLOAT64: 1e-12}
failures: list[str] = []
checks = 0


def to_bf16(values: np.ndarray) -> np.ndarray:
    bits = values.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def values(dtype: DType, shape: tuple[int, ...], rank: int, salt: int) -> np.ndarray:
    """Small integers in [-3, 3] (exact in every dtype), as the dtype's storage array."""
    count = int(np.prod(shape, dtype=np.int64))
    raw = (np.arange(count, dtype=np.int64) * 7 + rank * 13 + salt * 5) % 7 - 3
    if dtype == DType.BOOL:
        return (raw > 0).reshape(shape)
    if dtype == DType.UINT8:
        raw = raw + 3
    if dtype == DType.BFLOAT16:
        return to_bf16(raw.astype(np.float32)).reshape(shape)
    return raw.astype(NUMPY[dtype]).reshape(shape)


def as_float(dtype: DType, a: np.ndarray) -> np.ndarray:
    return from_bf16(a).astype(np.float64) if dtype == DType.BFLOAT16 else a.astype(np.float64)


def expected_reduce(
    dtype: DType, op: ReduceOp, inputs: list[np.ndarray], pre: float, post: float
) -> np.ndarray:
    n = len(inputs)
    if dtype == DType.BOOL:
        stack = np.stack(inputs)
        return stack.any(axis=0) if op in (ReduceOp.SUM, ReduceOp.MAX) else stack.all(axis=0)
    is_int = dtype not in TOLERANCE
    if is_int and pre == 1.0 and post == 1.0:
        stack = np.stack(inputs)  # wrapping arithmetic in the dtype, like the runtime
        if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
            total = np.sum(stack, axis=0, dtype=stack.dtype)
            if op == ReduceOp.AVERAGE:
                wide = total.astype(np.int64)
                total = (np.sign(wide) * (np.abs(wide) // n)).astype(stack.dtype)
            return total
        if op == ReduceOp.MIN:
            return stack.min(axis=0)
        if op == ReduceOp.MAX:
            return stack.max(axis=0)
        return np.prod(stack, axis=0, dtype=stack.dtype)
    stack = np.stack([as_float(dtype, x) * pre for x in inputs])
    if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        out = stack.sum(axis=0)
        if op == ReduceOp.AVERAGE:
            out = np.trunc(out / n) if is_int else out / n
    elif op == ReduceOp.MIN:
        out = stack.min(axis=0)
    elif op == ReduceOp.MAX:
        out = stack.max(axis=0)
    else:
        out = stack.prod(axis=0)
    out = out * post
    if is_int:
        return np.trunc(out).astype(np.int64).astype(NUMPY[dtype])
    return out


def same(dtype: DType, got: np.ndarray, want: np.ndarray) -> bool:
    if got.shape != want.shape:
        return False
    if dtype in TOLERANCE:
        return np.allclose(as_float(dtype, got), want.astype(np.float64), rtol=TOLERANCE[dtype], atol=1e-6)
    return np.array_equal(got, want)


def check(label: str, ok: bool, detail: str = "") -> None:
    global checks
    checks += 1
    if not ok and len(failures) < 50:
        failures.append(f"rank {hc.rank()}: {label} {detail}".strip())


def expect_error(label: str, error: type, fn) -> None:
    try:
        fn()
    except error as exc:
        check(label, True)
        return str(exc)
    except Exception as exc:
        check(label, False, f"raised {type(exc).__name__}: {exc}")
        return None
    check(label, False, f"did not raise {error.__name__}")
    return None


def run_allreduce(n: int, r: int, counts: list[int]) -> None:
    salt = 0
    for dtype in DTYPES:
        for op in OPS:
            if dtype == DType.BOOL and op == ReduceOp.AVERAGE:
                x = values(dtype, (3,), r, 0)
                expect_error("bool average", hc.HpcdlError, lambda x=x, op=op: hc.allreduce(x, op=op))
                continue
            scales = [(1.0, 1.0)] if dtype == DType.BOOL else [(1.0, 1.0), (0.5, 4.0)]
            for count in counts:
                for pre, post in scales:
                    salt += 1
                    inputs = [values(dtype, (count,), q, salt) for q in range(n)]
                    want = expected_reduce(dtype, op, inputs, pre, post)
                    mine = inputs[r].copy()
                    got = hc.allreduce(mine, op=op, prescale=pre, postscale=post, dtype=dtype)
                    check(
                        f"allreduce {dtype.name} {op.name} n={count} pre={pre}",
                        same(dtype, got, want),
                        f"got {got[:6]} want {want[:6]}",
                    )
                    check("allreduce leaves its input alone", np.array_equal(mine, inputs[r]))
                    if count and pre == 1.0:  # in place
                        hc.allreduce(mine, op=op, out=mine, dtype=dtype)
                        check(f"allreduce in place {dtype.name} {op.name} n={count}", same(dtype, mine, want))


RING_PIECE_BYTES = 8 << 20  # kRingPieceBytes: a ring allreduce larger than this runs piece by piece


def run_ring_pieces(n: int, r: int) -> None:
    """Allreduces over several ring pieces, scaled and averaged: a last piece of one element (fewer than
    the ranks: some of its ring's segments are empty) and one of a few."""
    for dtype, count in (
        (DType.FLOAT32, 2 * RING_PIECE_BYTES // 4 + 1),
        (DType.FLOAT64, RING_PIECE_BYTES // 8 + n + 3),
    ):
        inputs = [values(dtype, (count,), q, 7) for q in range(n)]
        want = expected_reduce(dtype, ReduceOp.AVERAGE, inputs, 0.5, 4.0)
        got = hc.allreduce(inputs[r].copy(), op=ReduceOp.AVERAGE, prescale=0.5, postscale=4.0, dtype=dtype)
        label = f"allreduce over ring pieces {dtype.name} n={count}"
        check(label, same(dtype, got, want), f"{got[-3:]} {want[-3:]}")


def run_scaled_floats_exact(n: int, r: int) -> None:
    """Float averages and postscaled reductions, bit for bit: on one host every part is reduced in rank
    order, then divided by n once (as t / n rounds; a power-of-2 n multiplies by the exact 1/n) or
    multiplied by the postscale, in the tensor's own type. Inputs with fractional parts make each rounding
    show; sizes cover the one-step path and the chunked one."""
    for dtype, kind in ((DType.FLOAT32, np.float32), (DType.FLOAT64, np.float64)):
        for count in (7, 300_003):
            inputs = [np.random.default_rng(1000 + q).standard_normal(count).astype(kind) for q in range(n)]
            for op, post in (
                (ReduceOp.AVERAGE, 1.0),
                (ReduceOp.AVERAGE, 0.3),
                (ReduceOp.SUM, 0.3),
                (ReduceOp.MAX, 2.5),
            ):
                total = inputs[0].copy()
                for x in inputs[1:]:
                    total = np.maximum(total, x) if op == ReduceOp.MAX else total + x
                if op == ReduceOp.AVERAGE and post == 1.0 and n & (n - 1):
                    want = total / kind(n)
                else:
                    want = total * kind(post / n if op == ReduceOp.AVERAGE else post)
                got = hc.allreduce(inputs[r].copy(), op=op, postscale=post, dtype=dtype)
                label = f"{op.name} postscale={post} {dtype.name} n={count} bit for bit"
                check(label, np.array_equal(got, want), f"max difference {np.abs(got - want).max()}")
                mine = inputs[r].copy()
                hc.allreduce(mine, op=op, postscale=post, out=mine, dtype=dtype)
                check(label + " in place", np.array_equal(mine, want))


def run_allgather(n: int, r: int) -> None:
    for dtype in DTYPES:
        for rows in (lambda q: q + 1, lambda q: 0 if q == 0 else 2 * q, lambda q: 0, lambda q: 2):
            shapes = [(rows(q), 3) for q in range(n)]
            inputs = [values(dtype, shapes[q], q, 7) for q in range(n)]
            got = hc.allgather(inputs[r], dtype=dtype)
            want = np.concatenate(inputs)
            check(f"allgather {dtype.name} rows={[s[0] for s in shapes]}", np.array_equal(got, want))


def run_allgather_in_place(n: int, r: int) -> None:
    """The C call with this rank's block already in place in the output (send = its slice of recv), as MPI's
    MPI_IN_PLACE allgather has it, and with the output apart from the input; uneven blocks, several chunks."""
    import ctypes

    from hpcdl.common import library

    lib = library.load()
    rows = [300_000 + 7 * q for q in range(n)]
    blocks = [values(DType.FLOAT32, (rows[q],), q, 11) for q in range(n)]
    want = np.concatenate(blocks)
    counts = (ctypes.c_int64 * n)(*rows)
    start = sum(rows[:r])
    out = np.zeros(sum(rows), np.float32)
    out[start : start + rows[r]] = blocks[r]
    send = out.ctypes.data + start * 4
    code = lib.hpcdl_allgather(send, rows[r], out.ctypes.data, counts, int(DType.FLOAT32), 0)
    check("allgather in place", code == 0 and np.array_equal(out, want), f"code {code}")
    apart = np.zeros(sum(rows), np.float32)
    mine = blocks[r].copy()
    code = lib.hpcdl_allgather(mine.ctypes.data, rows[r], apart.ctypes.data, counts, int(DType.FLOAT32), 0)
    check("allgather apart", code == 0 and np.array_equal(apart, want), f"code {code}")


def run_broadcast(n: int, r: int) -> None:
    for dtype in DTYPES:
        for count in (0, 1, 1001):
            for root in range(n):
                buf = values(dtype, (count,), r, root)
                hc.broadcast(buf, root=root, dtype=dtype)
                check(
                    f"broadcast {dtype.name} n={count} root={root}",
                    np.array_equal(buf, values(dtype, (count,), root, root)),
                )


def run_alltoall(n: int, r: int) -> None:
    for dtype in DTYPES:
        splits_of = [[(q + j) % 3 for j in range(n)] for q in range(n)]
        inputs = [values(dtype, (sum(splits_of[q]), 2), q, 3) for q in range(n)]
        got, received = hc.alltoall(inputs[r], splits=splits_of[r], dtype=dtype)
        pieces = []
        for q in range(n):
            start = sum(splits_of[q][:r])
            pieces.append(inputs[q][start : start + splits_of[q][r]])
        check(f"alltoall {dtype.name}", np.array_equal(got, np.concatenate(pieces)), f"{got} vs {pieces}")
        check(f"alltoall splits {dtype.name}", received == [splits_of[q][r] for q in range(n)])


def run_reducescatter(n: int, r: int) -> None:
    for dtype in DTYPES:
        for op in OPS:
            if dtype == DType.BOOL and op == ReduceOp.AVERAGE:
                continue
            for rows in (2 * n + 1, n - 1 if n > 1 else 0, 37):
                inputs = [values(dtype, (rows, 3), q, rows) for q in range(n)]
                want_all = expected_reduce(dtype, op, inputs, 1.0, 1.0)
                per = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
                start = sum(per[:r])
                got = hc.reducescatter(inputs[r], op=op, dtype=dtype)
                check(
                    f"reducescatter {dtype.name} {op.name} rows={rows}",
                    same(dtype, got, want_all[start : start + per[r]]),
                )


def run_process_sets(n: int, r: int) -> None:
    if n < 3:
        return
    members = list(range(0, n, 2))
    ps = hc.add_process_set(members)
    check("process set ids", ps in hc.process_set_ids())
    check("process set ranks", hc.process_set_ranks(ps) == members)
    if r in members:
        check("process set rank", hc.process_set_rank(ps) == members.index(r))
        x = np.full(5, r, dtype=np.int32)
        got = hc.allreduce(x, process_set=ps)
        check("allreduce on a process set", (got == sum(members)).all(), str(got))
        y = np.full(2, r, dtype=np.float64)
        hc.broadcast(y, root=len(members) - 1, process_set=ps)
        check("broadcast on a process set", (y == members[-1]).all())
    else:
        check("process set rank of a non-member", hc.process_set_rank(ps) == -1)
        expect_error("non-member op", hc.HpcdlError, lambda: hc.allreduce(np.ones(2), process_set=ps))
    hc.remove_process_set(ps)
    check("process set removed", ps not in hc.process_set_ids())


def run_half_precision(n: int, r: int) -> None:
    """float16/bfloat16 are accumulated in float32: 2048 + 1 + 1 is 2050, not 2048 as in float16 steps."""
    if n != 3:
        return
    x = np.array([2048.0 if r == 0 else 1.0] * 4, dtype=np.float16)
    got = hc.allreduce(x)
    check("float16 sums in float32", (got == 2050).all(), str(got))
    b = to_bf16(np.array([256.0 if r == 0 else 1.0] * 4, dtype=np.float32))
    got_b = from_bf16(hc.allreduce(b, dtype=DType.BFLOAT16))
    check("bfloat16 sums in float32", (got_b == 258).all(), str(got_b))


def run_mismatch(n: int, r: int) -> None:
    if n < 2:
        return
    msg = expect_error(
        "mismatched sizes", hc.HpcdlMismatchError, lambda: hc.allreduce(np.ones(4 + r, np.float32))
    )
    check("mismatch names the ranks", bool(msg) and "rank 0" in msg and "rank 1" in msg, str(msg))
    expect_error(
        "mismatched dtypes",
        hc.HpcdlMismatchError,
        lambda: hc.allreduce(np.ones(4, np.float32 if r else np.float64)),
    )
    expect_error(
        "mismatched ops",
        hc.HpcdlMismatchError,
        lambda: hc.allreduce(np.ones(4), op=ReduceOp.MIN if r else ReduceOp.MAX),
    )
    expect_error("mismatched roots", hc.HpcdlMismatchError, lambda: hc.broadcast(np.ones(3), root=r % 2))
    msg = expect_error(
        "allgather of mismatched trailing dimensions",
        hc.HpcdlMismatchError,
        lambda: hc.allgather(np.ones((2, 3 if r == 0 else 4), np.float32)),
    )
    check("the allgather mismatch names the shapes", bool(msg) and "rank 0: (2, 3)" in str(msg), str(msg))
    expect_error(
        "mismatched collectives",
        hc.HpcdlMismatchError,
        lambda: hc.barrier() if r == 0 else hc.allreduce(np.ones(1)),
    )
    got = hc.allreduce(np.ones(3, np.float32))  # the communicator still works afterwards
    check("allreduce after mismatches", (got == n).all())


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "full"
    hc.init(timeout=30)
    n, r = hc.size(), hc.rank()
    try:
        counts = [0, 1, 7, 1000] if mode == "full" else [0, 5, 1000]
        run_allreduce(n, r, counts)
        big = values(DType.FLOAT32, (300_001,), r, 1)
        want = expected_reduce(
            DType.FLOAT32, ReduceOp.SUM, [values(DType.FLOAT32, (300_001,), q, 1) for q in range(n)], 1, 1
        )
        check("allreduce 1.2 MB float32", same(DType.FLOAT32, hc.allreduce(big), want))
        run_ring_pieces(n, r)
        if hc.local_size() == n and hc.transport_name(True) in ("shm", "self"):  # rings add in another order
            run_scaled_floats_exact(n, r)
        run_allgather(n, r)
        run_allgather_in_place(n, r)
        run_broadcast(n, r)
        run_alltoall(n, r)
        run_reducescatter(n, r)
        run_process_sets(n, r)
        run_half_precision(n, r)
        run_mismatch(n, r)
        hc.barrier()
    except Exception:
        failures.append(f"rank {r}: " + traceback.format_exc())
    info = {
        "failures": failures,
        "checks": checks,
        "rank": r,
        "size": n,
        "local_rank": hc.local_rank(),
        "local_size": hc.local_size(),
        "cross_rank": hc.cross_rank(),
        "cross_size": hc.cross_size(),
        "transport_local": hc.transport_name(True),
        "transport_cross": hc.transport_name(False),
        "mpi_enabled": hc.mpi_enabled(),
    }
    hc.shutdown()
    print("RESULT " + json.dumps(info), flush=True)


if __name__ == "__main__":
    main()
