"""Rank-side checks of the background engine, run by tests/parallel/test_engine_*.py under ``hpcdl run``.

``python engine_rank_checks.py SCENARIO [ARG]`` runs the scenario's checks on this rank and prints
``PASS <check>`` for each (and ``RESULT <text>`` lines the test compares across runs); the first failure
raises, so the rank exits non-zero and the launcher fails the job. Expected values are computed from
every rank's inputs, which are deterministic functions of the rank.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
import weakref
from typing import Callable

import numpy as np

import hpcdl.common as hc
from hpcdl.common import engine as E
from hpcdl.common.exceptions import (
    HpcdlConfigError,
    HpcdlError,
    HpcdlInternalError,
    HpcdlMismatchError,
    HpcdlShutdownError,
    HpcdlTimeoutError,
)

SUM = hc.ReduceOp.SUM


def passed(check: str) -> None:
    print(f"PASS {check}", flush=True)


def error_of(
    kind: type[Exception], never: str, call: Callable[..., object], *args: object, **kwargs: object
) -> str:
    """The message of the `kind` error ``call(*args, **kwargs)`` raises; fails with `never` when it raises
    none."""
    try:
        call(*args, **kwargs)
    except kind as exc:
        return str(exc)
    raise AssertionError(never)


def values(rank: int, n: int, salt: int = 0) -> np.ndarray:
    """Integer-valued floats: sums are exact in any order, so results compare bit for bit."""
    return ((np.arange(n, dtype=np.float64) * 7 + rank * 13 + salt) % 17).astype(np.float32)


# ---- scenario: core ---------------------------------------------------------------------------------


def check_out_of_order_threads() -> None:
    r, n = hc.rank(), hc.size()
    names = [f"grad.{t}.{i}" for t in range(3) for i in range(12)]
    results: dict[str, np.ndarray] = {}
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            mine = [name for name in names if name.startswith(f"grad.{t}.")]
            # Each rank submits its thread's names in a different order (rotated by rank).
            k = r % len(mine)
            order = mine[k:] + mine[:k] if r % 2 == 0 else list(reversed(mine))
            handles = {name: E.allreduce_async(values(r, 5, len(name)), name=name, op=SUM) for name in order}
            for name, h in handles.items():
                results[name] = E.synchronize(h)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors
    for name in names:
        expected = sum(values(q, 5, len(name)) for q in range(n))
        np.testing.assert_array_equal(results[name], expected, err_msg=name)
    passed("out_of_order_threads")


def check_mismatch_errors() -> None:
    r, n = hc.rank(), hc.size()
    f32 = np.float32
    # (the property the error must name, how this rank submits the mismatched name); one per property.
    cases = [
        ("shape", lambda: E.allreduce_async(np.zeros(3 + (r == n - 1), f32), name="bad.shape")),
        ("dtype", lambda: E.allreduce_async(np.zeros(3, f32 if r else np.float64), name="bad.dtype")),
        (
            "reduction",
            lambda: E.allreduce_async(np.zeros(3, f32), name="bad.op", op=SUM if r else hc.ReduceOp.MAX),
        ),
        (
            "scaling",
            lambda: E.allreduce_async(np.zeros(3, f32), name="bad.scale", op=SUM, prescale=2.0 if r else 1.0),
        ),
        ("root", lambda: E.broadcast_async(np.zeros(3, f32), root=0 if r else 1, name="bad.root")),
        (
            "operation",
            lambda: (
                E.allgather_async(np.zeros(3, f32), name="bad.kind")
                if r == 0
                else E.allreduce_async(np.zeros(3, f32), name="bad.kind")
            ),
        ),
        ("shape", lambda: E.allgather_async(np.zeros((1 + r, 2 + (r == 0)), f32), name="bad.rows")),
    ]
    for what, submit in cases:
        never = f"{what} mismatch was not reported"
        text = error_of(HpcdlMismatchError, never, lambda submit=submit: E.synchronize(submit()))
        assert f"mismatched {what}" in text, text
        assert "'bad." in text and "rank" in text, text
        print(f"RESULT mismatch {what}: {text}", flush=True)
    # The runtime stays usable, for the same names too.
    out = E.synchronize(E.allreduce_async(np.ones(3, np.float32), name="bad.shape", op=SUM))
    np.testing.assert_array_equal(out, np.full(3, n, np.float32))
    passed("mismatch_errors")


def check_grouped_atomic() -> None:
    r, n = hc.rank(), hc.size()
    group = E.new_group_id()
    a, b = values(r, 4, 1), values(r, 6, 2)
    out_a, out_b = np.empty_like(a), np.empty_like(b)
    kw = {"reduce_op": SUM, "group_id": group, "group_size": 2}
    h_a = E.enqueue(
        hc.OpType.ALLREDUCE,
        hc.Buffer.from_numpy(a),
        hc.Buffer.from_numpy(out_a),
        name="grp.a",
        **kw,
        keep=(a, out_a),
    )
    time.sleep(0.3)  # every rank has submitted grp.a, none grp.b: the group must not run yet
    assert not h_a.poll(), "a grouped allreduce ran before its group was complete"
    h_b = E.enqueue(
        hc.OpType.ALLREDUCE,
        hc.Buffer.from_numpy(b),
        hc.Buffer.from_numpy(out_b),
        name="grp.b",
        **kw,
        keep=(b, out_b),
    )
    h_a.wait()
    h_b.wait()
    np.testing.assert_array_equal(out_a, sum(values(q, 4, 1) for q in range(n)))
    np.testing.assert_array_equal(out_b, sum(values(q, 6, 2) for q in range(n)))
    handles = E.grouped_allreduce_async([values(r, 3, 5), values(r, 2, 6)], names=["g2.x", "g2.y"], op=SUM)
    outs = [E.synchronize(h) for h in handles]
    np.testing.assert_array_equal(outs[1], sum(values(q, 2, 6) for q in range(n)))
    passed("grouped_atomic")


def check_process_sets() -> None:
    r, n = hc.rank(), hc.size()
    assert n >= 3
    members = [0, 1]
    static_set = 1
    if r in members:
        out = E.synchronize(E.allreduce_async(values(r, 4), name="ps.x", op=SUM, process_set=static_set))
        np.testing.assert_array_equal(out, values(0, 4) + values(1, 4))
        # The same name in the global set is another operation.
        out = E.synchronize(E.allreduce_async(values(r, 4), name="ps.x", op=SUM))
    else:
        never, mine = "a non-member could submit to a process set", values(r, 4)
        text = error_of(HpcdlError, never, E.allreduce_async, mine, name="ps.x", process_set=static_set)
        assert "not a member of process set" in text, text
        out = E.synchronize(E.allreduce_async(values(r, 4), name="ps.x", op=SUM))
    np.testing.assert_array_equal(out, sum(values(q, 4) for q in range(n)))
    dynamic = hc.add_process_set([1, 2])
    if r in (1, 2):
        got = E.synchronize(E.allgather_async(np.full(r, r, np.int32), name="ps.gather", process_set=dynamic))
        np.testing.assert_array_equal(got, np.array([1, 2, 2], np.int32))
    hc.remove_process_set(dynamic)
    passed("process_sets")


def check_other_collectives() -> None:
    r, n = hc.rank(), hc.size()
    # allgather with a different first dimension per rank
    got = E.synchronize(E.allgather_async(np.full((r + 1, 2), r, np.int64), name="ag"))
    np.testing.assert_array_equal(got, np.concatenate([np.full((q + 1, 2), q, np.int64) for q in range(n)]))
    # broadcast from the last rank, in place
    b = values(r, 5)
    E.synchronize(E.broadcast_async(b, root=n - 1, name="bc"))
    np.testing.assert_array_equal(b, values(n - 1, 5))
    # alltoall with uneven splits: rank r sends q + 1 rows to rank q
    splits = [q + 1 for q in range(n)]
    send = np.concatenate([np.full(q + 1, 100 * r + q, np.int32) for q in range(n)])
    h = E.alltoall_async(send, splits=splits, name="a2a")
    got = E.synchronize(h)
    np.testing.assert_array_equal(
        got, np.concatenate([np.full(r + 1, 100 * q + r, np.int32) for q in range(n)])
    )
    assert h.received_splits() == [r + 1] * n, h.received_splits()
    # reducescatter: the first rows % n ranks get one extra row
    rows = 2 * n + 1
    got = E.synchronize(E.reducescatter_async(np.arange(rows * 2, dtype=np.float64).reshape(rows, 2), op=SUM))
    full = n * np.arange(rows * 2, dtype=np.float64).reshape(rows, 2)
    start = sum(rows // n + (1 if q < rows % n else 0) for q in range(r))
    np.testing.assert_array_equal(got, full[start : start + rows // n + (1 if r < rows % n else 0)])
    E.synchronize(E.barrier_async())
    passed("other_collectives")


def check_wait_timeout_names_the_missing_ranks() -> None:
    r, n = hc.rank(), hc.size()
    if r != 0:
        time.sleep(0.8)
    h = E.allreduce_async(np.ones(2, np.float32), name="late.op", op=SUM)
    if r == 0:
        text = error_of(HpcdlTimeoutError, "wait(timeout=0.3) did not time out", h.wait, timeout=0.3)
        missing = ", ".join(str(q) for q in range(1, n))
        assert f"allreduce 'late.op': ranks {missing} have not submitted it" in text, text
    np.testing.assert_array_equal(E.synchronize(h), np.full(2, n, np.float32))  # still completes
    passed("wait_timeout")


def negotiations_cached(path: str, prefixes: tuple[str, ...]) -> dict[str, list[bool]]:
    """From rank 0's timeline: for each tensor whose name starts with one of ``prefixes``, whether each of
    its negotiations went through the response cache (every member sent only the entry's id)."""
    with open(path) as timeline:
        events = json.load(timeline)
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    cached: dict[str, list[bool]] = {}
    for e in events:
        if e["ph"] == "X" and e["name"] == "NEGOTIATE" and tracks[e["tid"]].startswith(prefixes):
            cached.setdefault(tracks[e["tid"]], []).append(e["args"].get("cached", False))
    return cached


def check_names_and_cache() -> None:
    r, n = hc.rank(), hc.size()
    # Unnamed operations get the same deterministic names on every rank.
    outs = [E.synchronize(E.allreduce_async(values(r, 3, i), op=SUM)) for i in range(3)]
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out, sum(values(q, 3, i) for q in range(n)))
    # A name may not be pending twice on one rank, however many other names come and go meanwhile; once
    # its operation finished, the name may be submitted again.
    if r == 0:
        pending = E.allreduce_async(values(r, 3), name="dup", op=SUM)
    others = [E.allreduce_async(values(r, 2, i), name=f"other.{i}", op=SUM) for i in range(1500)]
    for i, h in enumerate(others):
        np.testing.assert_array_equal(E.synchronize(h), sum(values(q, 2, i) for q in range(n)))
    if r == 0:
        assert not pending.poll(), "'dup' ran before every rank submitted it"
        never = "a duplicate pending name was accepted"
        text = error_of(HpcdlError, never, E.allreduce_async, values(r, 3), name="dup")
        assert "already pending" in text, text
    hc.barrier()
    if r != 0:
        pending = E.allreduce_async(values(r, 3), name="dup", op=SUM)
    np.testing.assert_array_equal(E.synchronize(pending), sum(values(q, 3) for q in range(n)))
    again = E.allreduce_async(values(r, 3, 1), name="dup", op=SUM)
    np.testing.assert_array_equal(E.synchronize(again), sum(values(q, 3, 1) for q in range(n)))
    # Repeated names go through the response cache (capacity 4 here forces evictions) and stay correct.
    assert E.engine_knob("cache_capacity") == 4
    for step in range(6):
        for i in range(6):
            out = E.synchronize(E.allreduce_async(values(r, 8, i + step), name=f"cached.{i}", op=SUM))
            np.testing.assert_array_equal(out, sum(values(q, 8, i + step) for q in range(n)))
    # An unnamed operation's name never comes again, so it takes no cache entry: six of them would have
    # evicted every named entry, and 'kept.*' would travel in full again.
    for _ in range(2):
        for name in ("kept.a", "kept.b"):
            E.synchronize(E.allreduce_async(values(r, 4), name=name, op=SUM))
    with tempfile.TemporaryDirectory(prefix="hpcdl-cache-") as scratch:
        path = os.path.join(scratch, "cache.json")  # world rank 0 writes the timeline
        E.start_timeline(path)
        for _ in range(6):
            E.synchronize(E.allreduce_async(values(r, 4), op=SUM))
        for name in ("kept.a", "kept.b"):
            E.synchronize(E.allreduce_async(values(r, 4), name=name, op=SUM))
        # Least recently used first: lru.0 is used again after lru.1-3, so lru.4 evicts lru.1.
        for i in (0, 1, 2, 3, 0, 4, 0, 2, 1):
            E.synchronize(E.allreduce_async(values(r, 4), name=f"lru.{i}", op=SUM))
        E.stop_timeline()
        if r == 0:
            cached = negotiations_cached(path, ("kept.", "lru."))
            assert cached == {
                "kept.a": [True],
                "kept.b": [True],
                "lru.0": [False, True, True],
                "lru.1": [False, False],
                "lru.2": [False, True],
                "lru.3": [False],
                "lru.4": [False],
            }, cached
    passed("names_and_cache")


