"""Latency budget: where the microseconds of a 4-byte ``hpcdl.torch.allreduce`` go, layer by layer.

Run it as ``python benchmarks/latency_budget.py -np 2`` (``--pythonpath DIR`` for another build installed
with ``pip install --no-deps --target DIR``, as ``latency.py`` takes it). It launches itself like
``latency.py`` and times, in the same processes, a call entered at each layer of the stack with everything
above it done once beforehand (a preallocated output, the arguments already converted), so that the
difference between two neighbouring rows is what the upper layer adds:

- ``hvd.allreduce``: ``hpcdl.torch.allreduce(t, name=..., op=Sum)`` as a user calls it;
- with the direct path (``hpcdl.torch.async_ops.allreduce_now`` exists): ``allreduce_now`` with a
  preallocated output (the torch API's argument handling and ``new_output`` left out), ``engine.run``
  (the tensor checks and conversions left out), ``_hotpath.run`` (the C extension itself: submit, the
  cycle on the caller's thread, wait);
- without it (main before the direct path): ``_Allreduce.apply`` (autograd Function), ``synchronize(
  allreduce_one(...))``, ``engine.submit`` + ``wait`` + ``release``, the latter also split into its three
  calls (the submit returns at once; the wait holds the hand-off to the engine thread and its cycle);
- ``runtime``: ``hpcdl.common.allreduce(a, out=a)``, and ``lib.hpcdl_allreduce`` through ctypes with the
  pointer computed once (the C collective and one ctypes call), and ``mpi4py`` in place beside them;
- local costs, no communication: one ctypes call of a trivial function (``hpcdl_rank``), ``new_output``,
  the torch API's argument checks (``check_tensor``, ``resolve_op``, ``check_name``).

Every round runs each row once, in a shuffled order (the same on every rank), each block of calls after a
barrier; a block's time per call is the slowest rank's, the table gives the median over the rounds.
``--cold BYTES`` copies that many bytes before each call and times each call alone, leaving out the copy:
what a call costs after a large collective or a model's compute has evicted the caches. Use it with
``-np 1``, where no peer's copy can make a call wait.
Benchmarks measure; they do not assert.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import time
from typing import Callable, Optional

import numpy as np

try:
    from .latency import OPENMPI, _has_mpi4py, block_count, measured_build
except ImportError:  # run as a script
    from latency import OPENMPI, _has_mpi4py, block_count, measured_build  # type: ignore[no-redef]

SPLIT = ("submit", "wait", "release")  # the old engine path's three calls, timed apart


def _rows(split: dict[str, int]) -> dict[str, Callable[[], None]]:
    """The calls to time, one per layer, for the hpcdl that was imported."""
    import torch

    import hpcdl.common as hc
    import hpcdl.torch as hvd
    from hpcdl.common import engine, library
    from hpcdl.torch import async_ops as _a
    from hpcdl.torch import ops as _ops
    from hpcdl.torch.process_sets import global_process_set
    from hpcdl.torch.reduce_ops import resolve_op

    a = np.zeros(1, dtype=np.float32)
    t = torch.from_numpy(a)
    out = torch.zeros(1)
    ptr, dtype, op = t.data_ptr(), _a.runtime_dtype(t), _a.runtime_op(hvd.Sum)
    rows: dict[str, Callable[[], None]] = {}
    if "OMPI_COMM_WORLD_RANK" in os.environ and _has_mpi4py():
        from mpi4py import MPI

        rows["mpi4py"] = lambda: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a)
    lib = library.load()
    c_args = (ptr, ptr, 1, int(dtype), int(op), 1.0, 1.0, 0)
    rows["ctypes hpcdl_allreduce"] = lambda: lib.hpcdl_allreduce(*c_args)
    rows["runtime"] = lambda: hc.allreduce(a, out=a)
    rows["hvd.allreduce"] = lambda: hvd.allreduce(t, name="b.hvd", op=hvd.Sum)
    if hasattr(_a, "allreduce_now"):
        from hpcdl.common import _hotpath

        now = (t, out, "b.now", hvd.Sum, 1.0, 1.0, global_process_set)
        rows["allreduce_now"] = lambda: _a.allreduce_now(*now)
        args = (engine._ALLREDUCE, "b.run", 0, dtype, ptr, out.data_ptr(), (1,), op, 1.0, 1.0, 0, (t, out))
        rows["engine.run"] = lambda: engine.run(*args)
        hot = (engine._ALLREDUCE, "b.hot", *args[2:])
        rows["_hotpath.run"] = lambda: _hotpath.run(*hot)
    else:
        how = _a.Reduction(hvd.Sum, 1.0, 1.0, global_process_set)
        rows["_Allreduce.apply"] = lambda: _ops._Allreduce.apply(how, "b.apply", t)
        rows["synchronize(allreduce_one)"] = lambda: _ops.synchronize(_a.allreduce_one(t, out, "b.one", how))
        clock = time.perf_counter_ns
        submit_args = (engine._ALLREDUCE, "b.submit", 0, dtype, ptr, out.data_ptr(), (1,), op, 1.0, 1.0)

        def submit_wait_release() -> None:
            start = clock()
            handle = engine.submit(*submit_args, keep=(t, out))
            submitted = clock()
            handle.wait()
            waited = clock()
            handle.release()
            split["submit"] += submitted - start
            split["wait"] += waited - submitted
            split["release"] += clock() - waited

        rows["engine.submit+wait+release"] = submit_wait_release
    rows["local: ctypes hpcdl_rank()"] = lambda: lib.hpcdl_rank()
    rows["local: new_output"] = lambda: _a.new_output(t)
    rows["local: argument checks"] = lambda: (
        _a.check_tensor(t, "allreduce"),
        resolve_op(hvd.Sum, None),
        _a.check_name("b.hvd"),
    )
    return rows


def evictor(nbytes: int) -> Optional[Callable[[], None]]:
    """A copy of ``nbytes`` that leaves the caches as a large collective or a model's compute does."""
    if nbytes <= 0:
        return None
    source = np.ones(max(nbytes // 8, 1), dtype=np.float64)
    target = np.empty_like(source)
    return lambda: np.copyto(target, source)


def timed(call: Callable[[], None], calls: int, evict: Optional[Callable[[], None]]) -> float:
    """Seconds per call: a block of calls, or with ``evict``, each call alone after evicting the caches."""
    if evict is None:
        start = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - start) / calls
    total = 0.0
    for _ in range(calls):
        evict()
        start = time.perf_counter()
        call()
        total += time.perf_counter() - start
    return total / calls


def worker(rounds: int, budget: float, cold_bytes: int) -> None:
    import hpcdl.common as hc
    import hpcdl.torch as hvd

    hvd.init()
    split = dict.fromkeys(SPLIT, 0)
    rows = _rows(split)
    counts = {name: block_count(call, 50, 20, budget) for name, call in rows.items()}
    evict = evictor(cold_bytes)
    if evict is not None:
        counts = {name: min(count, 300) for name, count in counts.items()}
    times: dict[str, list[float]] = {name: [] for name in rows}
    splits: dict[str, list[float]] = {key: [] for key in SPLIT}
    for round_ in range(rounds):
        order = list(rows)
        random.Random(round_ * 7919).shuffle(order)  # the same order on every rank
        for name in order:
            call = rows[name]
            for key in SPLIT:
                split[key] = 0
            hc.barrier()
            seconds = timed(call, counts[name], evict)
            worst = hc.allreduce(np.array([seconds]), op=hc.ReduceOp.MAX)
            times[name].append(float(worst[0]))
            if name == "engine.submit+wait+release":
                parts = np.array([split[key] / counts[name] / 1e9 for key in SPLIT])
                worst_parts = hc.allreduce(parts, op=hc.ReduceOp.MAX)
                for key, value in zip(SPLIT, worst_parts):
                    splits[key].append(float(value))
        if hc.rank() == 0:
            print(f"PROGRESS {round_ + 1} {rounds}", flush=True)
    if hc.rank() == 0:
        report = {
            "hpcdl": os.path.dirname(os.path.abspath(hc.__file__)),
            "median_us": {name: statistics.median(t) * 1e6 for name, t in times.items()},
            "range_us": {name: (min(t) * 1e6, max(t) * 1e6) for name, t in times.items()},
            "split_median_us": {k: statistics.median(v) * 1e6 for k, v in splits.items() if v},
        }
        print("REPORT " + json.dumps(report), flush=True)
    hc.shutdown()


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="latency_budget", description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", "--num-proc", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--rounds", type=int, default=9, help="rounds (default 9)")
    parser.add_argument("--block-seconds", type=float, default=0.05, help="length of one timed block")
    parser.add_argument(
        "--cold",
        type=int,
        default=0,
        metavar="BYTES",
        help="copy BYTES before each call (evicts the caches; use with -np 1)",
    )
    parser.add_argument("--pythonpath", help="the ranks import hpcdl from this directory (another build)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on a terminal")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.rounds, args.block_seconds, args.cold)
        return
    try:
        from ._launch import run_ranks
    except ImportError:  # run as a script
        from _launch import run_ranks  # type: ignore[no-redef]
    use_mpi = shutil.which(OPENMPI) is not None and _has_mpi4py()
    if args.pythonpath:
        os.environ["PYTHONPATH"] = args.pythonpath
    load_before = os.getloadavg()[0]
    worker_args = ["--worker", "--rounds", str(args.rounds), "--block-seconds", str(args.block_seconds)]
    worker_args += ["--cold", str(args.cold)]
    (text,) = run_ranks(__file__, args.num_proc, worker_args, "REPORT", use_mpi, args.no_progress)[:1]
    report = json.loads(text)
    measured = measured_build(report["hpcdl"], args.pythonpath)
    print(
        f"4-byte allreduce, {args.num_proc} ranks, layer by layer"
        + (f", each call after copying {args.cold} bytes" if args.cold else "")
        + f"; hpcdl from {measured}; "
        f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    for name, value in report["median_us"].items():
        low, high = report["range_us"][name]
        print(f"{name:>30} | {value:8.2f} us  (rounds {low:.2f} .. {high:.2f})")
    for name, value in report["split_median_us"].items():
        print(f"{'  of which ' + name:>30} | {value:8.2f} us")


if __name__ == "__main__":
    main()
