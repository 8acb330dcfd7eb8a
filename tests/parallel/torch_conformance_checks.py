"""Rank-side checks of hpcdl.torch against Horovod's contract, run by ``test_torch_conformance.py`` and
``test_torch_asan.py`` under real launchers: every tensor layout through every collective and form, the
gradient of every differentiable op, and the errors users meet (their classes, that every rank
concerned raises, and that the runtime stays usable afterwards).

``python torch_conformance_checks.py SCENARIO`` runs the scenario's checks and prints ``PASS <check>``
for each; the first failure raises (the rank exits non-zero). Every rank can rebuild every other rank's
input (a deterministic function of the rank), so expected values are computed here, independently of the
code under test.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Callable

import torch

import hpcdl.common as hc
import hpcdl.torch as hvd

torch.set_num_threads(1)

Check = Callable[[], None]


def data(rank: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Integer-valued numbers that differ per rank and position: sums are exact in any order."""
    n = 1
    for d in shape:
        n *= d
    base = torch.arange(n, dtype=torch.float64).reshape(shape)
    return ((base * 7 + rank * 13) % 23 - 11).to(dtype)


def same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    )
    assert torch.equal(actual, expected), (
        f"{what}: {actual.flatten()[:6].tolist()} != {expected.flatten()[:6].tolist()}"
    )


def raises(kind: type[BaseException], call: Callable[[], object], what: str) -> BaseException:
    try:
        call()
    except kind as exc:
        return exc
    raise AssertionError(f"{what}: expected {kind.__name__}")


# ---- layouts ---------------------------------------------------------------------------------------


# The shape every layout check uses: 4-D (for channels_last), its first dimension divides evenly among
# the ranks (alltoall, reducescatter).
def shape() -> tuple[int, int, int, int]:
    return (2 * hvd.size(), 3, 2, 2)


def layout(name: str, rank: int, s: tuple[int, ...]) -> torch.Tensor:
    """A tensor of shape ``s`` in the named memory layout, its values a function of the rank."""
    if name == "contiguous":
        return data(rank, s)
    if name == "offset":  # contiguous, but starting inside its storage
        return data(rank, (s[0] + 1, *s[1:]))[1:]
    if name == "transposed":
        return data(rank, tuple(reversed(s))).permute(*reversed(range(len(s))))
    if name == "sliced":  # every other row: a stride twice the row
        return data(rank, (2 * s[0], *s[1:]))[::2]
    if name == "narrowed":  # a slice along the last dimension: rows with gaps
        return data(rank, (*s[:-1], s[-1] + 3))[..., 1 : s[-1] + 1]
    if name == "expanded":  # stride 0 along the first dimension
        return data(rank, (1, *s[1:])).expand(s)
    if name == "channels_last":
        return data(rank, s).contiguous(memory_format=torch.channels_last)
    raise ValueError(name)


LAYOUTS = ["contiguous", "offset", "transposed", "sliced", "narrowed", "expanded", "channels_last"]
WRITABLE = [n for n in LAYOUTS if n != "expanded"]