def check_handle_lifetime() -> None:
    """A handle dropped while its operation runs keeps the buffers alive until the operation is done (the
    next submission frees them); a released handle refuses to be used again."""
    r, n = hc.rank(), hc.size()
    if r != 0:
        time.sleep(0.5)  # rank 0's operation stays pending meanwhile
    a = values(r, 1000)
    h = E.allreduce_async(a, name="dropped", op=SUM, out=a)
    alive = weakref.ref(a)
    if r == 0:
        assert not h.poll(), "the operation finished before every rank submitted it"
        del a, h  # the engine still writes into the array
        gc.collect()
        assert alive() is not None, "the buffer of a pending operation was freed"
    else:
        np.testing.assert_array_equal(E.synchronize(h), sum(values(q, 1000) for q in range(n)))
        del a, h
    E.synchronize(E.barrier_async(name="after.dropped"))  # runs after "dropped" on every rank
    last = E.barrier_async(name="reaper")  # this submission frees the finished orphan
    last.wait(None)
    gc.collect()
    assert alive() is None, "the buffer of a finished, dropped operation was never freed"
    last.wait(5.0)  # waiting again on a finished handle returns at once
    last.release()
    last.release()  # idempotent
    text = error_of(HpcdlError, "a released handle could still be waited on", last.wait, timeout=1.0)
    assert "already released" in text, text
    passed("handle_lifetime")


