"""Rank-side checks of the engine's side of the GPU path, without torch: device operations submitted with
``Placement.DEVICE`` and a tag, their batches taken from ``DeviceQueue`` by this program acting as the
executor. A batch it takes and never reports is a collective that never finishes on the GPU (a NCCL
kernel waiting for a peer), which no other way of testing can produce on a machine without one.

``python gpu_engine_checks.py SCENARIO`` prints ``PASS <check>`` per check and ``RESULT <json>`` lines;
the first failure raises.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Callable

import numpy as np

import hpcdl.common as hc
from hpcdl.common import engine as E
from hpcdl.common.exceptions import HpcdlError, HpcdlInternalError, HpcdlTimeoutError
from hpcdl.common.types import DType, OpType, Placement, ReduceOp


def result(**fields: object) -> None:
    print("RESULT " + json.dumps(fields), flush=True)


def submit(op_type: OpType, name: str, a: np.ndarray, tag: int, **request: object) -> E.Handle:
    return E.submit(
        op_type, name, 0, DType.FLOAT32, a.ctypes.data, a.ctypes.data, a.shape,
        keep=a, placement=Placement.DEVICE, tag=tag, **request,
    )  # fmt: skip


def error_of(kind: type[Exception], call: Callable[[], object]) -> str:
    try:
        call()
    except kind as exc:
        return str(exc)
    raise AssertionError(f"{call} did not raise {kind.__name__}")


def check_batches_carry_what_the_executor_needs() -> None:
    """Every batch comes in the engine's order with the tags and counts of this rank's operations and the
    other members' rows; reporting its end completes (or fails) the handles."""
    r, n = hc.rank(), hc.size()
    q = E.DeviceQueue()
    group = E.new_group_id()
    a, b = np.ones(3, np.float32), np.ones((2, 2), np.float32)
    fused = [
        E.submit(OpType.ALLREDUCE, f"pair.{i}", 0, DType.FLOAT32, x.ctypes.data, x.ctypes.data, x.shape,
                 reduce_op=ReduceOp.AVERAGE, prescale=0.5, group_id=group, group_size=2, keep=x,
                 placement=Placement.DEVICE, tag=10 + i)
        for i, x in enumerate((a, b))
    ]  # fmt: skip
    rows = np.ones((r + 1, 2), np.float32)
    gather = submit(OpType.ALLGATHER, "rows", rows, 20)
    sent = np.ones((n * 2, 1), np.float32)
    splits = [(r + m) % 3 for m in range(n)]
    splits[-1] += n * 2 - sum(splits)
    a2a = submit(OpType.ALLTOALL, "a2a", sent, 30, splits=splits)
    bcast = submit(OpType.BROADCAST, "bcast", np.ones(4, np.float32), 40, root=n - 1)
    taken = [q.next(10.0) for _ in range(4)]
    assert all(batch is not None for batch in taken), taken
    by_type = {batch.op_type: batch for batch in taken if batch is not None}
    pair = by_type[OpType.ALLREDUCE]
    assert pair.fused and pair.tags == (10, 11) and pair.counts == (3, 4), pair
    assert pair.reduce_op == ReduceOp.AVERAGE and pair.prescale == 0.5 and pair.postscale == 1.0, pair
    assert (pair.set_size, pair.set_rank, pair.dtype) == (n, r, DType.FLOAT32), pair
    assert by_type[OpType.ALLGATHER].table == tuple(m + 1 for m in range(n)), by_type[OpType.ALLGATHER]
    assert by_type[OpType.ALLGATHER].counts == ((r + 1) * 2,)
    every_split = [[(m + p) % 3 for p in range(n)] for m in range(n)]
    for m in range(n):
        every_split[m][-1] += n * 2 - sum(every_split[m])
    assert by_type[OpType.ALLTOALL].table == tuple(every_split[m][r] for m in range(n)), by_type[
        OpType.ALLTOALL
    ]
    assert by_type[OpType.BROADCAST].root == n - 1 and by_type[OpType.BROADCAST].tags == (40,)
    assert not fused[0].poll(), "an operation finished before its batch was reported"
    for batch in taken:
        E.DeviceQueue.done(batch, times_ns=[time.monotonic_ns()] * 4)  # type: ignore[arg-type]
    for h in (*fused, gather, a2a, bcast):
        h.wait(10.0)
    print("PASS batches_carry_what_the_executor_needs", flush=True)


