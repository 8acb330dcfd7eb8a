"""GPU path benchmark: ResNet-50's 161 gradients through the engine's GPU path (named negotiation, fusion
into a device-side buffer, one NCCL collective), against one flat allreduce of the same bytes and against
DDP's bucketed allreduce, on the same process-group backend.

Run it as ``hpcdl bench gpu_fusion -np 2`` or ``python benchmarks/gpu_fusion.py -np 2``. With a GPU per
rank and NCCL it measures CUDA tensors over NCCL (``HPCDL_GPU_OPERATIONS=nccl``); elsewhere it runs in
stand-in mode (``gloo-standin``): CPU tensors through exactly the same code with gloo in place of NCCL,
which measures the GPU path's own overhead (negotiation, packing, the executor's hand-offs) against gloo,
not NCCL's speed.

Each variant reduces the same 161 float32 tensors (25,557,032 parameters, 102 MB) with Sum:

- ``hpcdl``: ``hvd.allreduce_async_`` of every tensor in backward order (last layer first), then
  ``hvd.synchronize`` of each, as ``DistributedOptimizer``'s gradient hooks do;
- ``flat``: the same bytes as one flat tensor, one allreduce on a process group of the same backend
  (the lower bound);
- ``packed``: what a fusion buffer costs without the engine: the tensors copied into one flat buffer,
  one allreduce, copied back (``hpcdl / packed`` is then the engine's and the executor's own overhead);
- ``ddp``: DDP's buckets (``torch.distributed._compute_bucket_assignment_by_size`` with DDP's 1 MiB first
  and 25 MiB further caps, reduced last bucket first): each bucket packed into a flat tensor, its allreduce
  started, then all waited for and unpacked, as DDP's reducer does without gradient-as-bucket-view.

On CUDA every step ends with ``torch.cuda.synchronize()``. Steps run in rounds (each variant once per
round, in a shuffled order) and each ratio is the median over the rounds of the paired steps (see
``fusion.py``). Rank 0 prints a table; ``--json`` prints it as JSON. Benchmarks do not assert.
"""

from __future__ import annotations

import argparse
import functools
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
    from .fusion import SHAPES, paired_ratio, timed_rounds
except ImportError:  # run as a script: python benchmarks/gpu_fusion.py
    from _launch import (  # type: ignore[no-redef]
        NO_PROGRESS_HELP,
        add_gpu_operations_option,
        report_progress,
        run_ranks,
        use_gpu_operations,
    )
    from fusion import SHAPES, paired_ratio, timed_rounds  # type: ignore[no-redef]

DDP_FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 << 20  # DistributedDataParallel(bucket_cap_mb=25)
_BENCH_LANE = 1 << 20  # the benchmark's own process group, apart from the GPU path's lanes


