"""GPU path overhead: one rank's hvd.allreduce_ through the engine against torch.distributed.all_reduce.

Run it as ``hpcdl bench gpu_overhead`` or ``python benchmarks/gpu_overhead.py``. One rank, so that no
network enters the figures: the engine's share of a collective is what it adds to the backend's own
call, and on one GPU that is all one can measure (NCCL refuses two ranks on one device). For each size,
4 B to 256 MiB of float32 (powers of 4), in place with Sum:

- ``hpcdl``: ``hvd.allreduce_(t, op=hvd.Sum, name=...)``: submission, the engine's negotiation cycle,
  the executor's hand-offs and its collective on the GPU path's own process group;
- ``torch``: ``torch.distributed.all_reduce(t)`` on the default group of one rank, of the same backend.

With a GPU and a PyTorch with NCCL the tensors are CUDA tensors and the backend NCCL; elsewhere stand-in
mode runs CPU tensors with gloo (``HPCDL_GPU_OPERATIONS=gloo-standin``), which measures the GPU path's
machinery against gloo. On CUDA every step ends with ``torch.cuda.synchronize()``. Steps run in rounds
(both variants once per round, in a shuffled order; see ``fusion.py``); the report keeps each variant's
median and the median over the rounds of the paired difference and ratio. ``--json`` prints the report as
JSON. Benchmarks do not assert.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Callable, Optional

try:
    from ._launch import (
        NO_PROGRESS_HELP,
        add_gpu_operations_option,
        report_progress,
        run_ranks,
        use_gpu_operations,
    )
    from .fusion import paired_ratio, timed_rounds
except ImportError:  # run as a script: python benchmarks/gpu_overhead.py
    from _launch import (  # type: ignore[no-redef]
        NO_PROGRESS_HELP,
        add_gpu_operations_option,
        report_progress,
        run_ranks,
        use_gpu_operations,
    )
    from fusion import paired_ratio, timed_rounds  # type: ignore[no-redef]

MIN_BYTES = 4
MAX_BYTES = 256 << 20


def sizes(smallest: int, largest: int) -> list[int]:
    """Message sizes in bytes from ``smallest`` to ``largest``, each 4 times the one before."""
    out, size = [], max(4, smallest)
    while size <= largest:
        out.append(size)
        size *= 4
    return out


def worker(min_bytes: int, max_bytes: int, iterations: int, warmup: int) -> None:
    """The one rank's measurement; prints the report as a ``REPORT {json}`` line."""
    import torch
    import torch.distributed as dist

    import hpcdl.torch as hvd
    from hpcdl.common import config
    from hpcdl.torch import _gpu

    torch.set_num_threads(1)
    hvd.init()
    mode = _gpu.mode()
    if mode == "host":
        raise SystemExit("gpu_overhead measures the GPU path: set HPCDL_GPU_OPERATIONS=nccl or gloo-standin")
    if hvd.size() != 1:
        raise SystemExit("gpu_overhead measures one rank: run it with -np 1")
    cuda = mode == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    settle: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    measured = sizes(min_bytes, max_bytes)
    rows = []
    for done, nbytes in enumerate(measured, 1):
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        name = f"overhead.{nbytes}"

        def hpcdl_step(t: torch.Tensor = t, name: str = name) -> None:
            hvd.allreduce_(t, op=hvd.Sum, name=name)
            settle()

        def torch_step(t: torch.Tensor = t) -> None:
            dist.all_reduce(t)
            settle()

        steps = {"hpcdl": hpcdl_step, "torch": torch_step}
        results = timed_rounds(steps, warmup, iterations, lambda: None)
        median = {k: statistics.median(v) * 1e6 for k, v in results.items()}
        rows.append(
            {
                "bytes": nbytes,
                "hpcdl_us": round(median["hpcdl"], 1),
                "torch_us": round(median["torch"], 1),
                "overhead_us": round(
                    statistics.median((a - b) * 1e6 for a, b in zip(results["hpcdl"], results["torch"])), 1
                ),
                "hpcdl_vs_torch": round(paired_ratio(results, "hpcdl", "torch"), 3),
            }
        )
        report_progress(done, len(measured))
        del t
    dist.destroy_process_group()
    report = {
        "mode": mode,
        "backend": backend,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "iterations": iterations,
        "cycle_time_ms": float(config.resolve().get("cycle_time_ms")),
        "sizes": rows,
    }
    hvd.shutdown()
    print("REPORT " + json.dumps(report), flush=True)


def _size_text(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def render(report: dict) -> str:
    backend = (
        "NCCL on " + report["device"] if report["mode"] == "nccl" else "gloo on CPU standing in for NCCL"
    )
    lines = [
        f"allreduce in place, float32, 1 rank, {backend}, torch {report['torch']}; median of "
        f"{report['iterations']} rounds; engine cycle {report['cycle_time_ms']} ms",
        f"{'size':>9} | {'hpcdl':>11} | {'torch':>11} | {'overhead':>11} | {'hpcdl/torch':>11}",
        "-" * 65,
    ]
    for row in report["sizes"]:
        lines.append(
            f"{_size_text(row['bytes']):>9} | {row['hpcdl_us']:>8.1f} us | {row['torch_us']:>8.1f} us | "
            f"{row['overhead_us']:>8.1f} us | {row['hpcdl_vs_torch']:>10.2f}x"
        )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="hpcdl bench gpu_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-bytes", type=int, default=MIN_BYTES, help="smallest message (default 4)")
    parser.add_argument(
        "--max-bytes", type=int, default=MAX_BYTES, help=f"largest message (default {MAX_BYTES} = 256 MiB)"
    )
    parser.add_argument("--iterations", type=int, default=20, help="rounds: timed steps per variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first (default 3)")
    add_gpu_operations_option(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.min_bytes, args.max_bytes, args.iterations, args.warmup)
        return
    if not 4 <= args.min_bytes <= args.max_bytes:
        parser.error("need 4 <= --min-bytes <= --max-bytes")
    if args.iterations < 1 or args.warmup < 0:
        parser.error("--iterations must be at least 1 and --warmup at least 0")
    use_gpu_operations(args.gpu_operations)
    worker_args = ["--worker", "--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes)]
    worker_args += ["--iterations", str(args.iterations), "--warmup", str(args.warmup)]
    report = json.loads(run_ranks(__file__, 1, worker_args, "REPORT", no_progress=args.no_progress)[0])
    print(json.dumps(report, indent=2) if args.json else render(report))


if __name__ == "__main__":
    main()