def check_a_failed_batch_fails_its_operations_and_the_engine() -> None:
    q = E.DeviceQueue()
    x = np.ones(2, np.float32)
    h = submit(OpType.ALLREDUCE, "broken", x, 50)
    batch = q.next(10.0)
    assert batch is not None and batch.tags == (50,)
    E.DeviceQueue.done(batch, error="RuntimeError: NCCL error: unhandled system error")
    text = error_of(HpcdlInternalError, lambda: h.wait(10.0))
    assert "allreduce 'broken' failed on the device: RuntimeError: NCCL error" in text, text
    later = error_of(HpcdlError, lambda: q.next(10.0))  # the executor learns it and aborts its groups
    assert "allreduce 'broken' failed on the device" in later, later
    refused = error_of(HpcdlError, lambda: submit(OpType.ALLREDUCE, "after", x, 51))
    assert "accepts no more operations" in refused, refused
    print("PASS a_failed_batch_fails_its_operations_and_the_engine", flush=True)


def hung() -> None:
    """Every rank takes the batch and never reports it: a kernel that never finishes. The caller's wait and
    the engine's deadline on the batch both end it."""
    q = E.DeviceQueue()
    x = np.ones(4, np.float32)
    h = submit(OpType.ALLREDUCE, "hung", x, 1)
    batch = q.next(10.0)
    taken = time.monotonic()
    assert batch is not None and batch.tags == (1,)
    waited = error_of(HpcdlTimeoutError, lambda: h.wait())
    aborted = error_of(HpcdlTimeoutError, lambda: q.next(10.0))
    result(waited=waited, aborted=aborted, seconds=time.monotonic() - taken)
    # The ranks' engines reach the batch's deadline up to a heartbeat apart: a rank that left at once could
    # end its peer's wait first, as a death (seen once in a local CI run), not as the timeout under test.
    time.sleep(2)
    os._exit(0)


def untaken() -> None:
    """Rank 1 runs no executor: its operation fails at the deadline saying so; rank 0's completes."""
    r = hc.rank()
    x = np.ones(4, np.float32)
    h = submit(OpType.ALLREDUCE, "untaken", x, 1)
    if r == 0:
        batch = E.DeviceQueue().next(10.0)
        assert batch is not None
        E.DeviceQueue.done(batch)
        h.wait(10.0)
        result(rank=r, ok=True)
    else:
        result(rank=r, message=error_of(HpcdlTimeoutError, lambda: h.wait()))
    time.sleep(3)  # let rank 1's engine reach its own deadline before rank 0 leaves
    os._exit(0)


def dead() -> None:
    """Every rank takes the batch and none reports it; then the last rank dies. The survivors' engines
    notice in their heartbeat and fail the operation at once, naming it, and tell their executors."""
    r, n = hc.rank(), hc.size()
    q = E.DeviceQueue()
    x = np.ones(4, np.float32)
    h = submit(OpType.ALLREDUCE, "inflight", x, 1)
    batch = q.next(10.0)
    assert batch is not None
    hc.barrier()  # every rank took it (the direct path: the engine is idle meanwhile)
    if r == n - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    waited = error_of(HpcdlInternalError, lambda: h.wait())
    aborted = error_of(HpcdlError, lambda: q.next(10.0))
    result(rank=r, waited=waited, aborted=aborted, seconds=time.monotonic() - started)
    time.sleep(1.0)  # the other survivor must not see this one gone first
    os._exit(0)


SCENARIOS: dict[str, Callable[[], None]] = {"hung": hung, "untaken": untaken, "dead": dead}


def main(scenario: str) -> None:
    hc.init()
    if scenario == "batches":
        check_batches_carry_what_the_executor_needs()
        check_a_failed_batch_fails_its_operations_and_the_engine()
        time.sleep(1.0)  # a peer that has left would be named as the cause of the others' failed batch
        os._exit(0)  # the engine failed on purpose
    SCENARIOS[scenario]()


if __name__ == "__main__":
    main(sys.argv[1])
