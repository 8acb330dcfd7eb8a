"""Allreduce benchmark: hpcdl's direct allreduce against torch.distributed (gloo) and mpi4py (Open MPI).

Run it as ``hpcdl bench allreduce -np 2`` or ``python benchmarks/allreduce.py -np 2``: it launches itself on
N ranks with ``hpcdl run --mpi`` through Open MPI's mpirun (so mpi4py runs in the same job; without
mpirun.openmpi or mpi4py only hpcdl and gloo are measured) and measures every implementation on the same
float32 buffers, in place, sizes 4 B to 256 MiB. Timed blocks of the implementations are interleaved and
the best of ``--repeats`` is kept for each, so that a busy machine penalises every implementation alike.
Per size it prints time, algorithm bandwidth and bus bandwidth (nccl-tests: busbw = bytes * 2(n-1)/n /
time) of each implementation and the ratio of each peer's time to hpcdl's, and the single-core memcpy
bandwidth of this machine as the ceiling. ``--json`` prints one record per implementation and size
(impl, ranks, bytes, time_s, busbw_gbs). Benchmarks measure; they do not assert.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import numpy as np

from hpcdl.common.exceptions import HpcdlError
from hpcdl.common.sizes import parse_size

try:
    from ._launch import NO_PROGRESS_HELP, OPENMPI, free_port, report_progress, run_ranks
except ImportError:  # run as a script: python benchmarks/allreduce.py
    from _launch import (  # type: ignore[no-redef]
        NO_PROGRESS_HELP,
        OPENMPI,
        free_port,
        report_progress,
        run_ranks,
    )

DEFAULT_SIZES = [4 * 4**k for k in range(14)]  # 4 B .. 256 MiB


@dataclass
class Record:
    impl: str
    ranks: int
    bytes: int
    time_s: float
    busbw_gbs: float
    algbw_gbs: float


def bus_bandwidth(nbytes: int, ranks: int, seconds: float) -> float:
    return nbytes * 2 * (ranks - 1) / ranks / seconds / 1e9 if ranks > 1 else 0.0


def memcpy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Single-core memcpy bandwidth in GB/s (bytes copied per second), best of `repeats`."""
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def iterations(probe_seconds: float, budget_seconds: float = 0.2) -> int:
    """Iterations of one timed block: about `budget_seconds` of work, at least 3, at most 5000."""
    return int(max(3, min(5000, budget_seconds / max(probe_seconds, 1e-7))))


# ---- worker: runs on every rank --------------------------------------------------------------------
def _impls(rank: int, size: int) -> dict[str, Callable[[np.ndarray], Callable[[], None]]]:
    import hpcdl.common as hc

    impls: dict[str, Callable[[np.ndarray], Callable[[], None]]] = {
        "hpcdl": lambda a: lambda: hc.allreduce(a, out=a),
    }
    try:
        import torch
        import torch.distributed as dist

        port = np.array([free_port() if rank == 0 else 0], dtype=np.int64)
        hc.broadcast(port, root=0)
        addr = os.environ.get("HPCDL_RENDEZVOUS_ADDR", "127.0.0.1")
        dist.init_process_group(
            "gloo", init_method=f"tcp://{addr}:{int(port[0])}", rank=rank, world_size=size
        )
        impls["gloo"] = lambda a: (lambda t: lambda: dist.all_reduce(t))(torch.from_numpy(a))
    except ImportError:
        pass
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        try:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
            impls["mpi4py"] = lambda a: lambda: comm.Allreduce(MPI.IN_PLACE, a)
        except ImportError:
            pass
    return impls


