"""Rank-side checks of hpcdl.torch, run by tests/parallel/test_torch_*.py under ``hpcdl run``.

``python torch_rank_checks.py SCENARIO`` runs every check of the scenario on this rank and prints
``PASS <check>`` for each; the first failure raises (the rank exits non-zero and the launcher fails the
job). Every expected value is computed here from the other ranks' inputs, which each rank can rebuild
because they are deterministic functions of the rank.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from typing import Callable

import numpy as np
import torch

import hpcdl.torch as hvd

torch.set_num_threads(1)

Check = Callable[[], None]


def data(rank: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A deterministic tensor that differs per rank and has no ties (for Min/Max)."""
    base = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)
    values = (base * 0.37 + rank * 1.3 + 0.5) % 7.0 - 3.0
    if dtype.is_floating_point:
        return values.to(dtype)
    if dtype == torch.bool:
        return (base.long() + rank) % 3 == 0
    return (values * 3).round().to(dtype)


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor | np.ndarray, what: str, tol: float = 1e-6
) -> None:
    expected = expected.detach() if torch.is_tensor(expected) else torch.as_tensor(np.asarray(expected))
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    )
    a, e = actual.detach().to(torch.float64), expected.to(torch.float64)
    assert torch.allclose(a, e, rtol=tol, atol=tol), f"{what}: {a.flatten()[:8]} != {e.flatten()[:8]}"


def everyone(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> list[np.ndarray]:
    return [data(r, shape, dtype).to(torch.float64).numpy() for r in range(hvd.size())]


# ---- collectives ------------------------------------------------------------------------------------


def check_allreduce_ops_and_dtypes() -> None:
    shape = (3, 5)
    ops = {hvd.Sum: np.sum, hvd.Min: np.min, hvd.Max: np.max, hvd.Product: np.prod}
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.int8):
        inputs = np.stack(everyone(shape, dtype))
        for op, fn in ops.items():
            if op == hvd.Product and dtype == torch.int8:
                continue  # overflows
            out = hvd.allreduce(data(hvd.rank(), shape, dtype), op=op, name=f"ar.{dtype}.{op}")
            assert out.dtype == dtype
            assert_close(out, fn(inputs, axis=0), f"allreduce {dtype} op {op}")
    avg = hvd.allreduce(data(hvd.rank(), shape))  # default op is Average
    assert_close(avg, np.mean(np.stack(everyone(shape)), axis=0), "allreduce default Average", 1e-5)
    for dtype, tol in ((torch.float16, 1e-2), (torch.bfloat16, 5e-2)):
        out = hvd.allreduce(data(hvd.rank(), shape, dtype), op=hvd.Sum)
        assert out.dtype == dtype
        assert_close(out, np.sum(np.stack(everyone(shape, dtype)), axis=0), f"allreduce {dtype}", tol)
    flags = hvd.allreduce(data(hvd.rank(), shape, torch.bool), op=hvd.Max)
    assert_close(flags, np.any(np.stack(everyone(shape, torch.bool)), axis=0), "allreduce bool Max (or)")


def check_allreduce_scaling_and_average_flag() -> None:
    x = data(hvd.rank(), (4,), torch.float64)
    truth = np.sum(np.stack(everyone((4,), torch.float64)), axis=0)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    assert_close(out, truth * 1.5, "prescale/postscale")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert_close(hvd.allreduce(x, average=False), truth, "average=False is Sum")
    try:
        hvd.allreduce(x, average=True, op=hvd.Sum)
    except ValueError as exc:
        assert "supersedes average" in str(exc)
    else:
        raise AssertionError("op and average together must raise")


def check_allreduce_async_inplace_and_noncontiguous() -> None:
    x = data(hvd.rank(), (4, 6))
    truth = np.sum(np.stack(everyone((4, 6))), axis=0)
    handle = hvd.allreduce_async(x, op=hvd.Sum, name="async.sum")
    result = hvd.synchronize(handle)
    assert hvd.poll(handle) is True
    assert_close(result, truth, "allreduce_async")
    assert_close(x, data(hvd.rank(), (4, 6)), "allreduce_async leaves input alone")
    y = data(hvd.rank(), (4, 6))
    returned = hvd.allreduce_(y, op=hvd.Sum)
    assert returned is y
    assert_close(y, truth, "allreduce_ in place")
    t = data(hvd.rank(), (6, 4)).t()  # a non-contiguous view
    hvd.allreduce_(t, op=hvd.Sum, name="noncontig")
    assert_close(t, np.sum(np.stack(everyone((6, 4))), axis=0).T, "allreduce_ on a non-contiguous view")
    h = hvd.allreduce_async_(data(hvd.rank(), (4, 6)), op=hvd.Max)
    while not hvd.poll(h):
        pass
    assert_close(hvd.synchronize(h), np.max(np.stack(everyone((4, 6))), axis=0), "poll then synchronize")
    n = hvd.size()
    scalar = hvd.allreduce(torch.tensor(float(hvd.rank() + 1)), op=hvd.Sum, name="scalar")
    assert scalar.shape == () and scalar.item() == n * (n + 1) / 2, scalar


def check_grouped_allreduce() -> None:
    shapes = [(3,), (2, 2), (5, 1)]
    tensors = [data(hvd.rank(), s) for s in shapes]
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="group")
    for out, shape in zip(outs, shapes):
        assert_close(out, np.sum(np.stack(everyone(shape)), axis=0), f"grouped_allreduce {shape}")
    inplace = [data(hvd.rank(), s) for s in shapes]
    hvd.synchronize(hvd.grouped_allreduce_async_(inplace, op=hvd.Max))
    for t, shape in zip(inplace, shapes):
        assert_close(t, np.max(np.stack(everyone(shape)), axis=0), f"grouped_allreduce_async_ {shape}")


