"""Tensor fusion benchmark: ResNet-50's 161 gradients, reduced the way a training step does.

Run it as ``hpcdl bench fusion -np 2`` or ``python benchmarks/fusion.py -np 2``: it launches itself on N
ranks with ``hpcdl run --mpi`` through Open MPI's mpirun (so mpi4py runs in the same job; without
mpirun.openmpi or mpi4py, or with ``--no-mpi``, only hpcdl and gloo are measured). ``--hosts host1:1,host2:1``
(``hpcdl run -H`` syntax) runs it across hosts, Open MPI with the allreduce benchmark's settings for TCP.

Each variant reduces the same 161 float32 tensors (25,557,032 parameters, 102 MB), submitted in backward
order (last layer first):

- ``engine``: hpcdl's engine, ``allreduce_async`` of every tensor, then wait for all (fusion on);
- ``hpcdl.torch``: the same through the Horovod API on torch tensors, ``hvd.allreduce_async_`` of every
  tensor then ``hvd.synchronize`` of each, as ``DistributedOptimizer``'s gradient hooks do (needs torch);
- ``packed``: the engine again, on the same tensors as views into one allocation, as a framework that keeps
  its gradients in one flat buffer holds them (DDP's ``gradient_as_bucket_view``): against ``engine`` it
  shows what the placement of separately allocated arrays costs, apart from the engine;
- ``flat``: the same values as one flat buffer through hpcdl's direct allreduce (the lower bound);
- ``gloo``: per-tensor ``torch.distributed.all_reduce(async_op=True)`` on a gloo group, then wait all;
- ``mpi4py``: per-tensor blocking ``comm.Allreduce`` (only when mpi4py and an MPI launcher are present).

The variants run in rounds, each once per round, so that all of them see the machine in the same states;
the report keeps each variant's median step, and each ratio is the median over the rounds of the two
variants' steps in the same round (a paired comparison: the VM's speed changes from second to second).
It also measures a lone 4-byte allreduce through the engine (``allreduce_async``, ``wait``, ``release``)
and through the direct path. Rank 0 prints a table; ``--json`` prints it as JSON. Benchmarks do not
assert.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import socket
import statistics
import time
from typing import Callable, Optional

import numpy as np

try:
    from ._launch import (
        NO_PROGRESS_HELP,
        OPENMPI,
        OPENMPI_ACROSS_HOSTS,
        broadcast_text,
        free_port,
        report_progress,
        run_ranks,
        slots_per_host,
    )
except ImportError:  # run as a script: python benchmarks/fusion.py
    from _launch import (  # type: ignore[no-redef]
        NO_PROGRESS_HELP,
        OPENMPI,
        OPENMPI_ACROSS_HOSTS,
        broadcast_text,
        free_port,
        report_progress,
        run_ranks,
        slots_per_host,
    )


def resnet50_gradient_shapes() -> list[tuple[int, ...]]:
    """Parameter shapes of torchvision's ResNet-50 in definition order: 53 convolutions, 53 batch norms
    (weight and bias each) and the classifier (weight, bias) = 161 tensors, 25,557,032 parameters."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]  # conv1, bn1
    in_channels = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        out_channels = width * 4
        for block in range(blocks):
            shapes += [(width, in_channels, 1, 1), (width,), (width,)]  # conv1 / bn1 (1x1 reduce)
            shapes += [(width, width, 3, 3), (width,), (width,)]  # conv2 / bn2 (3x3)
            shapes += [
                (out_channels, width, 1, 1),
                (out_channels,),
                (out_channels,),
            ]  # conv3 / bn3 (1x1 expand)
            if block == 0:
                shapes += [(out_channels, in_channels, 1, 1), (out_channels,), (out_channels,)]  # downsample
            in_channels = out_channels
    shapes += [(1000, 2048), (1000,)]  # fc
    return shapes


SHAPES = resnet50_gradient_shapes()
assert len(SHAPES) == 161 and sum(int(np.prod(s)) for s in SHAPES) == 25_557_032


def paired_ratio(results: dict[str, list[float]], a: str, b: str) -> float:
    """Median over the rounds of a's step over b's step in the same round (from :func:`timed_rounds`)."""
    return statistics.median(x / y for x, y in zip(results[a], results[b]))


