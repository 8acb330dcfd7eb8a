"""The Horovod API's other collectives: allgather, alltoall, broadcast and reducescatter through hpcdl.torch,
and many small allreduces at once, against the runtime's own calls and Open MPI.

Run it as ``hpcdl bench api_collectives -np 2`` or ``python benchmarks/api_collectives.py -np 2``; it launches
itself as ``latency.py`` does (Open MPI is measured when mpirun.openmpi and mpi4py are there). For each
operation and size (the bytes each rank contributes), in the same processes and on float32 values:

- ``hvd``: hpcdl.torch's blocking call as a user writes it: ``hvd.allgather(t)``, ``hvd.alltoall(t)``,
  ``hvd.broadcast_(t, 0)``, ``hvd.reducescatter(t, op=hvd.Sum)``, each under a name; ``grouped``: one
  ``hvd.grouped_allreduce_`` of 64 tensors sharing the size; ``burst``: 64 ``hvd.allreduce_async_`` then
  their ``synchronize``, as ``DistributedOptimizer`` reduces a layer's small gradients (``--group N``: N
  tensors; a burst of more names than the engine's response cache holds is a large model's step);
- ``runtime``: ``hpcdl.common``'s call on a NumPy array (``allgather``, ``alltoall``, ``broadcast``,
  ``reducescatter``): no engine; for ``grouped`` and ``burst``, one in-place ``allreduce`` of all the bytes
  (what fusion at its best costs);
- ``mpi4py``: ``Allgather``, ``Alltoall``, ``Bcast`` and ``Reduce_scatter_block`` into buffers allocated once;
  one in-place ``Allreduce`` of all the bytes for ``grouped`` and ``burst``.

Rounds, blocks and ratios as in ``latency.py``: each ratio is the median of paired per-round ratios.
``--pythonpath DIR`` measures another build installed with ``pip install --no-deps --target DIR``.
Benchmarks measure; they do not assert.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from typing import Callable, Optional

import numpy as np

try:
    from .latency import (
        OPENMPI,
        _commit,
        _has_mpi4py,
        _human,
        _time,
        block_count,
        measured_build,
        timed_rounds,
    )
except ImportError:  # run as a script
    from latency import (  # type: ignore[no-redef]
        OPENMPI,
        _commit,
        _has_mpi4py,
        _human,
        _time,
        block_count,
        measured_build,
        timed_rounds,
    )

OPS = ("allgather", "alltoall", "broadcast", "reducescatter", "grouped", "burst")
GROUP = 64  # the tensors of a grouped allreduce or a burst, unless --group says otherwise
IMPLS = ("hvd", "runtime", "mpi4py")
DEFAULT_SIZES = [64 << 10, 1 << 20, 16 << 20]


def _calls(op: str, nbytes: int, group: int) -> dict[str, Callable[[], object]]:
    """The blocking calls to time for one operation and size (``group``: tensors of a grouped or burst)."""
    import torch

    import hpcdl.common as hc
    import hpcdl.torch as hvd

    n = hc.size()
    many = op in ("grouped", "burst")
    # divides among the ranks (alltoall, reducescatter) or the tensors of a group
    count = max(nbytes // 4 // (group if many else n), 1) * (group if many else n)
    a = np.ones(count, dtype=np.float32) if not many else np.zeros(count, dtype=np.float32)
    t = torch.from_numpy(a.copy())
    parts = [torch.zeros(count // group) for _ in range(group)] if many else []
    calls: dict[str, Callable[[], object]] = {}
    if many:
        if op == "grouped":
            calls["hvd"] = lambda: hvd.grouped_allreduce_(parts, name="api.grouped", op=hvd.Sum)
        else:
            calls["hvd"] = lambda: _burst(parts)
        calls["runtime"] = lambda: hc.allreduce(a, out=a)
    elif op == "allgather":
        calls["hvd"] = lambda: hvd.allgather(t, name="api.allgather")
        calls["runtime"] = lambda: hc.allgather(a)
    elif op == "alltoall":
        calls["hvd"] = lambda: hvd.alltoall(t, name="api.alltoall")
        calls["runtime"] = lambda: hc.alltoall(a)
    elif op == "broadcast":
        calls["hvd"] = lambda: hvd.broadcast_(t, 0, name="api.broadcast")
        calls["runtime"] = lambda: hc.broadcast(a, root=0)
    else:
        calls["hvd"] = lambda: hvd.reducescatter(t, name="api.reducescatter", op=hvd.Sum)
        calls["runtime"] = lambda: hc.reducescatter(a)
    if "OMPI_COMM_WORLD_RANK" in os.environ and _has_mpi4py():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        gathered, exchanged, part = (
            np.empty(count * n, np.float32),
            np.empty_like(a),
            np.empty(count // n, np.float32),
        )
        calls["mpi4py"] = {
            "allgather": lambda: comm.Allgather(a, gathered),
            "alltoall": lambda: comm.Alltoall(a, exchanged),
            "broadcast": lambda: comm.Bcast(a, root=0),
            "reducescatter": lambda: comm.Reduce_scatter_block(a, part),
            "grouped": lambda: comm.Allreduce(MPI.IN_PLACE, a),
            "burst": lambda: comm.Allreduce(MPI.IN_PLACE, a),
        }[op]
    return calls


def _burst(parts: list) -> None:
    """Each tensor's asynchronous in-place allreduce, then the waits: the engine fuses them."""
    import hpcdl.torch as hvd

    handles = [hvd.allreduce_async_(p, name=f"api.burst.{i}", op=hvd.Sum) for i, p in enumerate(parts)]
    for handle in handles:
        hvd.synchronize(handle)