def check_allgather() -> None:
    r = hvd.rank()
    mine = torch.full((r + 1, 3), float(r)) + torch.arange(3.0)
    out = hvd.allgather(mine, name="ag")
    truth = np.concatenate([np.full((k + 1, 3), float(k)) + np.arange(3.0) for k in range(hvd.size())])
    assert_close(out, truth, "allgather with uneven first dims")
    ints = hvd.synchronize(hvd.allgather_async(torch.tensor([r * 10], dtype=torch.int64)))
    assert ints.tolist() == [k * 10 for k in range(hvd.size())]
    outs = hvd.grouped_allgather([mine, torch.tensor([r], dtype=torch.int32)])
    assert_close(outs[0], truth, "grouped_allgather[0]")
    assert outs[1].tolist() == list(range(hvd.size()))


def check_broadcast() -> None:
    root = hvd.size() - 1
    x = data(hvd.rank(), (2, 3))
    out = hvd.broadcast(x, root_rank=root, name="bc")
    assert_close(out, data(root, (2, 3)), "broadcast")
    assert_close(x, data(hvd.rank(), (2, 3)), "broadcast leaves input alone")
    y = data(hvd.rank(), (5,), torch.int64)
    assert hvd.broadcast_(y, root_rank=0) is y
    assert_close(y, data(0, (5,), torch.int64), "broadcast_ in place")
    z = data(hvd.rank(), (3,), torch.float64)
    assert_close(hvd.synchronize(hvd.broadcast_async(z, 1)), data(1, (3,), torch.float64), "broadcast_async")
    try:
        hvd.broadcast(x, root_rank=hvd.size() + 5)
    except ValueError as exc:
        assert "not a member" in str(exc)
    else:
        raise AssertionError("a root outside the job must raise")


def check_alltoall() -> None:
    n, r = hvd.size(), hvd.rank()
    # rank r sends (k + r) % 3 + 1 rows to rank k, each row tagged (sender, receiver)
    splits = [(k + r) % 3 + 1 for k in range(n)]
    rows = [[r * 100 + k] * 2 for k in range(n) for _ in range(splits[k])]
    out, received = hvd.alltoall(torch.tensor(rows, dtype=torch.float32), splits=splits, name="a2a")
    expect_splits = [(r + s) % 3 + 1 for s in range(n)]
    assert received.tolist() == expect_splits, (received, expect_splits)
    truth = [[s * 100 + r] * 2 for s in range(n) for _ in range(expect_splits[s])]
    assert_close(out, np.array(truth, dtype=np.float64), "alltoall with splits")
    even = hvd.alltoall(torch.arange(n * 2, dtype=torch.int64) + 1000 * r)
    assert even.tolist() == [1000 * s + 2 * r + j for s in range(n) for j in range(2)]
    out, received = hvd.synchronize(
        hvd.alltoall_async(torch.tensor(rows, dtype=torch.float32), splits=splits)
    )
    assert received.tolist() == expect_splits


def check_reducescatter() -> None:
    n, r = hvd.size(), hvd.rank()
    rows = 2 * n + 1  # uneven: the first rank gets one extra row
    full = np.sum(np.stack(everyone((rows, 3))), axis=0)
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    start = sum(counts[:r])
    out = hvd.reducescatter(data(r, (rows, 3)), op=hvd.Sum, name="rs")
    assert_close(out, full[start : start + counts[r]], "reducescatter Sum", 1e-5)
    avg = hvd.reducescatter(data(r, (rows, 3)))  # default Average
    assert_close(avg, full[start : start + counts[r]] / n, "reducescatter Average", 1e-5)
    a, b = hvd.grouped_reducescatter([data(r, (rows, 3)), data(r, (n, 2), torch.float64)], op=hvd.Sum)
    assert_close(a, full[start : start + counts[r]], "grouped_reducescatter[0]", 1e-5)
    assert_close(
        b, np.sum(np.stack(everyone((n, 2), torch.float64)), axis=0)[r : r + 1], "grouped_reducescatter[1]"
    )