# ---- scenario: fusion -------------------------------------------------------------------------------


def check_fusion_workload() -> None:
    """Many small and a few large allreduces submitted at once; prints a digest of all results."""
    r, n = hc.rank(), hc.size()
    sizes = [3, 17, 64, 1000, 4096, 70000, 5, 300000, 128, 9]
    digest = hashlib.sha256()
    for step in range(3):
        handles = []
        for i, count in enumerate(sizes):
            op = hc.ReduceOp.AVERAGE if i % 3 == 0 else SUM
            handles.append(E.allreduce_async(values(r, count, i + step), name=f"f.{i}", op=op))
        for i, h in enumerate(handles):
            out = E.synchronize(h)
            expected = sum(values(q, sizes[i], i + step).astype(np.float64) for q in range(n))
            if i % 3 == 0:
                expected = expected / n
            np.testing.assert_allclose(out, expected, rtol=1e-6)
            digest.update(out.tobytes())
    print(
        f"RESULT digest {digest.hexdigest()} fusion_threshold={E.engine_knob('fusion_threshold'):.0f}",
        flush=True,
    )
    passed("fusion_workload")


# ---- scenario: short steps ---------------------------------------------------------------------------


def check_short_steps(steps: int) -> None:
    """A loop of short steps (submit a few small allreduces, then wait for them): prints how long the loop
    took, which the test compares with the cycle time it set. A step's cycle starts once its caller waits;
    the cycle time only bounds how long the engine collects a burst that is still arriving."""
    r, n = hc.rank(), hc.size()
    counts = [1, 7, 64, 300, 1000, 5, 4096, 33]
    hc.barrier()
    started = time.monotonic()
    for step in range(steps):
        handles = [
            E.allreduce_async(values(r, c, i + step), name=f"short.{i}", op=SUM) for i, c in enumerate(counts)
        ]
        for i, h in enumerate(handles):
            expected = sum(values(q, counts[i], i + step) for q in range(n))
            np.testing.assert_array_equal(E.synchronize(h), expected)
    print(f"RESULT short_steps {steps} steps in {time.monotonic() - started:.3f} s", flush=True)
    passed("short_steps")


