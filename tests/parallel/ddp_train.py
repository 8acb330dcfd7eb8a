"""Rank program of the torch.distributed interop tests: an unchanged DDP (gloo) training script, started by
``hpcdl run`` or by a script of ``hpcdl submit``, next to an hpcdl allreduce at the launcher's rendezvous.

It reads nothing but torch.distributed's env:// variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) and
LOCAL_RANK / LOCAL_WORLD_SIZE, trains a few steps on rank-dependent data, and prints one RESULT line: its
identity, whether every rank ended with the same weights, and the hpcdl allreduce of rank + 1.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import hpcdl.common as hc

hc.init()
hpcdl_sum = float(hc.allreduce(np.array([hc.rank() + 1.0]))[0])
dist.init_process_group("gloo")  # env://
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
initial = model.module.weight.detach().clone()
for step in range(3):
    optimizer.zero_grad()
    model(torch.full((8, 4), float(rank + step + 1))).sum().backward()
    optimizer.step()
weights = model.module.weight.detach().clone()
gathered = [torch.zeros_like(weights) for _ in range(world)]
dist.all_gather(gathered, weights)
result = {
    "rank": rank,
    "world": world,
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "local_world": int(os.environ["LOCAL_WORLD_SIZE"]),
    "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
    "rendezvous_port": os.environ.get("HPCDL_RENDEZVOUS_PORT", ""),
    "weights_agree": all(torch.equal(gathered[0], w) for w in gathered),
    "weights_moved": not torch.equal(weights, initial),
    "hpcdl_sum": hpcdl_sum,
    "hpcdl_rank": hc.rank(),
}
print("RESULT " + json.dumps(result), flush=True)
dist.destroy_process_group()
hc.shutdown()
sys.stdout.flush()
# torch 2.13 (CPU) sometimes aborts at interpreter exit after a gloo group ("terminate called without an
# active exception", about 1 run in 20, without hpcdl too); the work is done: skip the interpreter teardown.
os._exit(0)