def check_blocking_calls_without_autograd() -> None:
    """A blocking allgather, alltoall, broadcast or reducescatter of a contiguous tensor that autograd need
    not record is one submission of the tensor itself, without the differentiable Function: right for every
    dtype, 0-d tensors, uneven rows and given splits, mismatches still caught by name; other layouts are
    staged as before and give the same values; a tensor that wants a gradient is still recorded."""
    from hpcdl.torch import ops

    n, r = hvd.size(), hvd.rank()
    functions = (ops._Allgather, ops._Alltoall, ops._Broadcast, ops._Reducescatter)
    originals = {f: f.apply for f in functions}

    def refuse(*args: object) -> None:
        raise AssertionError(
            "a direct call autograd need not record went through the differentiable Function"
        )

    dtypes = (torch.float32, torch.int64, torch.bfloat16, torch.bool)
    direct: dict[tuple[str, torch.dtype], torch.Tensor] = {}
    for f in functions:
        f.apply = refuse
    try:
        for dtype in dtypes:
            x = data(r, (n * 2, 3), dtype)
            everyone_x = [data(k, (n * 2, 3), dtype) for k in range(n)]
            direct["ag", dtype] = hvd.allgather(x, name=f"direct.ag.{dtype}")
            assert torch.equal(direct["ag", dtype], torch.cat(everyone_x)), dtype
            direct["a2a", dtype] = hvd.alltoall(x, name=f"direct.a2a.{dtype}")
            assert torch.equal(direct["a2a", dtype], torch.cat([e[2 * r : 2 * r + 2] for e in everyone_x]))
            direct["bc", dtype] = hvd.broadcast(x, root_rank=n - 1)
            assert torch.equal(direct["bc", dtype], everyone_x[n - 1]), dtype
            assert torch.equal(x, everyone_x[r]), "broadcast changed its input"
            if dtype != torch.bool:
                full = sum(e.to(torch.float64) for e in everyone_x)
                direct["rs", dtype] = hvd.reducescatter(x, op=hvd.Sum, name=f"direct.rs.{dtype}")
                assert_close(direct["rs", dtype], full[2 * r : 2 * r + 2], f"reducescatter {dtype}", 0.1)
        scalar = torch.tensor(float(r))
        assert hvd.broadcast_(scalar, root_rank=1) is scalar and scalar.item() == 1.0
        splits = torch.tensor([(k + r) % 2 + 1 for k in range(n)], dtype=torch.int64)
        out, received = hvd.alltoall(torch.full((int(splits.sum()),), float(r)), splits=splits)
        assert received.dtype == torch.int64 and received.tolist() == [(r + k) % 2 + 1 for k in range(n)]
        assert out.tolist() == [float(k) for k in range(n) for _ in range((r + k) % 2 + 1)]
        rows = hvd.allgather(torch.full((r + 1, 2), r))  # uneven rows: the engine's own buffer, copied out
        assert rows.tolist() == [[k, k] for k in range(n) for _ in range(k + 1)]
        # trailing dimensions that differ between ranks are a mismatch of that name, not a wrong result
        try:
            hvd.allgather(torch.zeros(2, 2 + (r == 0)), name="direct.mismatch")
        except hvd.HorovodInternalError as exc:
            assert "direct.mismatch" in str(exc), str(exc)
        else:
            raise AssertionError("an allgather whose trailing dimensions differ must raise")
        hvd.barrier()
    finally:
        for f, apply in originals.items():
            f.apply = apply
    for dtype in dtypes:  # a transposed view: staged by the launcher, the same values
        wide = data(r, (n * 2, 3), dtype).t().contiguous().t()  # the same values, column-major
        assert not wide.is_contiguous() and torch.equal(wide, data(r, (n * 2, 3), dtype))
        assert torch.equal(hvd.allgather(wide), direct["ag", dtype]), dtype
        assert torch.equal(hvd.alltoall(wide), direct["a2a", dtype]), dtype
        assert torch.equal(hvd.broadcast(wide, root_rank=n - 1), direct["bc", dtype]), dtype
        if dtype != torch.bool:
            assert torch.equal(hvd.reducescatter(wide, op=hvd.Sum), direct["rs", dtype]), dtype
    wants_grad = data(r, (n, 2)).requires_grad_()
    assert hvd.allgather(wants_grad).grad_fn is not None
    assert hvd.reducescatter(wants_grad).grad_fn is not None
    assert hvd.alltoall(wants_grad).grad_fn is not None
    assert hvd.broadcast(wants_grad, root_rank=0).grad_fn is not None
    with torch.no_grad():
        assert hvd.allgather(wants_grad).grad_fn is None


def check_fp16_compression() -> None:
    x = data(hvd.rank(), (16,))
    out = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert out.dtype == torch.float32
    assert_close(out, np.sum(np.stack(everyone((16,))), axis=0), "fp16-compressed allreduce", 1e-2)


def check_sparse_allreduce() -> None:
    r, n = hvd.rank(), hvd.size()
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[r, n]]), torch.tensor([1.0 + r, 2.0]), (n + 1,), check_invariants=True
    )
    result = hvd.sparse_allreduce_async(sparse, name="sparse", op=hvd.Sum)()
    dense = result.to_dense()
    truth = np.zeros(n + 1)
    truth[:n] = np.arange(n) + 1.0
    truth[n] = 2.0 * n
    assert_close(dense, truth, "sparse_allreduce_async")


def check_gradients() -> None:
    r, n = hvd.rank(), hvd.size()
    # allreduce: gradient is the same allreduce (Sum) of the incoming gradients
    a = torch.ones(3, requires_grad=True)
    (hvd.allreduce(a, op=hvd.Sum, name="g.ar") * (r + 1)).sum().backward()
    assert_close(a.grad, np.full(3, sum(k + 1 for k in range(n))), "allreduce grad")
    # allgather: Average of incoming gradients, sliced to this rank's rows
    b = torch.ones(r + 1, 2, requires_grad=True)
    gathered = hvd.allgather(b, name="g.ag")
    weights = torch.arange(gathered.shape[0], dtype=torch.float32).unsqueeze(1) * (r + 1)
    (gathered * weights).sum().backward()
    offset = sum(k + 1 for k in range(r))
    mean_factor = np.mean([k + 1 for k in range(n)])
    expect = np.repeat((np.arange(offset, offset + r + 1) * mean_factor)[:, None], 2, axis=1)
    assert_close(b.grad, expect, "allgather grad")
    # broadcast: Average-allreduce of incoming gradients on the root, zero elsewhere
    c = torch.ones(4, requires_grad=True)
    (hvd.broadcast(c, root_rank=0, name="g.bc") * (r + 1)).sum().backward()
    expect = np.full(4, mean_factor) if r == 0 else np.zeros(4)
    assert_close(c.grad, expect, "broadcast grad")
    # alltoall: gradient travels back along the same splits
    d = torch.ones(n, requires_grad=True)
    out = hvd.alltoall(d, name="g.a2a")
    (out * (r + 1)).sum().backward()
    assert_close(d.grad, np.arange(n) + 1.0, "alltoall grad")
    # reducescatter (Sum): allgather of incoming gradients times the set size
    e = torch.ones(n, 2, requires_grad=True)
    (hvd.reducescatter(e, op=hvd.Sum, name="g.rs") * (r + 1)).sum().backward()
    assert_close(e.grad, np.repeat((np.arange(n) + 1.0)[:, None] * n, 2, axis=1), "reducescatter grad")