def other_threads_switches() -> int:
    """How many times this process's threads other than the caller's (the engine thread, and library threads
    that sleep) have been switched out so far: each wake-up of a sleeping thread counts at least once."""
    total = 0
    for task in os.scandir("/proc/self/task"):
        if int(task.name) == threading.get_native_id():
            continue
        try:
            with open(os.path.join(task.path, "status")) as status:
                total += sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return total


def check_blocking_calls_leave_the_engine_asleep(calls: int) -> None:
    """Blocking 1 MiB allreduces (``engine.run``, as ``hpcdl.torch.allreduce_`` makes them): the caller runs
    each cycle itself, so the engine thread is not woken for them; prints how many times the process's other
    threads were switched out meanwhile. (Asynchronous submissions of that size wake it.)"""
    r, n = hc.rank(), hc.size()
    a, out = values(r, 1 << 18), np.empty(1 << 18, np.float32)

    def call() -> None:
        E.run(E.OpType.ALLREDUCE, "blocking", 0, hc.DType.FLOAT32, a.ctypes.data, out.ctypes.data, a.shape)

    for _ in range(20):  # the name is cached after the first
        call()
    hc.barrier()
    before = other_threads_switches()
    for _ in range(calls):
        call()
    woken = other_threads_switches() - before
    np.testing.assert_array_equal(out, sum(values(q, 1 << 18) for q in range(n)))
    print(f"RESULT blocking_wakes {woken} switches in {calls} calls", flush=True)
    passed("blocking_wakes")

    # The same for a blocking allgather, whose result the engine allocates (``submit(wait=True)``, as
    # hpcdl.torch's allgather makes it): it returns finished, without a wake-up either.
    def gather(x: np.ndarray, name: str = "blocking.gather") -> E.Handle:
        return E.submit(
            E.OpType.ALLGATHER, name, 0, hc.DType.FLOAT32, x.ctypes.data, None, x.shape, keep=x, wait=True
        )

    def gathered(h: E.Handle) -> np.ndarray:
        return h.output().view(np.float32)

    for _ in range(20):
        gather(a).release()
    hc.barrier()
    before = other_threads_switches()
    for _ in range(calls):
        h = gather(a)
        assert h.poll(), "submit(wait=True) returned an unfinished allgather"
        h.release()
    woken = other_threads_switches() - before
    print(f"RESULT blocking_gather_wakes {woken} switches in {calls} calls", flush=True)
    passed("blocking_gather_wakes")
    check_result_buffers(gather, gathered)