def worker(iterations: int, warmup: int) -> None:
    """One rank's share; rank 0 prints the report as a ``REPORT {json}`` line."""
    import torch
    import torch.distributed as dist

    import hpcdl.torch as hvd
    from hpcdl.common import config
    from hpcdl.torch import _gpu
    from hpcdl.torch._gpu.groups import Groups

    torch.set_num_threads(1)
    hvd.init()
    mode = _gpu.mode()
    if mode == "host":
        raise SystemExit("gpu_fusion measures the GPU path: set HPCDL_GPU_OPERATIONS=nccl or gloo-standin")
    cuda = mode == "nccl"
    device = (
        torch.device("cuda", hvd.local_rank() % torch.cuda.device_count()) if cuda else torch.device("cpu")
    )
    if cuda:
        torch.cuda.set_device(device)
    timeout = float(config.resolve().get("timeout_s"))
    group = Groups.open("nccl" if cuda else "gloo", timeout).get(0, _BENCH_LANE)
    tensors = [torch.full(shape, 1.0 + i % 7, device=device) for i, shape in enumerate(SHAPES)]
    backward = list(reversed(range(len(tensors))))
    names = [f"grad.{i}" for i in range(len(tensors))]
    flat = torch.cat([t.reshape(-1) for t in tensors])
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES])
    buckets = list(reversed(buckets))
    bucket_tensors = [[tensors[i] for i in bucket] for bucket in buckets]
    settle = torch.cuda.synchronize if cuda else (lambda: None)

    def hpcdl_step() -> None:
        handles = [hvd.allreduce_async_(tensors[i], name=names[i], op=hvd.Sum) for i in backward]
        for h in handles:
            hvd.synchronize(h)
        settle()

    def flat_step() -> None:
        group.allreduce([flat]).wait()
        settle()

    packed = torch.empty_like(flat)

    def packed_step() -> None:
        torch.cat([t.reshape(-1) for t in tensors], out=packed)
        group.allreduce([packed]).wait()
        torch._foreach_copy_(
            [t.reshape(-1) for t in tensors], list(packed.split([t.numel() for t in tensors]))
        )
        settle()

    def ddp_step() -> None:
        started = []
        for members in bucket_tensors:
            bucket = torch.cat([t.reshape(-1) for t in members])
            started.append((group.allreduce([bucket]), bucket, members))
        for work, bucket, members in started:
            work.wait()
            torch._foreach_copy_(
                [t.reshape(-1) for t in members], list(bucket.split([t.numel() for t in members]))
            )
        settle()

    steps: dict[str, Callable[[], None]] = {
        "hpcdl": hpcdl_step,
        "flat": flat_step,
        "packed": packed_step,
        "ddp": ddp_step,
    }

    def on_round(done: int) -> None:
        if hvd.rank() == 0:
            report_progress(done, iterations)

    results = timed_rounds(steps, warmup, iterations, hvd.barrier, on_round)
    rank, size = hvd.rank(), hvd.size()
    group.shutdown()
    hvd.shutdown()
    if rank != 0:
        return
    median = {name: statistics.median(seconds) for name, seconds in results.items()}
    paired = functools.partial(paired_ratio, results)

    nbytes = flat.numel() * flat.element_size()
    report = {
        "ranks": size,
        "mode": mode,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "tensors": len(SHAPES),
        "bytes": nbytes,
        "ddp_buckets": len(buckets),
        "fusion_threshold": int(config.resolve().get("fusion_threshold")),
        "num_nccl_streams": int(config.resolve().get("num_nccl_streams")),
        "median_step_ms": {k: round(v * 1e3, 2) for k, v in median.items()},
        "flat_busbw_gbs": round(nbytes * 2 * (size - 1) / size / median["flat"] / 1e9, 2)
        if size > 1
        else None,
        "hpcdl_vs_flat": round(paired("hpcdl", "flat"), 3),
        "hpcdl_vs_ddp": round(paired("hpcdl", "ddp"), 3),
        "hpcdl_vs_packed": round(paired("hpcdl", "packed"), 3),
    }
    print("REPORT " + json.dumps(report), flush=True)


def render(report: dict) -> str:
    backend = (
        "NCCL on " + report["device"] if report["mode"] == "nccl" else "gloo on CPU standing in for NCCL"
    )
    lines = [
        f"ResNet-50 gradients: {report['tensors']} tensors, {report['bytes'] / 1e6:.1f} MB float32, "
        f"{report['ranks']} ranks, {backend} (fusion threshold {report['fusion_threshold'] >> 20} MiB, "
        f"{report['num_nccl_streams']} stream(s); DDP: {report['ddp_buckets']} buckets)",
        f"{'variant':<8}{'median step':>14}",
    ]
    for name, ms in report["median_step_ms"].items():
        lines.append(f"{name:<8}{ms:>11.2f} ms")
    if report["flat_busbw_gbs"] is not None:
        lines.append(f"flat allreduce bus bandwidth: {report['flat_busbw_gbs']} GB/s")
    lines.append(f"hpcdl / flat: {report['hpcdl_vs_flat']}  (target on NCCL <= 1.10)")
    lines.append(f"hpcdl / ddp:  {report['hpcdl_vs_ddp']}  (target on NCCL <= 1.00)")
    lines.append(f"hpcdl / packed: {report['hpcdl_vs_packed']}  (the engine's and executor's own share)")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="hpcdl bench gpu_fusion", description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", "--num-proc", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--iterations", type=int, default=10, help="rounds: timed steps per variant")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first (default 2)")
    add_gpu_operations_option(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.iterations, args.warmup)
        return
    if args.num_proc < 1:
        parser.error("-np must be at least 1")
    use_gpu_operations(args.gpu_operations)
    worker_args = ["--worker", "--iterations", str(args.iterations), "--warmup", str(args.warmup)]
    report = json.loads(
        run_ranks(__file__, args.num_proc, worker_args, "REPORT", no_progress=args.no_progress)[0]
    )
    print(json.dumps(report, indent=2) if args.json else render(report))


if __name__ == "__main__":
    main()