def check_objects() -> None:
    r = hvd.rank()
    payload = {"rank": r, "text": "x" * (r * 1000), "array": np.arange(r + 2)}
    got = hvd.broadcast_object(payload, root_rank=1)
    assert got["rank"] == 1 and got["text"] == "x" * 1000 and got["array"].tolist() == [0, 1, 2]
    gathered = hvd.allgather_object((r, "y" * r))
    assert gathered == [(k, "y" * k) for k in range(hvd.size())]


def check_parameters_and_optimizer_state() -> None:
    r = hvd.rank()
    torch.manual_seed(100 + r)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    torch.manual_seed(100)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1))
    for (name, mine), (_, ref) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert_close(mine, ref, f"broadcast_parameters {name}", 0)
    named = [(n, p.detach().clone() + r) for n, p in model.named_parameters()]
    hvd.broadcast_parameters(named, root_rank=1)
    for (name, p), (_, ref) in zip(named, reference.named_parameters()):
        assert_close(p, ref.detach() + 1, f"broadcast_parameters list {name}", 1e-6)

    optimizer = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
    model(torch.randn(8, 4) + r).sum().backward()
    optimizer.step()  # rank-specific moments
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    moments = torch.cat([s["exp_avg"].flatten() for s in optimizer.state.values()])
    assert_close(hvd.broadcast(moments, 0), moments, "broadcast_optimizer_state moments", 0)
    assert optimizer.param_groups[0]["lr"] == 0.01, optimizer.param_groups[0]["lr"]
    fresh = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    hvd.broadcast_optimizer_state(fresh, root_rank=0)  # empty state: initialized, then broadcast
    assert fresh.param_groups[0]["lr"] == 0.1


def check_optimizer_errors() -> None:
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    x = torch.ones(2, 3)
    model(x).sum().backward()
    try:
        model(x).sum().backward()
    except AssertionError as exc:
        assert str(exc) == (
            "Gradients were computed more than backward_passes_per_step times before call to step(). "
            "Increase backward_passes_per_step to accumulate gradients locally."
        ), str(exc)
    else:
        raise AssertionError("a second backward before step() must raise")
    try:
        opt.zero_grad()
    except AssertionError as exc:
        assert str(exc) == (
            "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
            "optimizer.synchronize(). This is prohibited as it can cause a race condition."
        ), str(exc)
    else:
        raise AssertionError("zero_grad() between backward() and step() must raise")
    opt.step()
    opt.zero_grad()
    assert type(opt).__name__ == "SGD" and isinstance(opt, torch.optim.SGD)
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=0)
    except ValueError as exc:
        assert "backward_passes_per_step must be > 0" in str(exc)
    else:
        raise AssertionError("backward_passes_per_step=0 must raise")