def gather_and_wait(x: np.ndarray) -> E.Handle:
    """An asynchronous allgather (the engine thread runs it when woken), then a wait for it."""
    h = E.submit(E.OpType.ALLGATHER, "buffers", 0, hc.DType.FLOAT32, x.ctypes.data, None, x.shape, keep=x)
    h.wait()
    return h


def check_result_buffers(gather: Callable[..., E.Handle], gathered: Callable[[E.Handle], np.ndarray]) -> None:
    """A released result's buffer serves the next result of a size it holds (a loop of allgathers would
    otherwise allocate and free a large block every call); a result whose handle is still held keeps its
    own, whatever runs meanwhile; sizes that grow and shrink stay right."""
    r, n = hc.rank(), hc.size()
    first = gather(values(r, 1 << 16))
    address = first.output_bytes()[0]
    first.release()
    second = gather(values(r, 1 << 16, 1))
    assert second.output_bytes()[0] == address, "a released result's buffer was not reused"
    kept = second
    for salt, count in enumerate((1 << 16, 1 << 17, 1 << 15, 1 << 16, 3), start=2):
        h = gather(values(r, count, salt))
        np.testing.assert_array_equal(gathered(h), np.concatenate([values(q, count, salt) for q in range(n)]))
        assert h.output_bytes()[0] != address, "a held result's buffer was handed to another"
        h.release()
    np.testing.assert_array_equal(gathered(kept), np.concatenate([values(q, 1 << 16, 1) for q in range(n)]))
    kept.release()
    passed("result_buffers")


# ---- scenario: join ---------------------------------------------------------------------------------


