"""Rank program of the elastic tests: Horovod's elastic recipe on a tiny model.

Every step reduces the same gradient on every rank, so the weights after EPOCHS committed steps do not
depend on how many workers there were or how often they regrouped: a run that loses or gains workers must
end with the weights of an undisturbed run. FAIL_WORKER exits at epoch 2 (in round 1 only: a worker never
runs again once it failed), with FAIL_HOW=raise by raising an error of its own; PAUSE slows the steps so
that a new host can join before the end; MARK_FILE is created by rank 0 once MARK_EPOCH epochs are
committed (so a test changes the hosts after real progress).
"""

from __future__ import annotations

import json
import os
import time

import torch

import hpcdl.torch as hvd

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
)
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0)
worker = int(os.environ["HPCDL_ELASTIC_WORKER"])
fail = int(os.environ.get("FAIL_WORKER", "-1"))
epochs = int(os.environ.get("EPOCHS", "6"))
pause = float(os.environ.get("PAUSE", "0.05"))
mark, mark_epoch = os.environ.get("MARK_FILE", ""), int(os.environ.get("MARK_EPOCH", "0"))
sizes_seen: list[int] = []


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    while state.epoch < epochs:
        loss = model(torch.ones(8, 4)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        counted = int(hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item())
        if counted != hvd.size():
            raise AssertionError(f"{counted} ranks answered in a round of {hvd.size()}")
        if worker == fail and state.epoch == 2:
            if os.environ.get("FAIL_HOW") == "raise":
                raise ValueError(f"worker {worker} gives up")
            os._exit(3)
        sizes_seen.append(hvd.size())
        state.epoch += 1
        state.commit()
        if mark and hvd.rank() == 0 and state.epoch == mark_epoch:
            open(mark, "w").close()
        time.sleep(pause)


train(state)
result = {
    "worker": worker,
    "rank": hvd.rank(),
    "size": hvd.size(),
    "epoch": state.epoch,
    "sizes": sorted(set(sizes_seen)),
    "weight": model.weight.detach().tolist(),
}
print("RESULT " + json.dumps(result), flush=True)
