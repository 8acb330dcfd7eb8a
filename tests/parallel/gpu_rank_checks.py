"""Rank-side checks of the GPU path (CUDA tensors negotiated by the engine, moved by the executor), run
with ``HPCDL_GPU_OPERATIONS=gloo-standin`` by tests/parallel/test_gpu_path.py: CPU tensors then take
exactly the GPU path's code, gloo process groups standing in for NCCL.

``python gpu_rank_checks.py SCENARIO`` prints ``PASS <check>`` for each check of the scenario and
``RESULT <json>`` lines the test compares across ranks; the first failure raises, so the rank exits
non-zero. Every expected value is computed from the other ranks' inputs, deterministic functions of the
rank, with integer values so that sums are exact in any order.

The tensors live on ``GPU_RANK_CHECKS_DEVICE`` (default ``cpu``): ``cuda`` runs the same checks on CUDA
tensors with gloo still moving them (scripts/gpu-check.sh on one GPU, where NCCL refuses two ranks), so
real streams and events order the executor's work. Expected values are compared on the CPU.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Callable

import numpy as np
import torch

import hpcdl.torch as hvd
from hpcdl.common import engine
from hpcdl.common.exceptions import HpcdlError, HpcdlMismatchError
from hpcdl.torch import _gpu

torch.set_num_threads(1)

DEVICE = torch.device(os.environ.get("GPU_RANK_CHECKS_DEVICE", "cpu"))
if DEVICE.type == "cuda" and DEVICE.index is None:  # what a tensor made on "cuda" says it is on
    DEVICE = torch.device("cuda", torch.cuda.current_device())
EVENS = hvd.ProcessSet([0, 2])


def passed(check: Callable[[], None]) -> None:
    print(f"PASS {check.__name__}", flush=True)


def result(**fields: object) -> None:
    print("RESULT " + json.dumps(fields), flush=True)


def value(
    rank: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32, salt: int = 0
) -> torch.Tensor:
    """Small integers in [-5, 5] (uint8: [0, 3]; bool: positive), different per rank and element."""
    base = torch.arange(int(np.prod(shape)), dtype=torch.int64).reshape(shape)
    v = (base * 7 + rank * 13 + salt) % 11 - 5
    if dtype == torch.bool:
        return (v > 0).to(DEVICE)
    if dtype == torch.uint8:
        return ((v + 5) % 4).to(DEVICE, dtype)
    return v.to(DEVICE, dtype)


def everyone(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, salt: int = 0, ranks=None):
    ranks = range(hvd.size()) if ranks is None else ranks
    return torch.stack([value(r, shape, dtype, salt) for r in ranks])


def sum_of(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, salt: int = 0, ranks=None):
    """The sum of every rank's (or ``ranks``') tensor, in its dtype."""
    return everyone(shape, dtype, salt, ranks).sum(0).to(dtype)


def reduced(stack: torch.Tensor, op: int, dtype: torch.dtype, size: int) -> torch.Tensor:
    """Horovod's result of reducing the ranks' tensors (``stack``) with ``op``."""
    if dtype == torch.bool:
        return stack.all(0) if op in (hvd.Min, hvd.Product) else stack.any(0)
    wide = stack.to(torch.float64)
    if op == hvd.Min:
        out = wide.min(0).values
    elif op == hvd.Max:
        out = wide.max(0).values
    elif op == hvd.Product:
        out = wide.prod(0)
    else:
        out = wide.sum(0)
        if op == hvd.Average:
            out = out / size if dtype.is_floating_point else torch.trunc(out / size)
    return out.to(dtype)


def same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.device == DEVICE, f"{what}: the result is on {actual.device}, not {DEVICE}"
    actual, expected = actual.cpu(), expected.cpu()
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), f"{what}: shape {actual.shape} != {expected.shape}"
    if actual.dtype.is_floating_point:
        ok = torch.allclose(
            actual.double(), expected.double(), rtol=1e-2 if actual.element_size() == 2 else 1e-6
        )
    else:
        ok = torch.equal(actual, expected)
    assert ok, f"{what}: {actual.flatten()[:8].tolist()} != {expected.flatten()[:8].tolist()}"


# ---- scenario: forms -------------------------------------------------------------------------------


def check_runs_on_the_gpu_path() -> None:
    assert _gpu.mode() == "gloo-standin", _gpu.mode()
    assert _gpu.takes([torch.ones(1, device=DEVICE)])


def check_allreduce_ops_dtypes_and_scaling() -> None:
    r, n = hvd.rank(), hvd.size()
    dtypes = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
              torch.int16, torch.int8, torch.uint8, torch.bool)  # fmt: skip
    for dtype in dtypes:
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
            out = hvd.allreduce(value(r, (2, 3), dtype), op=op, name=f"ops.{dtype}.{op}")
            same(out, reduced(everyone((2, 3), dtype), op, dtype, n), f"allreduce {dtype} op {op}")
    # Horovod's scaling: each input scaled in its own type (integers truncate), the sum postscaled.
    for dtype in (torch.int32, torch.int16, torch.float64):
        out = hvd.allreduce(value(r, (5,), dtype), op=hvd.Sum, prescale_factor=1.5, postscale_factor=0.5)
        scaled = everyone((5,), dtype).double() * 1.5
        scaled = scaled if dtype.is_floating_point else scaled.trunc()
        total = scaled.to(dtype).double().sum(0) * 0.5
        same(out, (total if dtype.is_floating_point else total.trunc()).to(dtype), f"scaled {dtype}")
    x = value(r, (4, 6))
    y = x.clone()
    assert hvd.allreduce_(y, op=hvd.Sum, name="in.place") is y
    same(y, sum_of((4, 6)), "allreduce_ in place")
    same(x, value(r, (4, 6)), "allreduce leaves its input alone")
    view = value(r, (6, 4)).t()  # not contiguous
    hvd.allreduce_(view, op=hvd.Max, name="view")
    same(view, everyone((6, 4)).max(0).values.t(), "allreduce_ through a transposed view")
    expanded = value(r, (1, 3)).expand(4, 3)
    same(hvd.allreduce(expanded, op=hvd.Sum), sum_of((1, 3)).expand(4, 3), "expanded input")
    scalar = hvd.allreduce(torch.tensor(float(r + 1), device=DEVICE), op=hvd.Sum, name="scalar")
    assert scalar.shape == () and scalar.item() == n * (n + 1) / 2, scalar
    empty = hvd.allreduce(torch.empty(0, 3, device=DEVICE), op=hvd.Sum, name="empty")
    assert tuple(empty.shape) == (0, 3)


def check_fused_burst_and_groups() -> None:
    r = hvd.rank()
    shapes = [(i % 5 + 1, 3) for i in range(40)]
    dtypes = [torch.float32 if i % 3 else torch.int64 for i in range(40)]
    handles = [
        hvd.allreduce_async(value(r, s, d, i), op=hvd.Sum, name=f"burst.{i}")
        for i, (s, d) in enumerate(zip(shapes, dtypes))
    ]
    for i, h in enumerate(handles):
        same(hvd.synchronize(h), sum_of(shapes[i], dtypes[i], i), f"burst.{i}")
    tensors = [
        value(r, (3,), torch.float32),
        value(r, (2, 2), torch.int32, 1),
        value(r, (5,), torch.float64, 2),
    ]
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="group")
    for i, (t, out) in enumerate(zip(tensors, outs)):
        same(out, sum_of(tuple(t.shape), t.dtype, i), f"grouped {i}")
    in_place = [value(r, (4,), salt=7), value(r, (2,), salt=8)]
    hvd.grouped_allreduce_(in_place, op=hvd.Max)
    same(in_place[0], everyone((4,), salt=7).max(0).values, "grouped_allreduce_")
    same(in_place[1], everyone((2,), salt=8).max(0).values, "grouped_allreduce_")


def check_fused_batches_in_flight_together() -> None:
    """Steps of fused tensors submitted without waiting in between: several fusion batches are in flight at
    once, and none may pack into a buffer another one still uses."""
    r = hvd.rank()
    handles = {
        (step, i): hvd.allreduce_async(
            value(r, (1 << 15,), salt=step * 10 + i), op=hvd.Sum, name=f"f{step}.{i}"
        )
        for step in range(8)
        for i in range(6)
    }
    for (step, i), h in handles.items():
        same(hvd.synchronize(h), sum_of((1 << 15,), salt=step * 10 + i), f"step {step} tensor {i}")


def check_allgather_rows() -> None:
    r, n = hvd.rank(), hvd.size()
    for dtype in (torch.float32, torch.int16, torch.bool):
        out = hvd.allgather(value(r, (r + 1, 2), dtype), name=f"gather.{dtype}")  # uneven first dimensions
        same(out, torch.cat([value(q, (q + 1, 2), dtype) for q in range(n)]), f"allgather uneven {dtype}")
    even = hvd.allgather(value(r, (2, 3)), name="gather.even")
    same(even, torch.cat([value(q, (2, 3)) for q in range(n)]), "allgather even")
    outs = hvd.grouped_allgather([value(r, (1,)), value(r, (r, 2), torch.int64)], name="gather.group")
    same(outs[0], torch.cat([value(q, (1,)) for q in range(n)]), "grouped allgather 0")
    same(outs[1], torch.cat([value(q, (q, 2), torch.int64) for q in range(n)]), "grouped allgather 1")


def check_broadcast_roots() -> None:
    r, n = hvd.rank(), hvd.size()
    for root in range(n):
        out = hvd.broadcast(value(r, (3, 2), torch.int16), root_rank=root, name=f"bcast.{root}")
        same(out, value(root, (3, 2), torch.int16), f"broadcast from {root}")
    t = value(r, (2, 4)).t()
    hvd.broadcast_(t, root_rank=1, name="bcast.view")
    same(t, value(1, (2, 4)).t(), "broadcast_ into a view")


def check_alltoall_splits() -> None:
    r, n = hvd.rank(), hvd.size()
    rows = [(r + q) % 3 + 1 for q in range(n)]  # rows this rank sends to each rank
    data = value(r, (sum(rows), 2), torch.int16)
    out, received = hvd.alltoall(data, splits=rows, name="a2a")
    sent_by = [[(q + p) % 3 + 1 for p in range(n)] for q in range(n)]
    expected = [value(q, (sum(sent_by[q]), 2), torch.int16)[sum(sent_by[q][:r]) : sum(sent_by[q][: r + 1])]
                for q in range(n)]  # fmt: skip
    same(out, torch.cat(expected), "alltoall with splits")
    assert received.tolist() == [sent_by[q][r] for q in range(n)], received
    even = hvd.alltoall(value(r, (n * 2,)), name="a2a.even")
    same(even, torch.cat([value(q, (n * 2,))[2 * r : 2 * r + 2] for q in range(n)]), "alltoall even")


def check_reducescatter_rows() -> None:
    r, n = hvd.rank(), hvd.size()
    for rows in (7, 6):  # uneven: the first rows % n ranks get one more
        out = hvd.reducescatter(value(r, (rows, 2)), op=hvd.Sum, name=f"rs.{rows}")
        start = sum(rows // n + (1 if q < rows % n else 0) for q in range(r))
        mine = rows // n + (1 if r < rows % n else 0)
        same(out, sum_of((rows, 2))[start : start + mine], f"reducescatter {rows} rows")
    avg = hvd.reducescatter(value(r, (n, 3), torch.int32), op=hvd.Average, name="rs.avg")
    same(
        avg,
        reduced(everyone((n, 3), torch.int32), hvd.Average, torch.int32, n)[r : r + 1],
        "reducescatter avg",
    )
    outs = hvd.grouped_reducescatter([value(r, (n,), torch.int16), value(r, (2 * n, 2))], op=hvd.Sum)
    same(outs[0], sum_of((n,), torch.int16)[r : r + 1], "grouped reducescatter int16")
    same(outs[1], sum_of((2 * n, 2))[2 * r : 2 * r + 2], "grouped reducescatter")


def check_process_set() -> None:
    r = hvd.rank()
    if r in (0, 2):
        out = hvd.allreduce(value(r, (3,)), op=hvd.Sum, name="set.sum", process_set=EVENS)
        same(out, sum_of((3,), ranks=(0, 2)), "allreduce on ranks 0, 2")
        gathered = hvd.allgather(value(r, (r + 1,)), name="set.gather", process_set=EVENS)
        same(gathered, torch.cat([value(0, (1,)), value(2, (3,))]), "allgather on ranks 0, 2")
        b = hvd.broadcast(value(r, (2,)), root_rank=2, name="set.bcast", process_set=EVENS)
        same(b, value(2, (2,)), "broadcast from rank 2 on ranks 0, 2")
    same(hvd.allreduce(value(r, (2,)), op=hvd.Sum, name="after.set"), sum_of((2,)), "global after set")


def check_join() -> None:
    """Rank r runs r + 1 steps of two allreduces (fused), then joins: the joined ranks stand in with zeros."""
    r, n = hvd.rank(), hvd.size()
    for step in range(r + 1):
        a = hvd.allreduce_async(
            torch.full((3,), float(r + 1), device=DEVICE), op=hvd.Sum, name=f"join.a.{step}"
        )
        b = hvd.allreduce_async(
            torch.full((2,), r + 1, dtype=torch.int32, device=DEVICE), op=hvd.Sum, name=f"join.b.{step}"
        )
        active = sum(q + 1 for q in range(n) if q >= step)
        same(hvd.synchronize(a), torch.full((3,), float(active)), f"join step {step}")
        same(hvd.synchronize(b), torch.full((2,), active, dtype=torch.int32), f"join step {step} int")
    assert hvd.join() == n - 1


# ---- scenario: order -------------------------------------------------------------------------------


def check_named_out_of_order_from_threads() -> None:
    """Each rank submits the same named tensors in another order, from three threads."""
    r = hvd.rank()
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            names = list(range(10))
            order = names[r * 3 :] + names[: r * 3] if r % 2 == 0 else names[::-1]
            handles = {}
            for i in order:
                dtype = torch.float32 if i % 2 else torch.int32
                handles[i] = hvd.allreduce_async(value(r, (i + 1, 2), dtype, t), op=hvd.Sum, name=f"t{t}.{i}")
            for i, h in handles.items():
                dtype = torch.float32 if i % 2 else torch.int32
                same(hvd.synchronize(h), sum_of((i + 1, 2), dtype, t), f"t{t}.{i}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]


def check_collectives_in_another_order() -> None:
    """Different collectives submitted in a different order on every rank still meet by name."""
    r, n = hvd.rank(), hvd.size()
    submit = {
        "gather": lambda: hvd.allgather_async(value(r, (r + 1, 2)), name="mix.gather"),
        "bcast": lambda: hvd.broadcast_async(value(r, (4,)), root_rank=n - 1, name="mix.bcast"),
        "sum": lambda: hvd.allreduce_async(value(r, (5,)), op=hvd.Sum, name="mix.sum"),
        "scatter": lambda: hvd.reducescatter_async(value(r, (n, 2)), op=hvd.Sum, name="mix.scatter"),
        "a2a": lambda: hvd.alltoall_async(value(r, (n,)), name="mix.a2a"),
    }
    keys = list(submit)
    order = keys[r:] + keys[:r]
    handles = {k: submit[k]() for k in order}
    same(
        hvd.synchronize(handles["gather"]), torch.cat([value(q, (q + 1, 2)) for q in range(n)]), "mix.gather"
    )
    same(hvd.synchronize(handles["bcast"]), value(n - 1, (4,)), "mix.bcast")
    same(hvd.synchronize(handles["sum"]), sum_of((5,)), "mix.sum")
    same(hvd.synchronize(handles["scatter"]), sum_of((n, 2))[r : r + 1], "mix.scatter")
    out, received = hvd.synchronize(handles["a2a"])
    assert received.tolist() == [1] * n, received
    same(out, torch.stack([value(q, (n,))[r] for q in range(n)]), "mix.a2a")


# ---- scenario: mismatch ----------------------------------------------------------------------------


def ones(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.ones(n, dtype=dtype, device=DEVICE)


def check_mismatches_raise_on_every_rank() -> None:
    """The last rank submits another shape, dtype, reduction, root, collective or placement under a name:
    every rank gets the same HpcdlMismatchError, and the job goes on."""
    r = hvd.rank()
    odd = r == hvd.size() - 1
    odd_dtype = torch.float64 if odd else torch.float32
    cases = {
        "shape": lambda: hvd.allreduce(ones(4 if odd else 3), name="bad.shape"),
        "dtype": lambda: hvd.allreduce(ones(3, odd_dtype), name="bad.dtype"),
        "reduction": lambda: hvd.allreduce(ones(3), op=hvd.Max if odd else hvd.Sum, name="bad.op"),
        "root": lambda: hvd.broadcast(ones(3), root_rank=1 if odd else 0, name="bad.root"),
        "operation": lambda: (hvd.allgather if odd else hvd.allreduce)(ones(3), name="bad.collective"),
        "placement": lambda: (
            engine.synchronize(engine.allreduce_async(np.ones(3, np.float32), name="bad.placement"))
            if odd else hvd.allreduce(ones(3), name="bad.placement")
        ),
    }  # fmt: skip
    for case, call in cases.items():
        try:
            call()
        except HpcdlMismatchError as exc:
            result(case=case, message=str(exc))
        else:
            raise AssertionError(f"a mismatched {case} did not raise")
        out = hvd.allreduce(value(r, (2,)), op=hvd.Sum, name=f"after.{case}")
        same(out, sum_of((2,)), f"allreduce after the {case} mismatch")


# ---- scenario: stall -------------------------------------------------------------------------------


def check_stalled_rank_is_named() -> None:
    """The last rank submits 'late' 2.5 s after the others: the stall inspector (1 s here) names it; the
    operation then completes everywhere."""
    r = hvd.rank()
    if r == hvd.size() - 1:
        time.sleep(2.5)
    out = hvd.allreduce(value(r, (3,)), op=hvd.Sum, name="late")
    same(out, sum_of((3,)), "late")


# ---- scenario: timeline ----------------------------------------------------------------------------


def check_steps_for_the_timeline() -> None:
    """Three steps: a fused group, a tensor above the fusion threshold (alone; from the second step on
    its negotiation is a response-cache hit), then an allgather and a broadcast."""
    r = hvd.rank()
    for step in range(3):
        group = [value(r, (100 + i,), salt=step) for i in range(6)]
        outs = hvd.grouped_allreduce(group, op=hvd.Sum, name="tl.fused")
        for i, out in enumerate(outs):
            same(out, sum_of((100 + i,), salt=step), f"tl.fused.{i}")
        big = hvd.allreduce(value(r, (1 << 19,), salt=step), op=hvd.Sum, name="tl.big")
        same(big, sum_of((1 << 19,), salt=step), "tl.big")
    hvd.allgather(value(r, (2,)), name="tl.gather")
    hvd.broadcast(value(r, (2,)), root_rank=0, name="tl.bcast")


# ---- scenario: lifecycle ---------------------------------------------------------------------------


def check_init_and_shutdown_in_quick_succession() -> None:
    """Jobs started and ended back to back (also renumbered by init(comm=...)): each init() opens the
    process groups' store, and a rank that ends its job at once must not leave another one connecting to a
    store that is gone; a job that a peer already ended starts and stops its executor cleanly."""
    n, world = hvd.size(), hvd.rank()
    for round_ in range(6):
        hvd.shutdown()
        order = list(range(n)) if round_ % 2 else list(reversed(range(n)))
        hvd.init(comm=order)
        if round_ % 3 == 0:
            out = hvd.allreduce(torch.ones(2, device=DEVICE), op=hvd.Sum, name=f"round.{round_}")
            same(out, torch.full((2,), float(n)), f"round {round_}")
        assert hvd.rank() == order.index(world)


# ---- scenario: dead --------------------------------------------------------------------------------


def _die_when_the_next_allreduce_runs() -> None:
    """Fault injection on the victim: its executor kills the process as it is about to start the next
    allreduce, which every rank has submitted and the engine decided: the others' collective is then in
    flight, waiting for a peer that is gone (as a NCCL kernel would)."""
    from hpcdl.common.types import OpType
    from hpcdl.torch._gpu import collectives as _gpu_collectives

    def die(*args: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    _gpu_collectives.RUNNERS[OpType.ALLREDUCE] = die  # type: ignore[assignment]


def dead_rank() -> None:
    """The last rank dies while the others' allreduce runs; they must raise at once, naming it."""
    r, n = hvd.rank(), hvd.size()
    hvd.allreduce(value(r, (1024,)), op=hvd.Sum, name="warm")
    x = value(r, (1 << 16,))
    if r == n - 1:
        _die_when_the_next_allreduce_runs()
        hvd.allreduce(x, op=hvd.Sum, name="doomed")
        raise AssertionError("the victim's allreduce ran")
    started = time.monotonic()
    out: dict[str, object] = {"rank": r}
    try:
        hvd.allreduce(x, op=hvd.Sum, name="doomed")
        for i in range(200):
            hvd.allreduce(x, op=hvd.Sum, name=f"after.{i}")
        out["error"] = None
    except HpcdlError as exc:
        out.update(error=type(exc).__name__, message=str(exc))
    except Exception as exc:  # anything else is what this test exists to rule out
        out.update(error=type(exc).__name__, message=str(exc), foreign=True)
    out["seconds"] = time.monotonic() - started
    result(**out)
    time.sleep(1.0)  # stay alive while the other survivor looks for the dead rank (it would name this one)
    os._exit(0)  # the job is broken: no shutdown with a dead peer


SCENARIOS: dict[str, list[Callable[[], None]]] = {
    "forms": [
        check_runs_on_the_gpu_path,
        check_allreduce_ops_dtypes_and_scaling,
        check_fused_burst_and_groups,
        check_fused_batches_in_flight_together,
        check_allgather_rows,
        check_broadcast_roots,
        check_alltoall_splits,
        check_reducescatter_rows,
        check_process_set,
        check_join,
    ],
    "order": [check_named_out_of_order_from_threads, check_collectives_in_another_order],
    "mismatch": [check_mismatches_raise_on_every_rank],
    "stall": [check_stalled_rank_is_named],
    "timeline": [check_steps_for_the_timeline],
    "lifecycle": [check_init_and_shutdown_in_quick_succession],
}


def main(scenario: str) -> None:
    hvd.init(process_sets=[EVENS] if scenario == "forms" else None)
    if scenario == "dead":
        dead_rank()
    for check in SCENARIOS[scenario]:
        check()
        passed(check)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
