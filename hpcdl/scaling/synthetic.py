"""``python -m hpcdl.scaling.synthetic``: one rank of the built-in workload of a scaling study.

Trains a built-in model (:mod:`hpcdl.scaling.models`) on random images the Horovod way
(``hpcdl.torch.DistributedOptimizer``, parameters broadcast from rank 0) and reports every step through
:class:`~hpcdl.common.steps.StepTimer`, so its records are the same as a user's script would write.
"""

from __future__ import annotations

import argparse
from typing import Optional

from hpcdl.common.steps import StepTimer


def parse(argv: Optional[list[str]]) -> argparse.Namespace:
    from hpcdl.scaling.models import MODELS

    parser = argparse.ArgumentParser(prog="python -m hpcdl.scaling.synthetic", description=__doc__)
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--batch", type=int, required=True, help="samples per rank per step")
    parser.add_argument("--steps", type=int, required=True, help="steps after the warm-up")
    parser.add_argument("--warmup", type=int, default=0, help="steps first (recorded, discarded later)")
    parser.add_argument("--image-size", type=int, default=0, help="image side (0: the model's own)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> None:
    args = parse(argv)
    import torch
    import torch.nn.functional as F

    import hpcdl.torch as hvd
    from hpcdl.scaling.models import MODELS

    hvd.init()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    build, side, classes = MODELS[args.model]
    side = args.image_size or side
    torch.manual_seed(0)
    model = build()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    generator = torch.Generator().manual_seed(hvd.rank())
    images = torch.randn(args.batch, 3, side, side, generator=generator)
    labels = torch.randint(0, classes, (args.batch,), generator=generator)
    with StepTimer(samples_per_step=args.batch) as timer:
        timer.watch(optimizer)
        for _ in range(args.warmup + args.steps):
            with timer.step():
                optimizer.zero_grad()
                F.cross_entropy(model(images), labels).backward()
                optimizer.step()
    hvd.shutdown()
    if timer.rank == 0:
        print(f"hpcdl scaling: {args.warmup + args.steps} steps of {args.model} done", flush=True)


if __name__ == "__main__":
    main()