def writable_view(name: str, rank: int, s: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(base, view): a view in the named layout into a base tensor the test can inspect afterwards."""
    if name == "offset":
        base = data(rank, (s[0] + 1, *s[1:]))
        return base, base[1:]
    if name == "transposed":
        base = data(rank, tuple(reversed(s)))
        return base, base.permute(*reversed(range(len(s))))
    if name == "sliced":
        base = data(rank, (2 * s[0], *s[1:]))
        return base, base[::2]
    if name == "narrowed":
        base = data(rank, (*s[:-1], s[-1] + 3))
        return base, base[..., 1 : s[-1] + 1]
    base = layout(name, rank, s)
    return base, base


def everyone(name: str, s: tuple[int, ...], ranks: list[int]) -> list[torch.Tensor]:
    return [layout(name, r, s).contiguous() for r in ranks]


def reference_sets() -> Iterator[tuple[str, hvd.ProcessSet, list[int]]]:
    """The global set, and the set of even ranks (a subset, with a global root for broadcasts)."""
    yield "global", hvd.global_process_set, list(range(hvd.size()))
    evens = SETS["evens"]
    if hvd.rank() in evens.ranks:
        yield "evens", evens, list(evens.ranks)


def check_layouts_out_of_place() -> None:
    s, r = shape(), hvd.rank()
    for set_name, ps, ranks in reference_sets():
        n, me = len(ranks), ranks.index(r)
        for name in LAYOUTS:
            what = f"{name} ({set_name})"
            x = layout(name, r, s)
            inputs = everyone(name, s, ranks)
            total = sum(inputs)
            same(hvd.allreduce(x, op=hvd.Sum, process_set=ps), total, f"allreduce {what}")
            same(
                hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, process_set=ps)),
                total,
                f"allreduce_async {what}",
            )
            same(hvd.allreduce(x, process_set=ps), total / n, f"allreduce Average {what}")
            a, b = hvd.grouped_allreduce([x, x * 2], op=hvd.Max, process_set=ps)
            same(a, torch.stack(inputs).amax(0), f"grouped_allreduce {what}")
            same(b, torch.stack(inputs).amax(0) * 2, f"grouped_allreduce[1] {what}")
            gathered = torch.cat(inputs)
            same(hvd.allgather(x, process_set=ps), gathered, f"allgather {what}")
            same(hvd.synchronize(hvd.allgather_async(x, process_set=ps)), gathered, f"allgather_async {what}")
            g1, g2 = hvd.grouped_allgather([x, x], process_set=ps)
            same(g1, gathered, f"grouped_allgather {what}")
            same(g2, gathered, f"grouped_allgather[1] {what}")
            root = ranks[-1]
            same(
                hvd.broadcast(x, root, process_set=ps),
                layout(name, root, s).contiguous(),
                f"broadcast {what}",
            )
            same(
                hvd.synchronize(hvd.broadcast_async(x, root, process_set=ps)),
                layout(name, root, s).contiguous(),
                f"broadcast_async {what}",
            )
            rows = s[0] // n
            received = torch.cat([t[me * rows : (me + 1) * rows] for t in inputs])
            same(hvd.alltoall(x, process_set=ps), received, f"alltoall {what}")
            splits = [s[0] - (n - 1)] + [1] * (n - 1)  # uneven: the first member gets most rows
            starts = [sum(splits[:k]) for k in range(n)]
            got, counts = hvd.alltoall(x, splits=splits, process_set=ps)
            same(
                got,
                torch.cat([t[starts[me] : starts[me] + splits[me]] for t in inputs]),
                f"alltoall splits {what}",
            )
            assert counts.tolist() == [splits[me]] * n, counts
            mine = total[me * rows : (me + 1) * rows]
            same(hvd.reducescatter(x, op=hvd.Sum, process_set=ps), mine, f"reducescatter {what}")
            same(
                hvd.synchronize(hvd.reducescatter_async(x, op=hvd.Sum, process_set=ps)),
                mine,
                f"reducescatter_async {what}",
            )
            (c,) = hvd.grouped_reducescatter([x], op=hvd.Sum, process_set=ps)
            same(c, mine, f"grouped_reducescatter {what}")
            same(x, layout(name, r, s), f"inputs untouched {what}")


def check_layouts_in_place() -> None:
    s, r = shape(), hvd.rank()
    for set_name, ps, ranks in reference_sets():
        for name in WRITABLE:
            what = f"{name} ({set_name})"
            total = sum(everyone(name, s, ranks))
            for form in (
                "allreduce_",
                "allreduce_async_",
                "grouped_allreduce_",
                "broadcast_",
                "broadcast_async_",
            ):
                base, view = writable_view(name, r, s)
                untouched = base.clone()
                mask = torch.ones_like(base, dtype=torch.bool)
                writable_view_of(mask, name)[...] = False  # the elements the view covers
                if form == "allreduce_":
                    assert hvd.allreduce_(view, op=hvd.Sum, process_set=ps) is view
                    expected = total
                elif form == "allreduce_async_":
                    assert hvd.synchronize(hvd.allreduce_async_(view, op=hvd.Sum, process_set=ps)) is view
                    expected = total
                elif form == "grouped_allreduce_":
                    (out,) = hvd.grouped_allreduce_([view], op=hvd.Sum, process_set=ps)
                    assert out is view
                    expected = total
                elif form == "broadcast_":
                    assert hvd.broadcast_(view, ranks[0], process_set=ps) is view
                    expected = layout(name, ranks[0], s).contiguous()
                else:
                    assert hvd.synchronize(hvd.broadcast_async_(view, ranks[0], process_set=ps)) is view
                    expected = layout(name, ranks[0], s).contiguous()
                same(view.contiguous(), expected, f"{form} {what}: the view holds the result")
                same(base[mask], untouched[mask], f"{form} {what}: the rest of the storage is untouched")


def writable_view_of(base: torch.Tensor, name: str) -> torch.Tensor:
    """The same view of another base tensor of the same shape (here: of a mask)."""
    s = shape()
    if name == "offset":
        return base[1:]
    if name == "transposed":
        return base.permute(*reversed(range(len(s))))
    if name == "sliced":
        return base[::2]
    if name == "narrowed":
        return base[..., 1 : s[-1] + 1]
    return base


def check_special_shapes() -> None:
    r, n = hvd.rank(), hvd.size()
    ranks = list(range(n))
    # 0-d: allreduce and broadcast take it (one element); the first-dimension ops say how to fix it.
    scalar = torch.tensor(float(r + 1), dtype=torch.float64)
    same(
        hvd.allreduce(scalar, op=hvd.Sum),
        torch.tensor(float(n * (n + 1) // 2), dtype=torch.float64),
        "0-d allreduce",
    )
    same(hvd.broadcast(scalar, 0), torch.tensor(1.0, dtype=torch.float64), "0-d broadcast")
    expanded_scalar = torch.tensor(float(r)).expand(5)  # every element shares one float
    same(
        hvd.allreduce(expanded_scalar, op=hvd.Sum),
        torch.full((5,), float(sum(ranks))),
        "scalar expanded to 5",
    )
    for op in (hvd.allgather, hvd.alltoall, hvd.reducescatter):
        exc = raises(ValueError, lambda op=op: op(scalar), f"{op.__name__} of a 0-d tensor")
        assert isinstance(exc, RuntimeError) and "reshape" in str(exc), exc
    # Empty tensors: every collective returns an empty result of the right shape.
    empty = torch.empty((0, 3), dtype=torch.float32)
    same(hvd.allreduce(empty, op=hvd.Sum), empty, "empty allreduce")
    same(hvd.allgather(empty), empty, "empty allgather")
    same(hvd.broadcast(empty, 0), empty, "empty broadcast")
    same(hvd.alltoall(empty), empty, "empty alltoall")
    same(hvd.reducescatter(empty), empty, "empty reducescatter")
    same(hvd.allreduce_(torch.empty(0)), torch.empty(0), "empty allreduce_")
    # Rows that differ per rank, some ranks empty, through a transposed view.
    rows = 2 * (r % 2)  # ranks 0, 2, ... send no rows
    x = data(r, (3, rows)).t()
    same(
        hvd.allgather(x),
        torch.cat([data(q, (3, 2 * (q % 2))).t() for q in ranks]),
        "uneven allgather of views",
    )
    # Every dtype through a non-contiguous view.
    for dtype in (
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.bool,
    ):
        x = data(r, (4, 6), dtype).t()
        op = hvd.Max if dtype == torch.bool else hvd.Sum
        expected = hvd.allreduce(x.contiguous(), op=op)
        same(hvd.allreduce(x, op=op), expected, f"{dtype} transposed")
    # In place on a view whose elements share memory: refused before anything is submitted.
    for call in (hvd.allreduce_, hvd.allreduce_async_, lambda t: hvd.broadcast_(t, 0)):
        exc = raises(
            ValueError, lambda call=call: call(torch.ones(1).expand(4)), "in place on an expanded view"
        )
        assert isinstance(exc, RuntimeError) and "share memory" in str(exc), exc
    hvd.barrier()


# ---- autograd --------------------------------------------------------------------------------------


def leaf_grad(
    loss: torch.Tensor,
    leaf: torch.Tensor,
    view: Callable[[torch.Tensor], torch.Tensor],
    x_grad: float,
    what: str,
) -> None:
    """The gradient of ``loss`` with respect to ``leaf`` is what a gradient of ``x_grad`` everywhere on
    ``view(leaf)`` (the op's input) gives through the view."""
    (got,) = torch.autograd.grad(loss, leaf)
    (expected,) = torch.autograd.grad((view(leaf) * x_grad).sum(), leaf)
    same(got, expected, f"{what} grad")


def check_gradients() -> None:
    r, n = hvd.rank(), hvd.size()
    ranks = list(range(n))
    weights = [float(q + 1) for q in ranks]  # each rank weights its output by rank + 1
    mean_w = sum(weights) / n
    # The ops take a view of a leaf (transposed, expanded); the incoming gradients of .sum() are expanded.
    views = {
        "contiguous": ((n, 4), lambda leaf: leaf),
        "transposed": ((4, n), lambda leaf: leaf.t()),
        "expanded": ((1, 4), lambda leaf: leaf.expand(n, 4)),
    }
    for name, (leaf_shape, view) in views.items():
        leaf = data(r, leaf_shape).requires_grad_()
        x = view(leaf)
        # allreduce: the same allreduce of the incoming gradients (Sum: their sum; Average: their mean),
        # scale factors included.
        loss = (hvd.allreduce(x, op=hvd.Sum) * weights[r]).sum()
        leaf_grad(loss, leaf, view, sum(weights), f"allreduce Sum ({name})")
        loss = (hvd.allreduce(x, prescale_factor=2.0, postscale_factor=0.5) * weights[r]).sum()
        leaf_grad(loss, leaf, view, mean_w, f"allreduce Average with scaling ({name})")
        y, z = hvd.grouped_allreduce([x, x * 3], op=hvd.Sum)
        leaf_grad(y.sum() + z.sum(), leaf, view, 4.0 * n, f"grouped_allreduce ({name})")
        # broadcast: the Average of the incoming gradients on the root, zero elsewhere.
        root = 1 % n
        loss = (hvd.broadcast(x, root) * weights[r]).sum()
        leaf_grad(loss, leaf, view, mean_w if r == root else 0.0, f"broadcast ({name})")
    # allgather: the Average of the incoming gradients, narrowed to this rank's rows (rows differ).
    x = torch.zeros(r + 1, 2, dtype=torch.float64, requires_grad=True)
    gathered = hvd.allgather(x)
    position = torch.arange(gathered.shape[0], dtype=torch.float64).unsqueeze(1)
    (gathered * position * weights[r]).sum().backward()
    offset = sum(q + 1 for q in range(r))
    same(
        x.grad,
        (torch.arange(offset, offset + r + 1, dtype=torch.float64).unsqueeze(1) * mean_w)
        .expand(r + 1, 2)
        .contiguous(),
        "allgather grad",
    )
    x.grad = None
    g1, g2 = hvd.grouped_allgather([x, x * 2])
    (g1.sum() + g2.sum()).backward()
    same(x.grad, torch.full_like(x, 3.0), "grouped_allgather grad")
    # alltoall: the reverse exchange of the incoming gradients.
    splits = [q + 1 for q in ranks]  # rank r sends q + 1 rows to rank q
    x = torch.zeros(sum(splits), 2, dtype=torch.float64, requires_grad=True)
    out, received = hvd.alltoall(x, splits=splits)
    assert received.tolist() == [r + 1] * n
    (out * weights[r]).sum().backward()
    same(
        x.grad,
        torch.cat([torch.full((q + 1, 2), weights[q], dtype=torch.float64) for q in ranks]),
        "alltoall grad",
    )
    # reducescatter: the allgather of the incoming gradients, times the set size for Sum.
    for op, factor in ((hvd.Sum, n), (hvd.Average, 1)):
        x = torch.zeros(2 * n, 3, dtype=torch.float64, requires_grad=True)
        (hvd.reducescatter(x, op=op) * weights[r]).sum().backward()
        expected = torch.cat([torch.full((2, 3), weights[q] * factor, dtype=torch.float64) for q in ranks])
        same(x.grad, expected, f"reducescatter grad (op {op})")
        x.grad = None
        (a,) = hvd.grouped_reducescatter([x], op=op)
        (a * weights[r]).sum().backward()
        same(x.grad, expected, f"grouped_reducescatter grad (op {op})")
    hvd.barrier()


# ---- errors and recovery ------------------------------------------------------------------------------


def usable(what: str) -> None:
    """The runtime still works after an error: a collective on every rank gives the right answer."""
    n = hvd.size()
    got = hvd.allreduce(torch.ones(3), op=hvd.Sum)
    same(got, torch.full((3,), float(n)), f"usable after {what}")


def check_error_classes() -> None:
    assert (
        issubclass(hvd.HorovodInternalError, RuntimeError)
        and hvd.HorovodInternalError is hvd.HpcdlInternalError
    )
    assert issubclass(hvd.HostsUpdatedInterrupt, RuntimeError)
    assert hvd.elastic.HostsUpdatedInterrupt is hvd.HostsUpdatedInterrupt
    assert issubclass(hvd.HpcdlError, RuntimeError)


def check_mismatches_raise_on_every_rank() -> None:
    r, n = hvd.rank(), hvd.size()
    cases = [
        ("shape", lambda: hvd.allreduce(torch.ones(3 + r), name="m.shape")),
        (
            "dtype",
            lambda: hvd.allreduce(
                torch.ones(3, dtype=torch.int32 if r % 2 else torch.float32), name="m.dtype"
            ),
        ),
        ("trailing shape", lambda: hvd.allgather(torch.ones(2, 3 + r), name="m.gather")),
        ("root", lambda: hvd.broadcast(torch.ones(2), r, name="m.root")),
        (
            "alltoall dtype",
            lambda: hvd.alltoall(torch.ones(n, dtype=torch.int64 if r % 2 else torch.float64), name="m.a2a"),
        ),
        ("reducescatter shape", lambda: hvd.reducescatter(torch.ones(n, 1 + r), name="m.rs")),
        (
            "operation",
            lambda: (
                hvd.allgather(torch.ones(2), name="m.op")
                if r % 2
                else hvd.allreduce(torch.ones(2), name="m.op")
            ),
        ),
    ]
    for what, call in cases:
        exc = raises(hvd.HorovodInternalError, call, f"mismatched {what}")
        assert isinstance(exc, hc.HpcdlMismatchError), (what, exc)
        usable(f"mismatched {what}")


def check_duplicate_names() -> None:
    r = hvd.rank()
    submit = {
        "allreduce": lambda name: hvd.allreduce_async(torch.ones(5), name=name),
        "allgather": lambda name: hvd.allgather_async(torch.ones(5), name=name),
        "broadcast": lambda name: hvd.broadcast_async(torch.ones(5), 0, name=name),
        "reducescatter": lambda name: hvd.reducescatter_async(torch.ones(2 * hvd.size()), name=name),
        "alltoall": lambda name: hvd.alltoall_async(torch.ones(hvd.size()), name=name),
    }
    for kind, call in submit.items():
        name = f"dup.{kind}"
        # Rank 0 submits first; the others only after a barrier, when rank 0's operation can run at once:
        # their second submission must still be refused, however fast the first one finished.
        if r == 0:
            first = call(name)
            exc = raises(ValueError, lambda call=call, name=name: call(name), f"duplicate {kind} on rank 0")
        hvd.barrier()
        if r != 0:
            first = call(name)
            time.sleep(0.05)  # the operation finishes meanwhile; its result is not collected yet
            exc = raises(ValueError, lambda call=call, name=name: call(name), f"duplicate {kind} on rank {r}")
        assert isinstance(exc, RuntimeError) and name in str(exc), exc
        hvd.synchronize(first)
        hvd.synchronize(call(name))  # collected: the name is free again
        usable(f"duplicate {kind}")


def check_join_misuse_and_recovery() -> None:
    r, n = hvd.rank(), hvd.size()
    attempts = {
        "allgather": lambda: hvd.allgather(torch.ones(2)),
        "broadcast": lambda: hvd.broadcast(torch.ones(2), 1),
        "alltoall": lambda: hvd.alltoall(torch.ones(n)),
        "reducescatter": lambda: hvd.reducescatter(torch.ones(n)),
    }
    for kind, call in attempts.items():
        for first in range(n):
            if r == first:
                last = hvd.join()
            else:
                averaged = hvd.allreduce(torch.full((3,), float(r)), name=f"join.{kind}.{first}")
                same(
                    averaged,
                    torch.full((3,), float(sum(q for q in range(n) if q != first)) / n),
                    "joined rank adds zeros",
                )
                exc = raises(hvd.HorovodInternalError, call, f"{kind} while rank {first} has joined")
                assert isinstance(exc, hc.HpcdlJoinError) and "joined" in str(exc), exc
                last = hvd.join()
            assert last != first and last in range(n), (last, first)
            # join() returned on every rank: nobody is joined any more, every collective runs again.
            assert hvd.allgather_object(last) == [last] * n
            same(hvd.allgather(torch.tensor([r])), torch.arange(n), f"allgather after join ({kind})")
            usable(f"join then {kind}")


def check_asynchronous_submission() -> None:
    """An async submission returns before the engine runs it, on every rank, even the rank that submits
    last (whose peers' operations are all there): some poll right after submitting sees it pending."""
    if hvd.rank() == hvd.size() - 1:
        time.sleep(0.2)  # the others submit everything first
    handles, pending = [], 0
    for i in range(20):
        handles.append(hvd.allreduce_async(torch.full((17, 17), float(i)), op=hvd.Sum))
        pending += not hvd.poll(handles[-1])
    for i, h in enumerate(handles):
        same(hvd.synchronize(h), torch.full((17, 17), float(i * hvd.size())), "async result")
        assert hvd.poll(h) is True
    assert pending > 0, "every poll right after submitting found the operation done"


def check_bad_arguments() -> None:
    n = hvd.size()
    cases = [
        (lambda: hvd.allreduce([1.0]), "takes a torch.Tensor"),
        (lambda: hvd.alltoall(torch.ones(n + 1)), "do not divide among"),
        (
            lambda: hvd.alltoall(torch.ones(n), splits=torch.ones(n, dtype=torch.float32)),
            "must hold integers",
        ),
        (
            lambda: hvd.alltoall(torch.ones(n - 1), splits=torch.ones(n, dtype=torch.int32)),
            "sum to the tensor",
        ),
        (lambda: hvd.reducescatter(torch.ones(n), op=hvd.Adasum), "does not support Adasum"),
        (lambda: hvd.broadcast(torch.ones(1), n + 3), "not a member"),
        (lambda: hvd.allreduce(torch.ones(1, dtype=torch.complex64)), "not supported"),
    ]
    for call, message in cases:
        exc = raises(ValueError, call, message)
        assert isinstance(exc, RuntimeError) and message in str(exc), (message, exc)
    usable("bad arguments")


SCENARIOS: dict[str, list[Check]] = {
    "layouts": [check_layouts_out_of_place, check_layouts_in_place, check_special_shapes],
    "autograd": [check_gradients],
    "errors": [
        check_error_classes,
        check_mismatches_raise_on_every_rank,
        check_duplicate_names,
        check_join_misuse_and_recovery,
        check_asynchronous_submission,
        check_bad_arguments,
    ],
}

SETS: dict[str, hvd.ProcessSet] = {}


def main(scenarios: list[str]) -> None:
    hvd.init(process_sets="dynamic")
    SETS["evens"] = hvd.add_process_set(list(range(0, hvd.size(), 2)))
    for scenario in scenarios:
        for check in SCENARIOS[scenario]:
            check()
            print(f"PASS {check.__name__}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