def check_join_uneven() -> None:
    r, n = hc.rank(), hc.size()
    steps = r + 1  # rank r has r + 1 batches: rank 0 joins first, the last rank last
    for s in range(steps):
        active = [q for q in range(n) if q + 1 > s]
        out = E.synchronize(E.allreduce_async(values(r, 6, s), name=f"j.sum.{s}", op=SUM))
        np.testing.assert_array_equal(out, sum(values(q, 6, s) for q in active))  # joined ranks add zeros
        gather = E.allgather_async(np.full(2, r, np.int32), name=f"j.gather.{s}")
        if len(active) == n:
            np.testing.assert_array_equal(E.synchronize(gather), np.repeat(np.arange(n, dtype=np.int32), 2))
            continue
        try:  # as in Horovod, a joined rank stands in for allreduces only
            E.synchronize(gather)
        except hc.HpcdlJoinError as exc:
            assert f"j.gather.{s}" in str(exc) and "joined (called join())" in str(exc), str(exc)
        else:
            raise AssertionError("an allgather while a rank has joined must fail")
    last = E.join()
    assert last == n - 1, f"join returned {last}, expected the last rank to join ({n - 1})"
    # After everyone joined, operations need every rank again.
    out = E.synchronize(E.allreduce_async(np.ones(2, np.float32), name="j.after", op=SUM))
    np.testing.assert_array_equal(out, np.full(2, n, np.float32))
    passed("join_uneven")


# ---- scenario: semantics (Horovod's rules for names, scaling, groups and shutdown) -----------------------


def check_the_cache_grows_to_hold_a_model() -> None:
    """With the default capacity (the user set none), a model with more named tensors than the response
    cache holds would miss at every tensor of every step (least recently used eviction of a cyclic set).
    A name evicted for want of room that comes back doubles the capacity on every rank alike, so from the
    third step every tensor goes through the cache."""
    r, n = hc.rank(), hc.size()
    assert E.engine_knob("cache_capacity") == 1024
    tensors = 1300
    with tempfile.TemporaryDirectory(prefix="hpcdl-cache-") as scratch:
        path = os.path.join(scratch, "grown.json")  # world rank 0 writes the timeline
        for step in range(3):
            if step == 2:
                E.start_timeline(path)
            handles = [
                E.allreduce_async(values(r, 2, i + step), name=f"model.{i}", op=SUM) for i in range(tensors)
            ]
            for i, h in enumerate(handles):
                np.testing.assert_array_equal(E.synchronize(h), sum(values(q, 2, i + step) for q in range(n)))
        E.stop_timeline()
        assert E.engine_knob("cache_capacity") == 2048, E.engine_knob("cache_capacity")
        if r == 0:
            cached = negotiations_cached(path, ("model.",))
            assert len(cached) == tensors and all(c == [True] for c in cached.values()), cached
    passed("cache_grows")


def check_names_stay_taken_until_collected() -> None:
    r = hc.rank()
    first = E.allreduce_async(values(r, 4), name="taken", op=SUM)
    E.synchronize(E.barrier_async())  # submitted after it everywhere: `first` has finished by now
    never = "a name whose result was never collected was accepted again"
    text = error_of(HpcdlConfigError, never, E.allreduce_async, values(r, 4), name="taken", op=SUM)
    assert "never collected" in text and "'taken'" in text, text
    # Another kind of operation may take the name once the first one finished.
    np.testing.assert_array_equal(
        E.synchronize(E.allgather_async(np.full(1, r, np.int32), name="taken")), np.arange(hc.size())
    )
    assert first.poll()  # collected: the name is free again
    E.synchronize(E.allreduce_async(values(r, 4), name="taken", op=SUM))
    dropped = E.allreduce_async(values(r, 4), name="dropped", op=SUM)
    E.synchronize(E.barrier_async())
    del dropped  # released: the name is free again
    gc.collect()
    E.synchronize(E.allreduce_async(values(r, 4), name="dropped", op=SUM))
    passed("names_until_collected")


