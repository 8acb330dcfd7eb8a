"""Elastic Keras training (Horovod's ``hvd.elastic`` for Keras): ``KerasState`` holds a model and its
optimizer in memory, the callbacks commit it and record the progress, ``run`` retries after a failure.
The callbacks are mixins, put before their Keras' ``Callback`` by ``hpcdl.keras.elastic`` and
``hpcdl.tensorflow.keras.elastic``; ``KerasState`` takes the framework.

Usage, as with Horovod::

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    @hvd.elastic.run
    def train(state):
        model.fit(data, epochs=10 - state.epoch, callbacks=[
            hvd.elastic.CommitStateCallback(state),
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state)])

``UpdateBatchStateCallback`` records the batch in ``state.batch``; Keras fixes an epoch's length when it
starts, so it cannot shorten the first epoch after a reset (Horovod's Keras 2 trick): pass
``steps_per_epoch`` accordingly if that matters.
"""

from __future__ import annotations

from typing import Any, Optional

from hpcdl._keras.framework import Framework, build_optimizer, optimizer_built, optimizer_variables
from hpcdl.common.basics import rank
from hpcdl.common.elastic_state import State, VariablesState


class KerasState(VariablesState):
    """State of a Keras model and its optimizer (``model.optimizer`` unless given), plus plain attributes
    given as keyword arguments. The model must be built; an optimizer not built yet is built on the model's
    trainable variables, so that every rank (a new one too) synchronizes the same variables."""

    def __init__(self, framework: Framework, model: Any, optimizer: Optional[Any] = None, **kwargs: Any):
        if not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer or model.optimizer
        if self.optimizer is None:
            raise ValueError("KerasState needs an optimizer: pass optimizer= or compile the model first")
        if not optimizer_built(self.optimizer):
            build_optimizer(self.optimizer, model.trainable_variables)
        super().__init__(
            list(model.weights) + optimizer_variables(self.optimizer),
            framework.broadcast_variables,
            bcast_object=framework.hvd.broadcast_object,
            get_rank=rank,
            **kwargs,
        )


class CommitStateCallback:
    """Commit ``state`` every ``batches_per_commit`` batches and at the end of every epoch."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self.batches_remaining = self.batches_per_commit  # the same on every rank after a reset

    def on_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback:
    """Keep ``state.batch`` at the last finished batch of the epoch (0 after an epoch)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def on_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback:
    """Keep ``state.epoch`` at the number of finished epochs, counted across resets."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        # fit(epochs=total - state.epoch) counts from 0 again after a reset; +1: the finished epoch is not
        # repeated.
        self.state.epoch = self.initial_epoch + epoch + 1