def worker(sizes: list[int], repeats: int) -> None:
    import hpcdl.common as hc

    hc.init()
    rank, size = hc.rank(), hc.size()
    impls = _impls(rank, size)
    records = []
    for done, nbytes in enumerate(sizes):
        buffer = np.ones(max(nbytes // 4, 1), dtype=np.float32)
        steps = {name: make(buffer) for name, make in impls.items()}
        counts = {}
        for name, step in steps.items():  # rank 0 sizes the blocks; every rank runs the same count
            step()
            start = time.perf_counter()
            for _ in range(3):
                step()
            count = np.array([iterations((time.perf_counter() - start) / 3)], dtype=np.int64)
            counts[name] = int(hc.broadcast(count, root=0)[0])
        best = dict.fromkeys(steps, float("inf"))
        for _ in range(repeats):  # interleaved blocks: every implementation sees the same machine state
            for name, step in steps.items():
                hc.barrier()
                start = time.perf_counter()
                for _ in range(counts[name]):
                    step()
                seconds = (time.perf_counter() - start) / counts[name]
                # the slowest rank's time is the collective's time
                worst = float(hc.allreduce(np.array([seconds]), op=hc.ReduceOp.MAX)[0])
                best[name] = min(best[name], worst)
        if rank == 0:
            report_progress(done + 1, len(sizes))
        for name, seconds in best.items():
            records.append(
                Record(
                    name, size, nbytes, seconds, bus_bandwidth(nbytes, size, seconds), nbytes / seconds / 1e9
                )
            )
    if rank == 0:
        for r in records:
            print("RECORD " + json.dumps(asdict(r)), flush=True)
    if "gloo" in impls:
        import torch.distributed as dist

        dist.destroy_process_group()
    hc.shutdown()


# ---- launcher ----------------------------------------------------------------------------------------
def _human(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def table(records: list[Record], memcpy_gbs: float) -> str:
    impls = list(dict.fromkeys(r.impl for r in records))
    ranks = records[0].ranks if records else 0
    by_key = {(r.impl, r.bytes): r for r in records}
    head = f"{'size':>9}"
    for impl in impls:
        head += f" | {impl + ' time':>13} {'algbw':>7} {'busbw':>7}"
    for impl in impls[1:]:
        head += f" | {impl + '/hpcdl':>12}"
    lines = [
        f"allreduce, float32 in place, {ranks} ranks; GB/s; single-core memcpy ceiling {memcpy_gbs:.2f} GB/s",
        head,
        "-" * len(head),
    ]
    for nbytes in sorted({r.bytes for r in records}):
        line = f"{_human(nbytes):>9}"
        for impl in impls:
            r = by_key.get((impl, nbytes))
            t = (
                f"{r.time_s * 1e6:.1f} us"
                if r and r.time_s < 1e-2
                else f"{r.time_s * 1e3:.2f} ms"
                if r
                else "-"
            )
            line += f" | {t:>13} {r.algbw_gbs if r else 0:7.2f} {r.busbw_gbs if r else 0:7.2f}"
        base = by_key.get(("hpcdl", nbytes))
        for impl in impls[1:]:
            r = by_key.get((impl, nbytes))
            line += f" | {r.time_s / base.time_s:11.2f}x" if r and base else f" | {'-':>12}"
        lines.append(line)
    return "\n".join(lines)


def launch(
    ranks: int, sizes: list[int], use_mpi: bool, repeats: int, no_progress: bool = False
) -> list[Record]:
    args = ["--worker", "--sizes", ",".join(map(str, sizes)), "--repeats", str(repeats)]
    texts = run_ranks(__file__, ranks, args, "RECORD", use_mpi, no_progress)
    return [Record(**json.loads(text)) for text in texts]


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="hpcdl bench allreduce", description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", "--num-proc", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument(
        "--sizes",
        type=_sizes,
        help="comma list of message sizes, e.g. 4,64KiB,1M (default 4 B .. 256 MiB, x4)",
    )
    parser.add_argument("--max-bytes", type=_size, help="drop sizes above this, e.g. 1G")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed blocks per size and implementation; the best is kept"
    )
    parser.add_argument("--no-mpi", action="store_true", help="launch with hpcdl run only (no mpi4py)")
    parser.add_argument("--json", action="store_true", help="print JSON records instead of the table")
    parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = args.sizes or DEFAULT_SIZES
    if args.max_bytes:
        sizes = [s for s in sizes if s <= args.max_bytes]
    if args.worker:
        worker(sizes, args.repeats)
        return
    if args.num_proc < 1:
        parser.error("-np must be at least 1")
    use_mpi = not args.no_mpi and shutil.which(OPENMPI) is not None and _has_mpi4py()
    records = launch(args.num_proc, sizes, use_mpi, args.repeats, args.no_progress)
    ceiling = memcpy_bandwidth()
    if args.json:
        memcpy = Record("memcpy", 1, 256 << 20, (256 << 20) / ceiling / 1e9, ceiling, ceiling)
        for r in [memcpy, *records]:
            print(json.dumps(asdict(r)))
    else:
        print(table(records, ceiling))
        if args.no_mpi:
            print("(mpi4py not measured: --no-mpi)")
        elif not use_mpi:
            print("(mpi4py not measured: needs mpirun.openmpi and mpi4py built against Open MPI)")


def _size(text: str) -> int:
    """An argparse type: bytes of a size such as 64KiB or 1M (argparse says what is allowed otherwise)."""
    try:
        return parse_size(text)
    except HpcdlError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sizes(text: str) -> list[int]:
    return [_size(item) for item in text.split(",")]


def _has_mpi4py() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
