"""Rank program of the preemption tests: a small deterministic model trained data-parallel on the CPU
through ``hpcdl.checkpoint.run``, so that a run stopped and resumed any number of times must end with
parameters bitwise equal to those of a run never stopped.

The model (8-16-1, tanh), SGD with momentum through ``hvd.DistributedOptimizer``, an ``ElasticSampler``
that shuffles 256 samples, a batch of 4 per rank, input noise from each rank's own torch generator, one
commit per step and one at each epoch's end. Every rank keeps its own part (``shard``): its random
generators and the count of samples it saw. ``PREEMPT_PLAN`` (see ``preempt_plan.py``) signals or kills
ranks at chosen commits; rank 0 prints ``STEP n`` after every commit with ``--progress``, and every rank a
``RESULT`` line with the SHA-256 of the parameters at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from typing import Any

import torch
from preempt_plan import Plan

import hpcdl.checkpoint
import hpcdl.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--path", default=os.environ.get(hpcdl.checkpoint.contract.PATH_ENV, ""))
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--every", type=int, default=None)
parser.add_argument("--pause", type=float, default=0.0, help="seconds each step waits (room for a signal)")
parser.add_argument("--progress", action="store_true")
args = parser.parse_args()

BATCH, SAMPLES = 4, 256
torch.set_num_threads(1)
hvd.init()
rank = hvd.rank()


class RankPart:
    """This rank's own state: its random generators and the samples it saw."""

    def __init__(self) -> None:
        self.randomness = hpcdl.checkpoint.RandomState()
        self.seen = 0

    def state_dict(self) -> dict[str, Any]:
        return plan.part({"random": self.randomness.state_dict(), "seen": self.seen})

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.randomness.load_state_dict(saved["random"])
        self.seen = saved["seen"]


generator = torch.Generator().manual_seed(1)
features = torch.randn(SAMPLES, 8, generator=generator)
targets = torch.sin(features.sum(dim=1, keepdim=True))
dataset = torch.utils.data.TensorDataset(features, targets)
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
# Its own generator: a loader drawing its seed from torch's global one would draw once more on resuming.
loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler, generator=torch.Generator())
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), named_parameters=model.named_parameters()
)
state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
plan = Plan(rank, args.path, lambda: state.commit_count)
part = RankPart()
resumed_at: list[int] = []


def train(state: hvd.elastic.TorchState) -> int:
    resumed_at.append(state.commit_count)
    while state.epoch < args.epochs:
        for x, y in loader:
            plan.before_step(state.commit_count + 1)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x + 0.01 * torch.randn(x.shape)), y)
            loss.backward()
            optimizer.step()
            sampler.record_batch(state.batch, BATCH)
            part.seen += len(x)
            state.batch += 1
            state.commit()
            if rank == 0 and args.progress:
                print(f"STEP {state.commit_count}", flush=True)
            time.sleep(args.pause)
        state.epoch += 1
        state.batch = 0
        sampler.set_epoch(state.epoch)
        state.commit()
        if rank == 0 and args.progress:
            print(f"STEP {state.commit_count}", flush=True)
    return state.commit_count


steps = hpcdl.checkpoint.run(train, state, args.path, shard=part, every=args.every)
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
result = {"rank": rank, "size": hvd.size(), "steps": steps, "epoch": state.epoch, "params": digest,
          "seen": part.seen, "resumed_at": resumed_at[0]}  # fmt: skip
print("RESULT " + json.dumps(result), flush=True)