def check_skip_synchronize_and_clipping() -> None:
    torch.manual_seed(7)
    model = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(model.state_dict(), 0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    model(torch.full((2, 3), float(hvd.rank() + 1))).sum().backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with opt.skip_synchronize():
        opt.step()
    weights = hvd.allgather(model.weight.detach().reshape(1, -1))
    assert_close(weights[0], weights[-1], "same weights after synchronize/clip/step", 0)


def check_mismatch_is_a_clear_error() -> None:
    shape = (3,) if hvd.rank() == 0 else (4,)
    try:
        hvd.allreduce(torch.ones(shape), name="mismatched.shape")
    except hvd.HorovodInternalError as exc:
        assert "mismatched.shape" in str(exc), str(exc)
    else:
        raise AssertionError("different shapes under one name must raise HorovodInternalError")
    hvd.barrier()


def check_bad_input_is_a_clear_error() -> None:
    cases = [
        (lambda: hvd.allreduce([1.0, 2.0]), "allreduce takes a torch.Tensor, got list"),
        (lambda: hvd.allgather(torch.tensor(1.0)), "got a 0-d tensor; reshape it"),
        (lambda: hvd.alltoall(torch.ones(hvd.size() + 1)), "do not divide among"),
        (lambda: hvd.alltoall(torch.ones(2), splits=[5] * hvd.size()), "sum to the tensor's first dimension"),
        (lambda: hvd.allreduce(torch.ones(1, dtype=torch.complex64)), "not supported by hpcdl collectives"),
        (lambda: hvd.grouped_allreduce([]), "non-empty list of tensors"),
    ]
    for call, message in cases:
        try:
            call()
        except ValueError as exc:
            assert message in str(exc), str(exc)
        else:
            raise AssertionError(f"expected ValueError mentioning {message!r}")
    hvd.barrier()


def check_timeline() -> None:
    path = os.path.join(tempfile.gettempdir(), f"hpcdl-torch-timeline-{os.getpid()}.json")
    path = hvd.broadcast_object(path, root_rank=0)
    hvd.start_timeline(path)
    hvd.allreduce(torch.ones(8), name="timeline.tensor")
    hvd.stop_timeline()
    if hvd.rank() == 0:
        with open(path) as f:
            text = f.read()
        assert "timeline.tensor" in text, text[:200]
        os.unlink(path)
    hvd.barrier()


def check_topology_and_build_facts() -> None:
    assert hvd.is_initialized()
    assert 0 <= hvd.rank() < hvd.size()
    assert 0 <= hvd.local_rank() < hvd.local_size()
    assert hvd.cross_size() >= 1 and hvd.is_homogeneous() in (True, False)
    assert isinstance(hvd.mpi_built(), bool) and isinstance(hvd.gloo_built(), bool)
    assert hvd.nccl_built() == (torch.distributed.is_available() and torch.distributed.is_nccl_available())
    assert hvd.cuda_built() == (torch.version.cuda is not None)
    assert hvd.ddl_built() is False and hvd.ccl_built() is False
    assert hvd.HorovodInternalError is hvd.HpcdlInternalError
    ranks = hvd.allgather(torch.tensor([hvd.rank()]))
    assert ranks.tolist() == list(range(hvd.size()))


def check_metrics_and_warmup() -> None:
    r, n = hvd.rank(), hvd.size()
    assert abs(hvd.metric_average(float(r), name="m.avg") - (n - 1) / 2) < 1e-12
    metric = hvd.Metric("loss")
    metric.update(torch.tensor(float(r)), n=r + 1)
    weighted = sum(k * (k + 1) for k in range(n)) / sum(k + 1 for k in range(n))
    assert abs(metric.avg - weighted) < 1e-12


# ---- process sets (3 ranks) ------------------------------------------------------------------------


def check_process_sets() -> None:
    r = hvd.rank()
    evens, odds = SETS["evens"], SETS["odds"]
    assert evens.ranks == [0, 2] and odds.ranks == [1]
    assert evens.included() == (r in (0, 2))
    if r in (0, 2):
        assert evens.size() == 2 and evens.rank() == (0 if r == 0 else 1)
        out = hvd.allreduce(data(r, (3,)), op=hvd.Sum, process_set=evens, name="ps.sum")
        assert_close(out, data(0, (3,)) + data(2, (3,)), "allreduce in process set")
        got = hvd.broadcast(data(r, (2,)), root_rank=2, process_set=evens)
        assert_close(got, data(2, (2,)), "broadcast in process set (global root)")
        gathered = hvd.allgather(torch.tensor([r]), process_set=evens)
        assert gathered.tolist() == [0, 2]
        assert hvd.broadcast_object(f"from {r}", root_rank=2, process_set=evens) == "from 2"
        hvd.barrier(process_set=evens)
    else:
        out = hvd.allreduce(data(r, (3,)), op=hvd.Sum, process_set=odds)
        assert_close(out, data(r, (3,)), "single-rank set")
    # An optimizer reducing over the evens only; rank 1 is outside the set and just steps locally.
    weight = torch.nn.Parameter(torch.zeros(2))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([weight], lr=1.0), named_parameters=[("w", weight)], process_set=evens, groups=1
    )
    (weight * float(r + 1)).sum().backward()
    opt.step()
    expected = -(1.0 + 3.0) / 2 if r in (0, 2) else -2.0
    assert_close(weight.detach(), torch.full((2,), expected), "DistributedOptimizer on a process set")
    try:
        hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0, 1]))
    except ValueError as exc:
        assert "not registered" in str(exc)
    else:
        raise AssertionError("an unregistered process set must raise")
    hvd.barrier()


def check_init_with_a_comm_list_renumbers_the_ranks() -> None:
    """init(comm=[...]) in another order: a rank is its position in the list, as in Horovod."""
    n, world = hvd.size(), hvd.rank()
    hvd.shutdown()
    hvd.init(comm=list(reversed(range(n))))
    assert hvd.is_initialized() and hvd.size() == n and hvd.rank() == n - 1 - world
    assert hvd.allgather_object(world) == list(reversed(range(n)))
    hvd.shutdown()
    hvd.init(comm=list(range(n)))
    assert hvd.rank() == world


def check_dynamic_process_sets() -> None:
    hvd.shutdown()
    hvd.init(process_sets="dynamic")
    r = hvd.rank()
    pair = hvd.add_process_set([0, 1])
    assert pair.process_set_id is not None and pair.ranks == [0, 1]
    if r in (0, 1):
        out = hvd.allreduce(torch.tensor([float(r + 1)]), op=hvd.Sum, process_set=pair)
        assert out.tolist() == [3.0]
    assert hvd.remove_process_set(pair) is True
    assert pair.process_set_id is None
    assert hvd.remove_process_set(hvd.global_process_set) is False
    hvd.barrier()


def check_adasum_rejected_on_three_ranks() -> None:
    try:
        hvd.allreduce(torch.ones(2), op=hvd.Adasum)
    except NotImplementedError as exc:
        assert "power of 2" in str(exc)
    else:
        raise AssertionError("Adasum on 3 ranks must raise")


# ---- adasum, join, SyncBatchNorm (2 ranks) ----------------------------------------------------------


