"""Horovod's Keras callbacks, as mixins: ``hpcdl.keras.callbacks`` and ``hpcdl.tensorflow.keras.callbacks``
put each before their Keras' ``Callback`` and give it a ``framework()``.

- ``BroadcastGlobalVariablesCallback(root_rank)``: every rank starts from the root's model and optimizer
  state. The model's weights are broadcast in ``on_train_begin``, so the first step already starts from
  identical weights (Horovod broadcasts after the first batch); the optimizer's variables as soon as it
  has made them (before training in Keras 3, after the first batch with tf-keras). The model's weights
  travel (trainable and not, e.g. batch-norm statistics), not its random-seed state: each rank keeps
  drawing its own dropout masks.
- ``MetricAverageCallback()``: at the end of each epoch the logged metrics are averaged over ranks (one
  collective for all of them), so callbacks after it (checkpoints, early stopping) see the same numbers.
- ``LearningRateScheduleCallback`` / ``LearningRateWarmupCallback``: Horovod's schedules, per epoch
  (``staircase``) or per batch. Momentum correction keeps SGD's (and RMSprop's) velocity consistent when
  the rate changes: Keras 3 compiles the momentum coefficient into the train step, so instead of changing
  it for one batch the velocity is rescaled by new_lr / old_lr, which is the same update.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import numpy as np

from hpcdl._keras.framework import Framework, momentum_buffers, optimizer_built, optimizer_variables, scalar
from hpcdl.common.basics import rank, size


class FrameworkCallback:
    """A callback that talks to the ranks through ``framework()``, which the concrete class provides."""

    model: Any
    params: Any

    @staticmethod
    def framework() -> Framework:
        raise NotImplementedError


class BroadcastGlobalVariablesCallback(FrameworkCallback):
    """Broadcast the model's and the optimizer's variables from ``root_rank`` when training starts, so
    that every rank starts from the same state (random initialization, a checkpoint loaded on the root)."""

    def __init__(self, root_rank: int, device: str = "", local_variables: Optional[list[Any]] = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self._local = [id(v) for v in local_variables or []]
        self._model_done = False
        self._optimizer_done = False

    def register_local_var(self, var: Any) -> None:
        """Leave ``var`` out of the broadcast (a variable each rank keeps for itself)."""
        self._local.append(id(var))

    def _broadcast(self) -> None:
        variables: list[Any] = []
        if not self._model_done:
            variables += [v for v in self.model.weights if id(v) not in self._local]
            self._model_done = True
        optimizer = self.model.optimizer
        if optimizer is not None and optimizer_built(optimizer) and not self._optimizer_done:
            variables += [v for v in optimizer_variables(optimizer) if id(v) not in self._local]
            self._optimizer_done = True
        if variables:
            self.framework().broadcast_variables(variables, self.root_rank)

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self._broadcast()

    def on_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        if not (self._model_done and self._optimizer_done):
            self._broadcast()


class MetricAverageCallback(FrameworkCallback):
    """Average the metrics in the epoch's logs over all ranks, all in one allreduce (put it before the
    callbacks that read them). Metrics may be scalars or arrays; every rank must log the same ones."""

    def __init__(self, device: str = "") -> None:
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if not logs:
            return
        names = sorted(logs)
        values = [np.asarray(logs[k], dtype=np.float64) for k in names]
        flat = np.concatenate([v.reshape(-1) for v in values])
        averaged = self.framework().average(flat, "MetricAverageCallback.logs")
        start = 0
        for key, value in zip(names, values):
            part = averaged[start : start + value.size].reshape(value.shape)
            logs[key] = float(part) if value.ndim == 0 else part
            start += value.size


class LearningRateScheduleCallback(FrameworkCallback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` until
    ``end_epoch``: once per epoch when ``staircase``, else every batch with a fractional epoch.
    ``multiplier`` is a function of the epoch or a number (then ``multiplier ** (epoch - start_epoch)``)."""

    def __init__(
        self,
        initial_lr: float,
        multiplier: Union[float, Callable[[float], float]],
        start_epoch: int = 0,
        end_epoch: Optional[int] = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: Optional[int] = None,
    ) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _learning_rate(self) -> float:
        return scalar(self.model.optimizer.learning_rate)

    def _adjust_learning_rate(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old_lr = self._learning_rate()
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        if self.momentum_correction and old_lr > 0 and new_lr != old_lr:
            for velocity in momentum_buffers(optimizer):
                velocity.assign(velocity * (new_lr / old_lr))

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            steps = self.params.get("steps") if self.params else None
            if not steps:
                raise ValueError(
                    "Could not autodetect the number of steps per epoch. Please specify the steps_per_epoch "
                    f"parameter to the {type(self).__name__}()."
                )
            self.steps_per_epoch = steps

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.current_epoch = epoch

    def on_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
        if self.current_epoch < self.start_epoch or (
            self.end_epoch is not None and self.current_epoch >= self.end_epoch
        ):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if logs is not None:
            logs["lr"] = self._learning_rate()


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``, batch by
    batch (Goyal et al., "Accurate, Large Minibatch SGD"); ``initial_lr`` is the rate already scaled by the
    number of ranks."""

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: Optional[int] = None,
        verbose: int = 0,
    ) -> None:
        def multiplier(epoch: float) -> float:
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / size() * (epoch * (size() - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr,
            multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
        )
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {self._learning_rate():g}.")
