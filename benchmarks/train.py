"""Training throughput: hpcdl.torch.DistributedOptimizer against torch DistributedDataParallel (gloo).

Both train the same small CNN on the same synthetic data in the same job, one after the other, and are
timed over the same number of steps. Run the comparison and the scaling efficiency in one go::

    python benchmarks/train.py --launch 1,2

which starts ``hpcdl run -np 1`` and ``hpcdl run -np 2`` of this script and prints one table: samples/s
of each, their ratio, each one's scaling efficiency (samples/s on N ranks / (N × samples/s on 1 rank)),
and each one against the same ranks taking the same steps without communicating ("no-comm", timed in
the same job, turn about): an efficiency that a busy shared machine distorts less, since both sides of
the ratio see the same load. Run directly on every rank (``hpcdl run -np 2 python
benchmarks/train.py``) it prints that job's figures from rank 0 (``--json`` for tools).

Each rank gets its own share of the cores as torch threads: ``cores / largest rank count`` with
``--launch`` (so 1 rank is measured with the share each of N ranks has), ``cores / ranks on the host`` when
run directly; ``--threads`` overrides it. Benchmarks do not assert.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from hpcdl.scaling.models import SmallCNN

try:
    from ._launch import NO_PROGRESS_HELP, free_port, report_progress, run_ranks
except ImportError:  # run as a script: python benchmarks/train.py
    from _launch import NO_PROGRESS_HELP, free_port, report_progress, run_ranks  # type: ignore[no-redef]


def _interleaved(
    steps_by_name: dict[str, Callable[[], None]], args: argparse.Namespace, barrier, report: bool
) -> dict:
    """Median seconds per step of each variant. The variants take turns, one timed window of
    ``args.steps`` steps each per round, in alternating order (ABBA...), so that changes in machine load
    and any first-in-round effect hit them alike."""
    for step in steps_by_name.values():
        for _ in range(args.warmup):
            step()
    windows: dict[str, list[float]] = {name: [] for name in steps_by_name}
    for round_index in range(args.repeats):
        order = list(steps_by_name.items())
        for name, step in order if round_index % 2 == 0 else reversed(order):
            barrier()
            started = time.perf_counter()
            for _ in range(args.steps):
                step()
            barrier()
            windows[name].append((time.perf_counter() - started) / args.steps)
        if report:
            report_progress(round_index + 1, args.repeats)
    return {name: statistics.median(seconds) for name, seconds in windows.items()}


def worker(args: argparse.Namespace) -> Optional[dict]:
    import torch.distributed as dist

    import hpcdl.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    threads = args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size())
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(rank)
    images = torch.randn(args.batch_size, 3, 32, 32, generator=gen)
    labels = torch.randint(0, 10, (args.batch_size,), generator=gen)

    def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
        def step() -> None:
            optimizer.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()

        return step

    # hpcdl.torch: Horovod's recipe.
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    # torch DDP on a gloo process group; rank 0 picks the port and tells the others through hpcdl.
    host = socket.gethostname() if size > 1 else "127.0.0.1"
    address = hvd.broadcast_object((host, free_port()) if rank == 0 else None, root_rank=0)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{address[0]}:{address[1]}", rank=rank, world_size=size
    )
    torch.manual_seed(0)
    ddp_model = torch.nn.parallel.DistributedDataParallel(SmallCNN())
    ddp_optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)

    # The same step without any communication, on the same ranks at the same time: what the machine
    # (however busy it is) gives when distribution costs nothing.
    torch.manual_seed(0)
    local_model = SmallCNN()
    local_optimizer = torch.optim.SGD(local_model.parameters(), lr=0.01, momentum=0.9)

    step_s = _interleaved(
        {
            "hpcdl": train_step(model, optimizer),
            "ddp": train_step(ddp_model, ddp_optimizer),
            "local": train_step(local_model, local_optimizer),
        },
        args,
        hvd.barrier,
        args.report_progress and rank == 0,
    )
    dist.destroy_process_group()
    hvd.shutdown()
    if rank != 0:
        return None
    global_batch = args.batch_size * size
    return {
        "ranks": size,
        "threads_per_rank": threads,
        "batch_per_rank": args.batch_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "hpcdl_samples_per_s": round(global_batch / step_s["hpcdl"], 1),
        "ddp_gloo_samples_per_s": round(global_batch / step_s["ddp"], 1),
        "hpcdl_over_ddp": round(step_s["ddp"] / step_s["hpcdl"], 3),
        "hpcdl_vs_no_communication": round(step_s["local"] / step_s["hpcdl"], 3),
        "ddp_vs_no_communication": round(step_s["local"] / step_s["ddp"], 3),
    }


def launch(args: argparse.Namespace) -> None:
    """Run the worker under ``hpcdl run -np N`` for each N and print the combined table."""
    results = {}
    counts = [int(n) for n in args.launch.split(",")]
    # The same share of the machine per rank in every run, so that N ranks are compared with one of them.
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(counts))
    for ranks in counts:
        worker_args = [
            "--json",
            "--report-progress",
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--repeats",
            str(args.repeats),
        ]
        worker_args += ["--batch-size", str(args.batch_size), "--threads", str(threads)]
        texts = run_ranks(__file__, ranks, worker_args, "RESULT", no_progress=args.no_progress)
        results[ranks] = json.loads(texts[0])
    base = results.get(1)
    rows = []
    for ranks, r in results.items():
        eff = {}
        for key in ("hpcdl", "ddp_gloo"):
            single = base[f"{key}_samples_per_s"] if base else None
            eff[key] = f"{100 * r[f'{key}_samples_per_s'] / (ranks * single):.1f}%" if single else "n/a"
        eff["hpcdl_local"] = f"{100 * r['hpcdl_vs_no_communication']:.1f}%"
        eff["ddp_local"] = f"{100 * r['ddp_vs_no_communication']:.1f}%"
        rows.append((ranks, r["hpcdl_samples_per_s"], r["ddp_gloo_samples_per_s"], r["hpcdl_over_ddp"], eff))
    if args.json:
        print(json.dumps({"results": results}, indent=2))
        return
    first = results[next(iter(results))]
    print(
        f"SmallCNN ({first['parameters']:,} parameters), synthetic 3x32x32 images, "
        f"batch {args.batch_size} per rank, {first['threads_per_rank']} thread(s) per rank"
    )
    print(
        "| ranks | hpcdl samples/s | DDP-gloo samples/s | hpcdl / DDP | hpcdl scaling | DDP scaling "
        "| hpcdl vs no-comm | DDP vs no-comm |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for ranks, hpcdl_sps, ddp_sps, ratio, eff in rows:
        cells = [
            str(ranks),
            f"{hpcdl_sps:.1f}",
            f"{ddp_sps:.1f}",
            f"{ratio:.3f}",
            eff["hpcdl"],
            eff["ddp_gloo"],
            eff["hpcdl_local"],
            eff["ddp_local"],
        ]
        print("| " + " | ".join(cells) + " |")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launch", help="comma list of rank counts to launch with hpcdl run, e.g. 1,2")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=2, help="steps per timed window")
    parser.add_argument("--repeats", type=int, default=20, help="timed windows per variant (median kept)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads per rank (0: cores / local ranks)"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    parser.add_argument("--report-progress", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.launch:
        launch(args)
        return
    result = worker(args)
    if result is None:
        return
    if args.json:
        print("RESULT " + json.dumps(result), flush=True)
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
