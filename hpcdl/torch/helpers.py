"""Training-loop helpers for plain PyTorch (what Horovod's Keras callbacks give Keras users):
learning-rate warmup after scaling the rate by ``hvd.size()``, and metrics averaged over ranks."""

from __future__ import annotations

from typing import Optional, Union

import torch

from hpcdl.torch.basics import size
from hpcdl.torch.ops import allreduce
from hpcdl.torch.process_sets import ProcessSet, global_process_set
from hpcdl.torch.reduce_ops import Average, Sum


def warmup_factor(progress_epochs: float, warmup_epochs: float, world_size: int) -> float:
    """Horovod's warmup multiplier: 1/size at the start, rising linearly to 1 after ``warmup_epochs``
    (Goyal et al., "Accurate, Large Minibatch SGD", 2017)."""
    if warmup_epochs <= 0 or progress_epochs >= warmup_epochs:
        return 1.0
    return (progress_epochs * (world_size - 1) / warmup_epochs + 1.0) / world_size


class LearningRateWarmup:
    """Ramp every param group's learning rate from ``lr / size`` up to its ``lr`` over the first
    ``warmup_epochs`` epochs, batch by batch (Horovod's ``LearningRateWarmupCallback``).

    Create it after scaling the learning rate by ``hvd.size()``; call ``step(epoch, batch)`` before each
    ``optimizer.step()``. After the warmup the target rates are left in place, so a scheduler may take over.
    (PyTorch's SGD keeps the learning rate out of its momentum buffer, so no momentum correction is needed.)
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_epochs: float = 5,
        steps_per_epoch: Optional[int] = None,
        world_size: Optional[int] = None,
    ) -> None:
        if warmup_epochs < 0:
            raise ValueError(f"warmup_epochs must be >= 0, got {warmup_epochs}")
        if steps_per_epoch is not None and steps_per_epoch <= 0:
            raise ValueError(f"steps_per_epoch must be > 0, got {steps_per_epoch}")
        self.optimizer = optimizer
        self.warmup_epochs = warmup_epochs
        self.steps_per_epoch = steps_per_epoch
        self.world_size = world_size if world_size is not None else size()
        self.target_lrs = [group["lr"] for group in optimizer.param_groups]

    def step(self, epoch: int, batch: int = 0) -> float:
        """Set the rates for this batch; returns the multiplier applied to the target rates."""
        progress = float(epoch)
        if self.steps_per_epoch:
            progress += batch / self.steps_per_epoch
        factor = warmup_factor(progress, self.warmup_epochs, self.world_size)
        for group, target in zip(self.optimizer.param_groups, self.target_lrs):
            group["lr"] = target * factor
        return factor


def metric_average(
    value: Union[float, torch.Tensor],
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> float:
    """The average of a scalar metric over the ranks (e.g. validation loss or accuracy)."""
    tensor = value.detach().to("cpu", torch.float64) if torch.is_tensor(value) else torch.tensor(float(value))
    return float(
        allreduce(tensor.reshape(1).to(torch.float64), name=name, op=Average, process_set=process_set)
    )


class Metric:
    """A running metric averaged over all samples of all ranks.

    ``update(value, n)`` adds ``value`` as the mean over ``n`` local samples; ``avg`` reduces the running
    sums across ranks (one allreduce) and returns the global sample-weighted mean. Ranks must read
    ``avg`` at the same points.
    """

    def __init__(self, name: str, process_set: ProcessSet = global_process_set) -> None:
        self.name = name
        self.process_set = process_set
        self.total = 0.0
        self.count = 0.0

    def update(self, value: Union[float, torch.Tensor], n: int = 1) -> None:
        v = float(value.detach().item()) if torch.is_tensor(value) else float(value)
        self.total += v * n
        self.count += n

    @property
    def avg(self) -> float:
        sums = allreduce(
            torch.tensor([self.total, self.count], dtype=torch.float64),
            name=f"metric.{self.name}",
            op=Sum,
            process_set=self.process_set,
        )
        return float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")
