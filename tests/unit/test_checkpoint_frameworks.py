"""``hpcdl.checkpoint.run`` with each framework's elastic state, in a job of one process: PyTorch's
``TorchState`` (model, optimizer with momentum, ``ElasticSampler`` position), TensorFlow's
``TensorFlowState`` and Keras's ``KerasState`` stop at a commit and continue bitwise where they stopped."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hpcdl.checkpoint as ckpt
import hpcdl.common as hc
from hpcdl.checkpoint import CheckpointError, PreemptionInterrupt


@pytest.fixture(autouse=True)
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("HPCDL_RANK", "HPCDL_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(var, raising=False)
    yield
    hc.shutdown()


def _stop_at(step: int, current: int) -> None:
    if current == step:
        os.kill(os.getpid(), signal.SIGUSR2)


def test_torch_state_resumes_model_optimizer_and_sampler_bitwise(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import hpcdl.torch as hvd

    hvd.init()

    def build() -> tuple[Any, Any, Any, Any]:
        torch.manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
        sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=2)
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)
        loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler, generator=torch.Generator())
        return state, loader, model, optimizer

    def train(state: Any, loader: Any, model: Any, optimizer: Any, stop: int) -> Any:
        while state.epoch < 2:
            for x, y in loader:
                _stop_at(stop, state.commit_count + 1)
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                state.sampler.record_batch(0, 4)
                state.commit()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()
        return model.weight.detach().clone()

    reference = build()
    expected = train(*reference, stop=-1)
    first = build()
    with pytest.raises(PreemptionInterrupt):
        ckpt.run(lambda s: train(*first, stop=7), first[0], tmp_path, exit_on_stop=False)
    second = build()
    got = ckpt.run(lambda s: train(*second, stop=-1), second[0], tmp_path)
    assert torch.equal(got, expected)
    assert torch.equal(second[3].state_dict()["state"][0]["momentum_buffer"],
                       reference[3].state_dict()["state"][0]["momentum_buffer"])  # fmt: skip

    other = hvd.elastic.TorchState(
        torch.nn.Linear(3, 2), torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), 0.1)
    )
    with pytest.raises(
        CheckpointError, match=r"another training.*model\.weight: torch\.float32\[1, 3\] in the checkpoint"
    ):
        ckpt.run(lambda s: None, other, tmp_path)


def test_tensorflow_and_keras_states_resume_bitwise(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    import hpcdl.keras as hvd_keras
    import hpcdl.tensorflow as hvd

    hvd.init()

    def train_variables(state: Any, stop: int) -> np.ndarray:
        while state.step < 6:
            _stop_at(stop, state.commit_count + 1)
            state.variables_[0].assign(state.variables_[0] * 1.5 + 1.0)
            state.step += 1
            state.commit()
        return state.variables_[0].numpy()

    def variables_state() -> Any:
        variable = tf.Variable(np.arange(4, dtype=np.float32))
        state = hvd.elastic.TensorFlowState([variable], step=0)
        state.variables_ = [variable]
        return state

    expected = train_variables(variables_state(), stop=-1)
    with pytest.raises(PreemptionInterrupt):
        ckpt.run(lambda s: train_variables(s, 4), variables_state(), tmp_path / "tf", exit_on_stop=False)
    got = ckpt.run(lambda s: train_variables(s, -1), variables_state(), tmp_path / "tf")
    assert np.array_equal(got, expected)

    def keras_state() -> Any:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
        return hvd_keras.elastic.KerasState(model, epoch=0)

    x, y = np.ones((8, 3), np.float32), np.zeros((8, 2), np.float32)

    def fit(state: Any, stop: int) -> list[np.ndarray]:
        class Stop(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                _stop_at(stop, state.commit_count + 1)

        callbacks = [
            Stop(),
            hvd_keras.elastic.UpdateEpochStateCallback(state),
            hvd_keras.elastic.CommitStateCallback(state, 100),
        ]
        state.model.fit(
            x, y, batch_size=8, epochs=4 - state.epoch, verbose=0, shuffle=False, callbacks=callbacks
        )
        return state.model.get_weights()

    expected_weights = fit(keras_state(), stop=-1)
    with pytest.raises(PreemptionInterrupt):
        ckpt.run(lambda s: fit(s, 3), keras_state(), tmp_path / "keras", exit_on_stop=False)
    weights = ckpt.run(lambda s: fit(s, -1), keras_state(), tmp_path / "keras")
    assert all(np.array_equal(a, b) for a, b in zip(weights, expected_weights))
