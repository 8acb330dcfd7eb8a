"""Each shared-memory collective under the three kinds of staging stores, in the same job: cached, streaming
and auto (``HPCDL_SHM_STORES``), taking turns, the runtime restarted for each (the setting is read at init).

Which kind of store is faster depends on where the job's ranks run: cores that share a cache favour cached
stores, cores that do not favour streaming ones, and on a VM that can change from one job to the next.
``auto`` times each kind of collective's full chunks and should match the faster kind in every job, so the
benchmark runs ``--jobs`` jobs and prints one line per job and collective. Run it as
``hpcdl bench staging_stores -np 2`` or ``python benchmarks/staging_stores.py -np 2``.

The calls are the runtime's own, into buffers allocated once (``hpcdl_allgather``, ``hpcdl_broadcast``,
``hpcdl_alltoall``, ``hpcdl_reducescatter``, and ``hpcdl.common.allreduce`` in place), so that the figures
show the transport and not the allocation of results. Each figure is rank 0's median time per call over
the calls after the first sixth (the first sixth, in which ``auto`` makes its first trials, is shown
apart). Benchmarks measure; they do not assert.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import time
from typing import Callable, Optional

import numpy as np

OPS = ("allgather", "broadcast", "alltoall", "reducescatter", "allreduce")
MODES = ("cached", "streaming", "auto")
DEFAULT_SIZES = [1 << 20, 4 << 20]


def _calls(nbytes: int) -> dict[str, Callable[[], None]]:
    """The blocking runtime call of each collective on `nbytes` per rank, into buffers made once."""
    import hpcdl.common as hc
    from hpcdl.common import library
    from hpcdl.common.types import DType

    lib, n, f32 = library.load(), hc.size(), int(DType.FLOAT32)
    count = max(nbytes // 4 // n, 1) * n
    a = np.ones(count, dtype=np.float32)
    out = np.zeros(count * n, dtype=np.float32)
    every = (ctypes.c_int64 * n)(*([count] * n))
    share = (ctypes.c_int64 * n)(*([count // n] * n))
    at = a.ctypes.data
    return {
        "allgather": lambda: library.check(lib.hpcdl_allgather(at, count, out.ctypes.data, every, f32, 0)),
        "broadcast": lambda: library.check(lib.hpcdl_broadcast(at, count, f32, 0, 0)),
        "alltoall": lambda: library.check(lib.hpcdl_alltoall(at, share, out.ctypes.data, share, f32, 0)),
        "reducescatter": lambda: library.check(
            lib.hpcdl_reducescatter(at, out.ctypes.data, share, f32, int(hc.ReduceOp.SUM), 1.0, 1.0, 0)
        ),
        "allreduce": lambda: hc.allreduce(a, out=a),
    }


def worker(sizes: list[int], calls: int, ops: list[str]) -> None:
    import hpcdl.common as hc

    times: dict[str, dict[str, dict[str, list[list[float]]]]] = {}
    head = max(calls // 6, 1)
    made: dict[int, dict[str, Callable[[], None]]] = {}  # the same buffers for every kind: same pages
    for _ in range(2):
        for mode in MODES:
            os.environ["HPCDL_SHM_STORES"] = mode
            hc.init()
            for nbytes in sizes:
                call = made.setdefault(nbytes, _calls(nbytes))
                for op in ops:
                    hc.barrier()
                    took = []
                    for _ in range(calls):
                        start = time.perf_counter()
                        call[op]()
                        took.append(time.perf_counter() - start)
                    per = times.setdefault(op, {}).setdefault(str(nbytes), {}).setdefault(mode, [])
                    per.append([statistics.median(took[:head]), statistics.median(took[head:])])
            rank = hc.rank()
            hc.shutdown()
    if rank == 0:
        print("REPORT " + json.dumps(times), flush=True)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:7.0f}"


def table(job: int, report: dict) -> list[str]:
    """One line per collective and size: each kind's time per call (first sixth / the rest), both turns."""
    lines = []
    for op, by_size in report.items():
        for nbytes, by_mode in by_size.items():
            cells = []
            for mode in MODES:
                turns = " ".join(f"{_us(first).strip()}/{_us(rest).strip()}" for first, rest in by_mode[mode])
                cells.append(f"{mode} {turns:>15}")
            rest = {mode: statistics.median(r for _, r in by_mode[mode]) for mode in MODES}
            best = min(rest["cached"], rest["streaming"])
            lines.append(
                f"{job:>3} {op:>13} {int(nbytes) >> 10:>6} KiB  "
                + "  ".join(cells)
                + f"  auto/best {rest['auto'] / best:.2f}"
            )
    return lines


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="hpcdl bench staging_stores", description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", "--num-proc", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--sizes", help="comma list of bytes per rank (default 1 MiB, 4 MiB)")
    parser.add_argument(
        "--calls", type=int, default=240, help="calls per collective, size and kind (default 240)"
    )
    parser.add_argument(
        "--ops", default=",".join(OPS), help=f"comma list of collectives (default {','.join(OPS)})"
    )
    parser.add_argument("--jobs", type=int, default=4, help="jobs, one after the other (default 4)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on a terminal")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    ops = args.ops.split(",")
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        parser.error(f"unknown collectives {unknown}; choose from {', '.join(OPS)}")
    if args.worker:
        worker(sizes, args.calls, ops)
        return
    try:
        from ._launch import run_ranks
    except ImportError:  # run as a script
        from _launch import run_ranks  # type: ignore[no-redef]
    worker_args = [
        "--worker",
        "--sizes",
        ",".join(map(str, sizes)),
        "--calls",
        str(args.calls),
        "--ops",
        args.ops,
    ]
    print(
        f"staging stores, {args.num_proc} ranks, us per call (first sixth/rest, two turns per kind); "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    for job in range(1, args.jobs + 1):
        (text,) = run_ranks(__file__, args.num_proc, worker_args, "REPORT", no_progress=args.no_progress)[:1]
        print("\n".join(table(job, json.loads(text))), flush=True)


if __name__ == "__main__":
    main()