def timed_rounds(
    steps: dict[str, Callable[[], None]],
    warmup: int,
    iterations: int,
    barrier: Callable[[], None],
    on_round: Callable[[int], None] = lambda done: None,
) -> dict[str, list[float]]:
    """Seconds of each step, in rounds: every round runs each variant once, in an order shuffled anew each
    round (the same on every rank). Interleaving makes the variants share whatever state the machine is in
    (this VM's shared-memory speed changes from one second to the next).

    Each timed step follows an untimed step of its own variant, as a training step follows the previous
    one: it pays what that step left running (the engine thread's bookkeeping after the last wait, which
    overlaps the caller's next work) and nothing another variant left."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(iterations):
        order = list(steps)
        random.Random(r).shuffle(order)
        for name in order:
            barrier()
            steps[name]()
            barrier()
            started = time.perf_counter()
            steps[name]()
            seconds[name].append(time.perf_counter() - started)
        on_round(r + 1)
    return seconds


def lone_latency_us(repeats: int) -> dict[str, float]:
    """Median microseconds of one 4-byte allreduce: through the engine (submit, wait, release) and direct."""
    import hpcdl.common as hc
    from hpcdl.common import engine

    x = np.zeros(1, dtype=np.float32)

    def via_engine() -> None:
        handle = engine.allreduce_async(x, name="lone", op=hc.ReduceOp.SUM, out=x)
        handle.wait()
        handle.release()

    variants: dict[str, Callable[[], None]] = {
        "engine_us": via_engine,
        "direct_us": lambda: hc.allreduce(x, op=hc.ReduceOp.SUM, out=x),
    }
    result = {}
    for key, step in variants.items():
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            step()
            samples.append(time.perf_counter() - started)
        result[key] = statistics.median(samples) * 1e6
    return result


def worker(iterations: int, warmup: int, latency_repeats: int, skip: set[str]) -> None:
    """One rank's share of the benchmark; rank 0 prints the report as a ``REPORT {json}`` line."""
    mpi_comm = None
    if "mpi4py" not in skip and ("OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ):
        try:
            from mpi4py import MPI  # initialises MPI before hpcdl looks for it

            mpi_comm = MPI.COMM_WORLD
        except ImportError:
            mpi_comm = None

    import hpcdl.common as hc
    from hpcdl.common import engine

    hc.init()
    rank, size = hc.rank(), hc.size()
    tensors = [np.full(shape, 1.0 + i % 7, dtype=np.float32) for i, shape in enumerate(SHAPES)]
    backward = list(reversed(range(len(tensors))))
    # Named once, as DistributedOptimizer names parameters once (not per step).
    names = [f"grad.{i}" for i in range(len(tensors))]
    flat = np.concatenate([t.ravel() for t in tensors])
    packed_buffer = flat.copy()
    ends = np.cumsum([t.size for t in tensors])
    packed = [packed_buffer[end - t.size : end].reshape(t.shape) for t, end in zip(tensors, ends)]
    steps: dict[str, Callable[[], None]] = {}

    def engine_step(arrays: list[np.ndarray]) -> Callable[[], None]:
        def step() -> None:
            handles = [
                engine.allreduce_async(arrays[i], name=names[i], op=hc.ReduceOp.SUM, out=arrays[i])
                for i in backward
            ]
            for h in handles:
                h.wait()

        return step

    steps["engine"] = engine_step(tensors)
    if "packed" not in skip:
        steps["packed"] = engine_step(packed)
    steps["flat"] = lambda: hc.allreduce(flat, op=hc.ReduceOp.SUM, out=flat)

    if "torch" not in skip:
        import torch

        import hpcdl.torch as hvd

        hvd.init()
        hvd_tensors = [torch.from_numpy(t.copy()) for t in tensors]

        def hvd_step() -> None:
            handles = [hvd.allreduce_async_(hvd_tensors[i], name=names[i], op=hvd.Sum) for i in backward]
            for h in handles:
                hvd.synchronize(h)

        steps["hpcdl.torch"] = hvd_step

    if "gloo" not in skip:
        import torch
        import torch.distributed as dist

        port = np.array([free_port() if rank == 0 else 0], dtype=np.int64)
        hc.broadcast(port, root=0)
        spans_hosts = hc.local_size() < size
        address = broadcast_text(socket.gethostname() if spans_hosts else "127.0.0.1")
        dist.init_process_group(
            "gloo", init_method=f"tcp://{address}:{int(port[0])}", rank=rank, world_size=size
        )
        torch_tensors = [torch.from_numpy(t.copy()) for t in tensors]

        def gloo_step() -> None:
            works = [dist.all_reduce(torch_tensors[i], async_op=True) for i in backward]
            for w in works:
                w.wait()

        steps["gloo"] = gloo_step

    if mpi_comm is not None:
        from mpi4py import MPI

        buffers = [t.copy() for t in tensors]

        def mpi_step() -> None:
            for i in backward:
                mpi_comm.Allreduce(MPI.IN_PLACE, buffers[i], op=MPI.SUM)

        steps["mpi4py"] = mpi_step

    def on_round(done: int) -> None:
        if rank == 0:
            report_progress(done, iterations)

    results = timed_rounds(steps, warmup, iterations, hc.barrier, on_round)
    if "gloo" in steps:
        dist.destroy_process_group()

    latency = lone_latency_us(latency_repeats)
    hc.shutdown()
    if rank != 0:
        return
    median = {name: statistics.median(seconds) for name, seconds in results.items()}
    paired = functools.partial(paired_ratio, results)

    report = {
        "ranks": size,
        "tensors": len(SHAPES),
        "parameters": int(flat.size),
        "median_step_ms": {k: round(v * 1e3, 2) for k, v in median.items()},
        "engine_vs_flat": round(paired("engine", "flat"), 3),
        "packed_vs_flat": round(paired("packed", "flat"), 3) if "packed" in results else None,
        "torch_vs_flat": round(paired("hpcdl.torch", "flat"), 3) if "hpcdl.torch" in results else None,
        "gloo_vs_engine": round(paired("gloo", "engine"), 2) if "gloo" in results else None,
        "mpi4py_vs_engine": round(paired("mpi4py", "engine"), 2) if "mpi4py" in results else None,
        "lone_4_byte_allreduce_us": {k: round(v, 1) for k, v in latency.items()},
    }
    print("REPORT " + json.dumps(report), flush=True)


def render(report: dict) -> str:
    lines = [
        f"ResNet-50 gradients: {report['tensors']} tensors, {report['parameters']:,} float32, "
        f"{report['ranks']} ranks",
        f"{'variant':<12}{'median step':>14}",
    ]
    for name, ms in report["median_step_ms"].items():
        lines.append(f"{name:<12}{ms:>11.2f} ms")
    lines.append(f"engine / flat: {report['engine_vs_flat']}  (target <= 1.05)")
    if report["packed_vs_flat"] is not None:
        lines.append(f"packed / flat: {report['packed_vs_flat']}  (the engine on views into one buffer)")
    if report["torch_vs_flat"] is not None:
        lines.append(f"hpcdl.torch / flat: {report['torch_vs_flat']}")
    if report["gloo_vs_engine"] is not None:
        lines.append(f"gloo / engine: {report['gloo_vs_engine']}  (target >= 4)")
    if report["mpi4py_vs_engine"] is not None:
        lines.append(f"mpi4py / engine: {report['mpi4py_vs_engine']}  (target >= 1)")
    for key, value in report["lone_4_byte_allreduce_us"].items():
        target = "  (target <= 10 us)" if key.startswith("engine") else ""
        lines.append(f"lone 4-byte allreduce, {key[:-3]}: {value} us{target}")
    return "\n".join(lines)


def launch(
    ranks: int, use_mpi: bool, worker_args: list[str], no_progress: bool = False, hosts: Optional[str] = None
) -> dict:
    mpi_args = " ".join(OPENMPI_ACROSS_HOSTS) if hosts else ""
    args = ["--worker", *worker_args]
    texts = run_ranks(__file__, ranks, args, "REPORT", use_mpi, no_progress, hosts=hosts, mpi_args=mpi_args)
    return json.loads(texts[0])


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="hpcdl bench fusion", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-np", "--num-proc", type=int, help="number of ranks (default 2, or every slot of --hosts)"
    )
    parser.add_argument("--hosts", help="run across these hosts (hpcdl run -H syntax: host1:1,host2:1)")
    parser.add_argument(
        "--iterations", type=int, default=10, help="rounds: timed steps per variant (median kept)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first (default 2)")
    parser.add_argument(
        "--latency-repeats",
        type=int,
        default=2000,
        help="lone 4-byte allreduces timed for the latency line, median kept (default 2000)",
    )
    parser.add_argument(
        "--skip", default="", help="comma list of variants to skip: packed, torch, gloo, mpi4py"
    )
    parser.add_argument("--no-mpi", action="store_true", help="launch with hpcdl run only (no mpi4py)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    if args.worker:
        worker(args.iterations, args.warmup, args.latency_repeats, skip)
        return
    per_host = slots_per_host(parser, args.hosts)
    ranks = args.num_proc if args.num_proc is not None else sum(per_host) or 2
    if ranks < 1:
        parser.error("-np must be at least 1")
    use_mpi = not args.no_mpi and "mpi4py" not in skip and shutil.which(OPENMPI) is not None
    worker_args = ["--iterations", str(args.iterations), "--warmup", str(args.warmup)]
    worker_args += ["--latency-repeats", str(args.latency_repeats), "--skip", ",".join(sorted(skip)) or ","]
    report = launch(ranks, use_mpi, worker_args, args.no_progress, args.hosts)
    print(json.dumps(report, indent=2) if args.json else render(report))


if __name__ == "__main__":
    main()