def check_adasum() -> None:
    r = hvd.rank()
    vectors = [np.array([1.0, 2.0, 0.0, 1.0]), np.array([0.5, -1.0, 3.0, 2.0])]
    out = hvd.allreduce(torch.tensor(vectors[r]), op=hvd.Adasum, name="adasum")
    a, b = vectors
    dot = a @ b
    truth = (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b
    assert_close(out, truth, "Adasum of two vectors", 1e-12)
    orthogonal = hvd.allreduce(torch.tensor([1.0, 0.0] if r == 0 else [0.0, 1.0]), op=hvd.Adasum)
    assert_close(orthogonal, np.array([1.0, 1.0]), "Adasum of orthogonal vectors is their sum")
    model = torch.nn.Linear(2, 1, bias=False)
    hvd.broadcast_parameters(model.state_dict(), 0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)
    opt.zero_grad()
    before = model.weight.detach().clone()
    model(torch.tensor([[1.0, 0.0]]) if r == 0 else torch.tensor([[0.0, 1.0]])).sum().backward()
    opt.step()
    # orthogonal deltas (-0.1, 0) and (0, -0.1): Adasum adds them
    assert_close(model.weight.detach(), before + torch.tensor([[-0.1, -0.1]]), "Adasum optimizer step")


def check_join_with_uneven_batches() -> None:
    r = hvd.rank()
    model = torch.nn.Linear(2, 1, bias=False)
    hvd.broadcast_parameters(model.state_dict(), 0)
    initial = model.weight.detach().clone()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5), model.named_parameters(), op=hvd.Sum
    )
    batches = 2 if r == 0 else 4
    for _ in range(batches):
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()  # gradient of every weight is 1 on each rank
        opt.step()
    last = hvd.join()
    assert last == 1, last
    # steps 1-2: both ranks contribute 1 (Sum = 2); steps 3-4: rank 0 has joined and contributes zeros.
    expected = initial - 0.5 * (2 + 2) if r == 0 else initial - 0.5 * (2 + 2 + 1 + 1)
    assert_close(model.weight.detach(), expected, "parameters after join", 1e-6)
    hvd.barrier()


def check_sync_batch_norm() -> None:
    r, n = hvd.rank(), hvd.size()
    gen = torch.Generator().manual_seed(11)
    full = torch.randn(4 * n, 3, 5, generator=gen, dtype=torch.float64) * 2 + 1
    upstream = torch.randn(4 * n, 3, 5, generator=gen, dtype=torch.float64)
    reference = torch.nn.BatchNorm1d(3).double()
    with torch.no_grad():
        reference.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        reference.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    sync = hvd.SyncBatchNorm(3).double()
    sync.load_state_dict(reference.state_dict())
    x_full = full.clone().requires_grad_(True)
    expected = reference(x_full)
    (expected * upstream).sum().backward()
    mine = slice(4 * r, 4 * (r + 1))
    x = full[mine].clone().requires_grad_(True)
    y = sync(x)
    (y * upstream[mine]).sum().backward()
    assert_close(y, expected[mine], "SyncBN output", 1e-10)
    assert_close(x.grad, x_full.grad[mine], "SyncBN input grad", 1e-10)
    assert_close(
        hvd.allreduce(sync.weight.grad, op=hvd.Sum), reference.weight.grad, "SyncBN weight grad", 1e-10
    )
    assert_close(sync.running_mean, reference.running_mean, "SyncBN running_mean", 1e-10)
    assert_close(sync.running_var, reference.running_var, "SyncBN running_var", 1e-10)
    sync.eval()
    reference.eval()
    with torch.no_grad():
        assert_close(sync(full[mine]), reference(full)[mine], "SyncBN eval", 1e-10)


def check_elastic_run_restores_and_reinitializes() -> None:
    torch.manual_seed(hvd.rank())  # ranks start different: the first sync makes them equal
    model = torch.nn.Linear(2, 1)
    state = hvd.elastic.TorchState(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), epoch=0
    )
    calls = []

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> int:
        calls.append(state.epoch)
        while state.epoch < 4:
            with torch.no_grad():
                state.model.weight.add_(1.0)
            state.epoch += 1
            if state.epoch == 2 and len(calls) == 1:
                raise hvd.HorovodInternalError("simulated loss of a peer")  # before commit: epoch 2 is lost
            state.commit()
        return state.epoch

    assert train(state) == 4
    assert calls == [0, 1], calls  # restarted from the last commit (epoch 1) after re-initialization
    weights = hvd.allgather(model.weight.detach())
    assert_close(weights[0], weights[-1], "elastic: same weights on all ranks", 0)
    torch.manual_seed(0)
    assert_close(
        model.weight.detach(), torch.nn.Linear(2, 1).weight.detach() + 4.0, "elastic: 4 committed epochs"
    )


def check_elastic_sampler_shards_and_resumes() -> None:
    n, r = hvd.size(), hvd.rank()
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    assert list(sampler) == list(range(10))[r::n] and len(sampler) == 10 // n
    everyone = hvd.allgather_object(list(sampler))
    assert sorted(i for shard in everyone for i in shard) == list(range(10))
    sampler.record_batch(0, 2)  # every rank processed 2 samples: 2 * n are done
    sampler.load_state_dict(hvd.broadcast_object(sampler.state_dict()))
    remaining = list(range(2 * n, 10))
    assert list(sampler) == (remaining + remaining[: (-len(remaining)) % n])[r::n]
    sampler.set_epoch(1)
    assert len(sampler) == 10 // n


# ---- training equivalence (2 ranks) -----------------------------------------------------------------


def _make_model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to(dtype)