def check_prescale_rounds_like_horovod() -> None:
    """Integer and float16 inputs are scaled and stored in their own type before the sum; a float average
    over 3 ranks divides (it must equal numpy's float32 division)."""
    r, n = hc.rank(), hc.size()
    ints = [np.arange(-7, 8, dtype=np.int32) * (q + 1) for q in range(n)]  # 60 bytes: reduced inline
    big = [np.arange(-500, 500, dtype=np.int64) * (q + 3) for q in range(n)]  # a collective of its own
    truncated = [np.trunc(a * 0.3).astype(a.dtype) for a in ints]
    np.testing.assert_array_equal(
        E.synchronize(E.allreduce_async(ints[r], name="pre.int", op=SUM, prescale=0.3)), sum(truncated)
    )
    np.testing.assert_array_equal(
        E.synchronize(E.allreduce_async(big[r], name="pre.big", op=SUM, prescale=0.3)),
        sum(np.trunc(a * 0.3).astype(np.int64) for a in big),
    )
    halves = [(np.arange(300) * 1.37 + q).astype(np.float16) for q in range(n)]
    scaled = [(a.astype(np.float32) * np.float32(0.7)).astype(np.float16) for a in halves]
    expected = sum(a.astype(np.float32) for a in scaled).astype(np.float16)
    handles = E.grouped_allreduce_async([halves[r], ints[r]], names=["pre.h", "pre.i"], op=SUM, prescale=0.7)
    got_h, got_i = (E.synchronize(h) for h in handles)
    np.testing.assert_array_equal(got_h, expected)  # fused: scaled into the fusion buffer
    np.testing.assert_array_equal(got_i, sum(np.trunc(a * 0.7).astype(np.int32) for a in ints))
    floats = [(np.arange(1000, dtype=np.float32) * 0.731 + q * 0.37).astype(np.float32) for q in range(n)]
    total = floats[0]
    for a in floats[1:]:
        total = total + a
    got = E.synchronize(E.allreduce_async(floats[r], name="avg", op=hc.ReduceOp.AVERAGE))
    np.testing.assert_array_equal(got, total / np.float32(n))
    passed("prescale_rounds")


def check_group_ids_per_process_set() -> None:
    """Groups on a set that not every rank belongs to do not shift the ranks' global group ids."""
    r, n = hc.rank(), hc.size()
    pair = hc.add_process_set([0, 1])
    if r in (0, 1):
        handles = E.grouped_allreduce_async([values(r, 2), values(r, 3)], op=SUM, process_set=pair)
        [E.synchronize(h) for h in handles]
    handles = E.grouped_allreduce_async([values(r, 2), values(r, 3)], names=["gg.a", "gg.b"], op=SUM)
    np.testing.assert_array_equal(E.synchronize(handles[1]), sum(values(q, 3) for q in range(n)))
    E.synchronize(handles[0])
    hc.remove_process_set(pair)
    passed("group_ids")


def check_a_shutdown_ends_the_job() -> None:
    """Rank 2 shuts down: it leaves at once, the others' pending and later operations fail naming it."""
    r = hc.rank()
    if r == 2:
        time.sleep(0.3)  # the others wait for "never" by now
        started = time.monotonic()
        hc.shutdown()
        assert time.monotonic() - started < 1.0, time.monotonic() - started
        passed("shutdown_ends_the_job")
        return
    pending = E.allreduce_async(values(r, 4), name="never", op=SUM)  # rank 2 never submits it
    text = error_of(HpcdlShutdownError, "a pending operation survived a peer's shutdown", pending.wait)
    assert "rank 2 has shut down" in text and "'never'" in text, text
    never = "an operation was accepted after a peer shut down"
    text = error_of(HpcdlShutdownError, never, E.allreduce_async, values(r, 4), name="later", op=SUM)
    assert "rank 2 has shut down" in text, text
    passed("shutdown_ends_the_job")


# ---- scenario: timeline -----------------------------------------------------------------------------


def timeline_workload(prefix: str) -> None:
    r = hc.rank()
    # A group runs in one cycle, so its members are certainly fused together.
    small = [values(r, 100, i) for i in range(8)]
    handles = E.grouped_allreduce_async(small, names=[f"{prefix}.small.{i}" for i in range(8)], op=SUM)
    handles.append(E.allreduce_async(values(r, 4), name=f"{prefix}.tiny", op=SUM))
    handles.append(E.allreduce_async(values(r, 200000), name=f"{prefix}.large", op=SUM))
    handles.append(E.allgather_async(np.full(3, r, np.int32), name=f"{prefix}.gather"))
    if r == 1:
        time.sleep(0.05)  # rank 1 is late: the timeline should show rank 0 waiting for it
    handles.append(E.broadcast_async(values(r, 4), root=0, name=f"{prefix}.bcast"))
    for h in handles:
        E.synchronize(h)


def check_timeline(path: str) -> None:
    """The first half goes to HPCDL_TIMELINE; then the timeline is restarted at run time on ``path``."""
    timeline_workload("env")
    E.stop_timeline()
    E.start_timeline(path, mark_cycles=True)
    timeline_workload("tl")
    E.stop_timeline()
    passed("timeline")


