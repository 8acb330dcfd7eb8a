"""Rank program of the preemption tests without a framework (starts in a second): linear regression in
NumPy with momentum, gradients averaged across ranks by ``hpcdl.common.allreduce``, an ``ObjectState``
holding the weights and the position in a per-epoch shuffle, through ``hpcdl.checkpoint.run``.

Each rank adds noise from its own NumPy generator, kept in its part of the checkpoint (``--shard``; without
it the noise is off, so that the run can continue on another number of ranks). ``PREEMPT_PLAN``: see
``preempt_plan.py``. Rank 0 prints ``STEP n`` after every commit with ``--progress``, and every rank a
``RESULT`` line with the SHA-256 of the weights at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from typing import Any

import numpy as np
from preempt_plan import Plan

import hpcdl.checkpoint
import hpcdl.common as hc
from hpcdl.common.elastic_state import ObjectState

parser = argparse.ArgumentParser()
parser.add_argument("--path", default=os.environ.get(hpcdl.checkpoint.contract.PATH_ENV, ""))
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--every", type=int, default=None)
parser.add_argument("--shard", action="store_true")
parser.add_argument("--pause", type=float, default=0.0, help="seconds each step waits (room for a signal)")
parser.add_argument("--progress", action="store_true")
args = parser.parse_args()

BATCH, SAMPLES = 4, 96
hc.init()
rank, size = hc.rank(), hc.size()
data = np.random.default_rng(1).standard_normal((SAMPLES, 8))
targets = np.sin(data.sum(axis=1))
np.random.seed(1000 + rank)
state = ObjectState(weights=np.zeros(8), momentum=np.zeros(8), epoch=0, position=0, seen=0)
plan = Plan(rank, args.path, lambda: state.commit_count)


class RankPart:
    def __init__(self) -> None:
        self.randomness = hpcdl.checkpoint.RandomState()

    def state_dict(self) -> dict[str, Any]:
        return plan.part({"random": self.randomness.state_dict()})

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.randomness.load_state_dict(saved["random"])


def train(state: ObjectState) -> dict[str, Any]:
    resumed_at = state.commit_count
    while state.epoch < args.epochs:
        order = np.random.default_rng(100 + state.epoch).permutation(SAMPLES)
        while state.position < SAMPLES:
            plan.before_step(state.commit_count + 1)
            mine = order[state.position : state.position + BATCH * size][rank::size]
            x, y = data[mine], targets[mine]
            gradient = x.T @ (x @ state.weights - y) / max(len(mine), 1)
            if args.shard:
                gradient = gradient + 1e-3 * np.random.standard_normal(8)
            gradient = hc.allreduce(gradient, op=hc.ReduceOp.AVERAGE)
            state.momentum = 0.9 * state.momentum + gradient
            state.weights = state.weights - 0.05 * state.momentum
            state.seen += min(BATCH * size, SAMPLES - state.position)
            state.position += BATCH * size
            state.commit()
            if rank == 0 and args.progress:
                print(f"STEP {state.commit_count}", flush=True)
            time.sleep(args.pause)
        state.epoch += 1
        state.position = 0
        state.commit()
        if rank == 0 and args.progress:
            print(f"STEP {state.commit_count}", flush=True)
    return {"resumed_at": resumed_at}


shard = RankPart() if args.shard else None
outcome = hpcdl.checkpoint.run(train, state, args.path, shard=shard, every=args.every)
digest = hashlib.sha256(state.weights.tobytes()).hexdigest()
result = {"rank": rank, "size": size, "steps": state.commit_count, "params": digest, "seen": state.seen}
print("RESULT " + json.dumps({**result, **outcome}), flush=True)