def _train(
    distributed: bool, make_optimizer, passes: int, steps: int, dtype: torch.dtype, compression
) -> list:
    """Train on batches of (passes × N·B) samples; the distributed model sees only its rank's B rows of
    each micro-batch. Returns the final parameters."""
    n, r, per_rank = hvd.size(), hvd.rank(), 4
    model = _make_model(dtype)
    optimizer = make_optimizer(model.parameters())
    if distributed:
        optimizer = hvd.DistributedOptimizer(
            optimizer, model.named_parameters(), compression=compression, backward_passes_per_step=passes
        )
        hvd.broadcast_parameters(model.state_dict(), 0)
        hvd.broadcast_optimizer_state(optimizer, 0)
    warmup = hvd.LearningRateWarmup(optimizer, warmup_epochs=2, steps_per_epoch=2, world_size=n)
    gen = torch.Generator().manual_seed(99)
    for step in range(steps):
        warmup.step(step // 2, step % 2)
        optimizer.zero_grad()
        for _ in range(passes):
            x = torch.randn(n * per_rank, 6, generator=gen, dtype=dtype)
            y = torch.randn(n * per_rank, 2, generator=gen, dtype=dtype)
            if distributed:
                x, y = x[r * per_rank : (r + 1) * per_rank], y[r * per_rank : (r + 1) * per_rank]
            torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def _equivalence(
    name: str, make_optimizer, passes: int, dtype=torch.float64, compression=None, tol=1e-9
) -> None:
    compression = compression or hvd.Compression.none
    single = _train(False, make_optimizer, passes, 6, dtype, compression)
    multi = _train(True, make_optimizer, passes, 6, dtype, compression)
    for k, (a, b) in enumerate(zip(multi, single)):
        assert_close(a, b, f"{name}: parameter {k} vs one rank with the whole batch", tol)
    moved = sum(
        float((a - b).abs().sum())
        for a, b in zip(single, [p.detach() for p in _make_model(dtype).parameters()])
    )
    assert moved > 1e-3, f"{name}: training did not change the parameters"


def check_equivalence_sgd_momentum() -> None:
    _equivalence("SGD-momentum", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), passes=1)


def check_equivalence_sgd_momentum_two_passes() -> None:
    _equivalence("SGD-momentum x2 passes", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), passes=2)


def check_equivalence_adam() -> None:
    _equivalence("Adam", lambda p: torch.optim.Adam(p, lr=0.01), passes=1)


def check_equivalence_adam_two_passes() -> None:
    _equivalence("Adam x2 passes", lambda p: torch.optim.Adam(p, lr=0.01), passes=2)


def check_equivalence_fp16_compression() -> None:
    _equivalence(
        "SGD-momentum fp16",
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        passes=1,
        dtype=torch.float32,
        compression=hvd.Compression.fp16,
        tol=3e-3,
    )


def check_grouped_optimizer_sums_gradients() -> None:
    r = hvd.rank()
    model = _make_model(torch.float64)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), groups=2, op=hvd.Sum
    )
    model(torch.full((2, 6), float(r + 1), dtype=torch.float64)).sum().backward()
    opt.synchronize()
    grads = [p.grad.clone() for p in model.parameters()]
    ref = _make_model(torch.float64)
    ref(torch.full((2, 6), 1.0, dtype=torch.float64)).sum().backward()
    ref2 = _make_model(torch.float64)
    ref2(torch.full((2, 6), 2.0, dtype=torch.float64)).sum().backward()
    for g, a, b in zip(grads, ref.parameters(), ref2.parameters()):
        assert_close(g, a.grad + b.grad, "grouped allreduce of gradients", 1e-10)
    with opt.skip_synchronize():
        opt.step()


# ---- CUDA tensors (NCCL or staged through host memory; only where a GPU is present) -----------------


def _device() -> torch.device:
    return torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())


def check_cuda_collectives() -> None:
    r, n, dev = hvd.rank(), hvd.size(), _device()
    x = data(r, (3, 4)).to(dev)
    out = hvd.allreduce(x, op=hvd.Sum)
    assert out.device == dev
    assert_close(out.cpu(), np.sum(np.stack(everyone((3, 4))), axis=0), "cuda allreduce Sum", 1e-5)
    assert_close(hvd.allreduce(x).cpu(), np.mean(np.stack(everyone((3, 4))), axis=0), "cuda Average", 1e-5)
    y = data(r, (5,), torch.int64).to(dev)
    hvd.allreduce_(y, op=hvd.Max)
    assert_close(y.cpu(), np.max(np.stack(everyone((5,), torch.int64)), axis=0), "cuda allreduce_ Max")
    a, b = hvd.grouped_allreduce([x, x.double()], op=hvd.Sum)
    assert a.dtype == torch.float32 and b.dtype == torch.float64
    assert_close(b.cpu(), np.sum(np.stack(everyone((3, 4))), axis=0), "cuda grouped allreduce", 1e-5)
    gathered = hvd.allgather(torch.full((r + 1, 2), float(r), device=dev))
    assert gathered.device == dev
    assert gathered[:, 0].tolist() == [float(k) for k in range(n) for _ in range(k + 1)]
    assert_close(hvd.broadcast(x, root_rank=n - 1).cpu(), data(n - 1, (3, 4)), "cuda broadcast")
    splits = [k + 1 for k in range(n)]
    rows = torch.tensor([[r * 10 + k] for k in range(n) for _ in range(splits[k])], device=dev)
    got, received = hvd.alltoall(rows, splits=splits)
    assert received.tolist() == [r + 1] * n
    assert got[:, 0].tolist() == [s * 10 + r for s in range(n) for _ in range(r + 1)]
    part = hvd.reducescatter(data(r, (2 * n, 3)).to(dev), op=hvd.Sum)
    truth = np.sum(np.stack(everyone((2 * n, 3))), axis=0)[2 * r : 2 * r + 2]
    assert_close(part.cpu(), truth, "cuda reducescatter", 1e-5)


