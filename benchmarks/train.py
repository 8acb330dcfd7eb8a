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
import socket
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from hpcdl.scaling.models import SmallCNN

try:
    from . import _training
    from ._launch import free_port
except ImportError:  # run as a script: python benchmarks/train.py
    import _training  # type: ignore[no-redef]
    from _launch import free_port  # type: ignore[no-redef]


def worker(args: argparse.Namespace) -> Optional[dict]:
    import torch.distributed as dist

    import hpcdl.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    threads = _training.threads_per_rank(args, hvd.local_size())
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

    step_s = _training.interleaved(
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


def table(args: argparse.Namespace, results: dict[int, dict]) -> None:
    """The table of every run (one per rank count)."""
    rows = []
    for ranks, r in results.items():
        eff = {
            key: _training.efficiency(results, ranks, f"{key}_samples_per_s") for key in ("hpcdl", "ddp_gloo")
        }
        eff["hpcdl_local"] = f"{100 * r['hpcdl_vs_no_communication']:.1f}%"
        eff["ddp_local"] = f"{100 * r['ddp_vs_no_communication']:.1f}%"
        rows.append((ranks, r["hpcdl_samples_per_s"], r["ddp_gloo_samples_per_s"], r["hpcdl_over_ddp"], eff))
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
    options = _training.parser(__doc__.split("\n\n")[0], steps=2, repeats=20, framework="torch")
    _training.main(argv, options, __file__, worker, table)


if __name__ == "__main__":
    main()
