"""Data-parallel training that survives preemption and walltimes (README "Preemption-proof training").

Submit it with a checkpoint directory; the job is signalled before its walltime, saves at the next step
on every rank, is requeued, and goes on from that step:

    hpcdl submit --nodes 2 --time 2h --checkpoint $SCRATCH/run1 examples/preemptible_train.py --epochs 50

or run it anywhere with ``hpcdl run -np 2 python examples/preemptible_train.py --checkpoint DIR``: a
USR2 or TERM to any rank stops the job with its state saved; running the same command again resumes.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import hpcdl.checkpoint
import hpcdl.torch as hvd

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
parser.add_argument("--checkpoint", default=None, help="directory (default: HPCDL_CHECKPOINT, from submit)")
parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step (a longer demo)")
args = parser.parse_args()

hvd.init()
torch.set_num_threads(1)
torch.manual_seed(0)
features = torch.randn(1024, 16, generator=torch.Generator().manual_seed(1))
data = TensorDataset(features, features[:, :4].sum(dim=1, keepdim=True).sin())
# Every rank draws its share of a shuffle; the sampler also remembers how far the epoch got.
sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=0)
# Its own generator: drawing a seed from torch's global one would draw once more after a restart.
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, generator=torch.Generator())
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), named_parameters=model.named_parameters()
)
state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)


def train(state: hvd.elastic.TorchState) -> float:
    loss = torch.zeros(())
    while state.epoch < args.epochs:
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            sampler.record_batch(0, args.batch_size)  # before the commit: the batch is done
            state.commit()  # where every rank may stop and save together
            time.sleep(args.step_seconds)
        state.epoch += 1
        sampler.set_epoch(state.epoch)
        state.commit()
        if hvd.rank() == 0:
            print(
                f"epoch {state.epoch}/{args.epochs}: loss {loss.item():.5f} (step {state.commit_count})",
                flush=True,
            )
    return loss.item()


final = hpcdl.checkpoint.run(train, state, args.checkpoint)
if hvd.rank() == 0:
    print(f"done: {args.epochs} epochs, {state.commit_count} steps, final loss {final:.5f}")