def worker(ops: list[str], sizes: list[int], group: int, rounds: int, budget: float) -> None:
    import hpcdl.common as hc
    import hpcdl.torch as hvd

    hvd.init()
    report: dict = {"times": {}, "hpcdl": os.path.dirname(os.path.abspath(hc.__file__))}
    steps = [(op, nbytes) for op in ops for nbytes in sizes]
    for done, (op, nbytes) in enumerate(steps):
        calls = _calls(op, nbytes, group)
        counts = {name: block_count(call, 3, 3, budget) for name, call in calls.items()}
        report["times"][f"{op} {nbytes}"] = timed_rounds(calls, counts, rounds, nbytes)
        if hc.rank() == 0:
            print(f"PROGRESS {done + 1} {len(steps)}", flush=True)
    if hc.rank() == 0:
        print("REPORT " + json.dumps(report), flush=True)
    hvd.shutdown()


def table(report: dict, header: str) -> str:
    head = f"{'operation':>13} | {'size':>7}" + "".join(f" | {i:>10}" for i in IMPLS)
    head += f" | {'hvd / runtime':>13} | {'mpi4py / hvd':>12}"
    lines = [header, head, "-" * len(head)]
    for key, times in report["times"].items():
        op, nbytes = key.split()
        line = f"{op:>13} | {_human(int(nbytes)):>7}"
        line += "".join(f" | {_time(statistics.median(times[i])) if i in times else '-':>10}" for i in IMPLS)
        for num, den, width in (("hvd", "runtime", 13), ("mpi4py", "hvd", 12)):
            paired = [x / y for x, y in zip(times.get(num, []), times.get(den, []))]
            line += f" | {statistics.median(paired):{width - 1}.2f}x" if paired else f" | {'-':>{width}}"
        lines.append(line)
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="hpcdl bench api_collectives", description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", "--num-proc", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--sizes", help="comma list of bytes per rank (default 64 KiB, 1 MiB, 16 MiB)")
    parser.add_argument("--ops", help=f"comma list of operations (default all: {','.join(OPS)})")
    parser.add_argument(
        "--group", type=int, default=GROUP, help=f"tensors of a grouped allreduce or burst (default {GROUP})"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds per operation and size (default 5)")
    parser.add_argument("--block-seconds", type=float, default=0.1, help="length of one timed block")
    parser.add_argument("--no-mpi", action="store_true", help="launch with hpcdl run only (no mpi4py)")
    parser.add_argument("--pythonpath", help="the ranks import hpcdl from this directory (another build)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on a terminal")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    ops = args.ops.split(",") if args.ops else list(OPS)
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        parser.error(f"unknown operation(s) {', '.join(unknown)}; choose from {', '.join(OPS)}")
    if args.group < 1:
        parser.error("--group needs at least one tensor")
    if args.worker:
        worker(ops, sizes, args.group, args.rounds, args.block_seconds)
        return
    try:
        from ._launch import run_ranks
    except ImportError:  # run as a script
        from _launch import run_ranks  # type: ignore[no-redef]
    use_mpi = not args.no_mpi and shutil.which(OPENMPI) is not None and _has_mpi4py()
    if args.pythonpath:
        os.environ["PYTHONPATH"] = args.pythonpath  # the launcher and its ranks, not this process
    load_before = os.getloadavg()[0]
    worker_args = ["--worker", "--ops", ",".join(ops), "--sizes", ",".join(map(str, sizes))]
    worker_args += ["--group", str(args.group), "--rounds", str(args.rounds)]
    worker_args += ["--block-seconds", str(args.block_seconds)]
    (text,) = run_ranks(__file__, args.num_proc, worker_args, "REPORT", use_mpi, args.no_progress)[:1]
    report = json.loads(text)
    measured = measured_build(report["hpcdl"], args.pythonpath)
    header = (
        f"blocking collectives through hpcdl.torch, float32, {args.num_proc} ranks; hpcdl from {measured}"
        f"{'' if args.pythonpath else ' (commit ' + _commit() + ')'}; "
        f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    if args.json:
        print(json.dumps({"header": header, "times": report["times"]}, indent=1))
    else:
        print(table(report, header))


if __name__ == "__main__":
    main()