def check_timeline_survives_kill() -> None:
    """Rank 0 writes HPCDL_TIMELINE, then dies without shutting down."""
    timeline_workload("killed")
    time.sleep(1.5)  # the engine flushes pending events while idle
    if hc.rank() == 0:
        print("PASS timeline_survives_kill", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(5)  # the launcher stops this rank when rank 0 dies


# ---- scenario: stall --------------------------------------------------------------------------------


def check_stall() -> None:
    r = hc.rank()
    if r == 0:
        h = E.allreduce_async(np.ones(2, np.float32), name="stuck.tensor")
        # More stalled names, submitted out of name order: the warning lists them in name order.
        others = [E.allreduce_async(np.ones(2, np.float32), name=f"stuck.{c}") for c in "dbeac"]
        text = error_of(HpcdlInternalError, "the stalled operation completed", h.wait, timeout=30)
        assert "stall shutdown" in text and "rank 1" in text, text
        print(f"RESULT stall error: {text}", flush=True)
        for other in others:
            text = error_of(HpcdlInternalError, "a stalled operation completed", other.wait, timeout=30)
            assert "stall shutdown" in text, text
    else:
        time.sleep(4.0)  # never submits stuck.tensor; waits past the stall shutdown
    out = E.synchronize(E.allreduce_async(np.ones(2, np.float32), name="after.stall", op=SUM))
    np.testing.assert_array_equal(out, np.full(2, hc.size(), np.float32))
    passed("stall")


# ---- scenario: autotune -----------------------------------------------------------------------------


def check_autotune(steps: int) -> None:
    r = hc.rank()
    user_threshold = E.engine_knob("fusion_threshold")
    cycle_times = set()
    for i in range(steps):
        # One operation a step: a burst (what autotune scores) that no scheduling delay can split, so each
        # step's sample changes a knob that the next step's negotiation carries to every rank. (Twenty
        # tensors a step, submitted one by one, split into several bursts on a loaded host, and autotune
        # could converge within one step, unseen between two reads.)
        E.synchronize(E.allreduce_async(values(r, 20 * 2000, i), name="at.step"))
        time.sleep(0.02)  # let the engine go idle: one step per burst
        cycle_times.add(E.engine_knob("cycle_time_ms"))
        assert E.engine_knob("fusion_threshold") == user_threshold, "autotune changed a knob the user set"
    print(f"RESULT cycle_times {sorted(cycle_times)}", flush=True)
    passed("autotune")


SCENARIOS: dict[str, Callable[[list[str]], None]] = {
    "core": lambda _args: [
        check()
        for check in (
            check_out_of_order_threads,
            check_mismatch_errors,
            check_grouped_atomic,
            check_process_sets,
            check_other_collectives,
            check_wait_timeout_names_the_missing_ranks,
            check_names_and_cache,
            check_handle_lifetime,
        )
    ],
    "semantics": lambda _args: [
        check()
        for check in (
            check_names_stay_taken_until_collected,
            check_prescale_rounds_like_horovod,
            check_group_ids_per_process_set,
            check_the_cache_grows_to_hold_a_model,
            check_a_shutdown_ends_the_job,
        )
    ],
    "fusion": lambda _args: check_fusion_workload(),
    "join": lambda _args: check_join_uneven(),
    "short_steps": lambda args: check_short_steps(int(args[0])),
    "blocking_wakes": lambda args: check_blocking_calls_leave_the_engine_asleep(int(args[0])),
    "result_buffers": lambda _args: check_result_buffers(
        gather_and_wait, lambda h: h.output().view(np.float32)
    ),
    "timeline": lambda args: check_timeline(args[0]),
    "timeline_kill": lambda _args: check_timeline_survives_kill(),
    "stall": lambda _args: check_stall(),
    "autotune": lambda args: check_autotune(int(args[0])),
}


def main() -> None:
    scenario, args = sys.argv[1], sys.argv[2:]
    dynamic = scenario in ("core", "semantics")
    hc.init(process_sets=[[0, 1]] if scenario == "core" else None, dynamic_process_sets=dynamic)
    try:
        SCENARIOS[scenario](args)
    finally:
        hc.shutdown()
    print(f"DONE {scenario} rank {os.environ.get('HPCDL_RANK')}", flush=True)


if __name__ == "__main__":
    main()