def check_cuda_training_equivalence() -> None:
    dev = _device()
    n, r, per_rank = hvd.size(), hvd.rank(), 4
    results = []
    for distributed in (False, True):
        model = _make_model(torch.float64).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if distributed:
            opt = hvd.DistributedOptimizer(opt, model.named_parameters())
        gen = torch.Generator().manual_seed(5)
        for _ in range(4):
            x = torch.randn(n * per_rank, 6, generator=gen, dtype=torch.float64)
            y = torch.randn(n * per_rank, 2, generator=gen, dtype=torch.float64)
            if distributed:
                x, y = x[r * per_rank : (r + 1) * per_rank], y[r * per_rank : (r + 1) * per_rank]
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev)).backward()
            opt.step()
        results.append([p.detach().cpu() for p in model.parameters()])
    for k, (a, b) in enumerate(zip(*results)):
        assert_close(b, a, f"cuda training parameter {k}", 1e-9)


def check_predivide_factor_and_changing_passes() -> None:
    r = hvd.rank()
    model = _make_model(torch.float64)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), gradient_predivide_factor=4.0
    )
    opt.set_backward_passes_per_step(2)
    for _ in range(2):  # two local passes, one reduction
        model(torch.full((2, 6), float(r + 1), dtype=torch.float64)).sum().backward()
    opt.synchronize()
    grads = [p.grad.clone() for p in model.parameters()]
    refs = []
    for value in (1.0, 2.0):
        ref = _make_model(torch.float64)
        ref(torch.full((2, 6), value, dtype=torch.float64)).sum().backward()
        refs.append([p.grad for p in ref.parameters()])
    # rank r accumulates 2·g(r + 1); the average over the two ranks is g(1) + g(2)
    for g, a, b in zip(grads, *refs):
        assert_close(g, a + b, "predivided average of two accumulated passes", 1e-10)
    with opt.skip_synchronize():
        opt.step()
    try:
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum, gradient_predivide_factor=2.0
        )
    except ValueError as exc:
        assert "gradient_predivide_factor not supported with op != Average" in str(exc)
    else:
        raise AssertionError("predivide with Sum must raise")


def check_sparse_gradients_in_the_optimizer() -> None:
    r, n = hvd.rank(), hvd.size()
    rows = [torch.tensor([0, 2]), torch.tensor([2, 3])]  # rank k looks up rows[k % 2]
    for sparse_as_dense in (False, True):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(5, 3, sparse=True)
        start = emb.weight.detach().clone()
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(emb.parameters(), lr=1.0),
            named_parameters=emb.named_parameters(),
            sparse_as_dense=sparse_as_dense,
        )
        emb(rows[r % 2]).sum().backward()
        opt.step()
        expected = start.clone()
        for k in range(n):
            expected[rows[k % 2]] -= 1.0 / n  # the average of every rank's sparse gradient
        assert_close(emb.weight.detach(), expected, f"sparse gradients (sparse_as_dense={sparse_as_dense})")


SCENARIOS: dict[str, list[Check]] = {
    "collectives": [
        check_topology_and_build_facts,
        check_allreduce_ops_and_dtypes,
        check_allreduce_scaling_and_average_flag,
        check_allreduce_async_inplace_and_noncontiguous,
        check_grouped_allreduce,
        check_allgather,
        check_broadcast,
        check_alltoall,
        check_reducescatter,
        check_blocking_calls_without_autograd,
        check_fp16_compression,
        check_sparse_allreduce,
        check_gradients,
        check_objects,
        check_parameters_and_optimizer_state,
        check_optimizer_errors,
        check_skip_synchronize_and_clipping,
        check_metrics_and_warmup,
        check_mismatch_is_a_clear_error,
        check_bad_input_is_a_clear_error,
        check_timeline,
        check_process_sets,
        check_adasum_rejected_on_three_ranks,
        check_init_with_a_comm_list_renumbers_the_ranks,
        check_dynamic_process_sets,
    ],
    "training": [
        check_equivalence_sgd_momentum,
        check_equivalence_sgd_momentum_two_passes,
        check_equivalence_adam,
        check_equivalence_adam_two_passes,
        check_equivalence_fp16_compression,
        check_grouped_optimizer_sums_gradients,
        check_predivide_factor_and_changing_passes,
        check_sparse_gradients_in_the_optimizer,
        check_adasum,
        check_join_with_uneven_batches,
        check_sync_batch_norm,
        check_elastic_run_restores_and_reinitializes,
        check_elastic_sampler_shards_and_resumes,
    ],
    "cuda": [check_cuda_collectives, check_cuda_training_equivalence],
    "distributed_path": [
        check_allreduce_ops_and_dtypes,
        check_allreduce_async_inplace_and_noncontiguous,
        check_grouped_allreduce,
        check_allgather,
        check_broadcast,
        check_alltoall,
        check_reducescatter,
        check_gradients,
        check_equivalence_sgd_momentum,
        check_equivalence_adam_two_passes,
        check_sync_batch_norm,
    ],
}

SETS: dict[str, hvd.ProcessSet] = {}


def main(scenario: str) -> None:
    checks = SCENARIOS[scenario]
    if scenario == "collectives":
        SETS.update(evens=hvd.ProcessSet([2, 0]), odds=hvd.ProcessSet([1]))
        hvd.init(process_sets=list(SETS.values()))
    else:
        hvd.init()
    for check in checks:
        check()
        print(f"PASS {check.__name__}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
