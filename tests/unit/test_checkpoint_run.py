"""``hpcdl.checkpoint.run`` in a job of one process: the agreement at a commit (a real signal to this
process, one or two of them, or one during a write), what is written and resumed, and the errors a user
can cause. The same protocol across real ranks and Slurm nodes: tests/parallel/test_checkpoint_ranks.py,
tests/integration/test_checkpoint_slurm.py."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import hpcdl.checkpoint as ckpt
import hpcdl.common as hc
from hpcdl.checkpoint import CheckpointError, PreemptionInterrupt, contract
from hpcdl.checkpoint.store import MANIFEST
from hpcdl.common.elastic_state import ObjectState, run_fn, stop_requested

STEPS = 12


@pytest.fixture(autouse=True)
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("HPCDL_RANK", "HPCDL_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(var, raising=False)
    for var in (contract.PATH_ENV, contract.SIGNALS_ENV, contract.REQUEUE_ENV, contract.EXIT_CODE_ENV):
        monkeypatch.delenv(var, raising=False)
    hc.init(timeout=5)
    yield
    hc.shutdown()


def _state() -> ObjectState:
    return ObjectState(step=0, weights=np.zeros(3))


def _trainer(at: dict[int, Callable[[], None]], steps: int = STEPS) -> Callable[[ObjectState], int]:
    """A training that adds step-dependent values, calling ``at[step]()`` before that step."""

    def train(state: ObjectState) -> int:
        while state.step < steps:
            state.step += 1
            at.get(state.step, lambda: None)()
            state.weights = state.weights * 0.5 + state.step
            state.commit()
        return state.commit_count

    return train


def _signal(sig: signal.Signals = signal.SIGUSR2) -> Callable[[], None]:
    return lambda: os.kill(os.getpid(), sig)


def _uninterrupted() -> np.ndarray:
    weights = np.zeros(3)
    for step in range(1, STEPS + 1):
        weights = weights * 0.5 + step
    return weights


def test_a_signal_stops_at_the_next_commit_with_that_state_on_disk_and_the_next_run_goes_on(
    tmp_path: Path,
) -> None:
    state = _state()
    with pytest.raises(PreemptionInterrupt, match="SIGUSR2") as stopped:
        ckpt.run(_trainer({5: _signal()}), state, tmp_path, exit_on_stop=False)
    assert stopped.value.commits == 5 and state.step == 5
    found, saved, shards = ckpt.load(tmp_path)
    assert (found.manifest.step, found.manifest.reason, found.manifest.world_size) == (5, "SIGUSR2", 1)
    assert saved["attributes"]["step"] == 5 and shards == {}
    assert stop_requested() == 0  # the request was acted on
    resumed = _state()
    seen: list[int] = []
    assert ckpt.run(lambda s: seen.append(s.step) or _trainer({})(s), resumed, tmp_path) == STEPS
    assert seen == [5]
    assert np.array_equal(resumed.weights, _uninterrupted())
    events = ckpt.CheckpointStore(tmp_path).history()
    assert [(e["event"], e.get("step", e.get("resumed_step"))) for e in events] == [
        ("start", None), ("checkpoint", 5), ("start", 5), ("checkpoint", STEPS)]  # fmt: skip


def test_a_second_signal_changes_nothing_and_one_during_a_write_stops_at_the_next_commit(
    tmp_path: Path,
) -> None:
    class SignalsWhileWritten:
        def state_dict(self) -> dict[str, Any]:
            os.kill(os.getpid(), signal.SIGTERM)  # lands while this rank's part is being written
            return {}

        def load_state_dict(self, saved: dict[str, Any]) -> None:
            pass

    twice = {3: lambda: (_signal()(), _signal(signal.SIGTERM)())}
    with pytest.raises(PreemptionInterrupt, match="SIGUSR2"):
        ckpt.run(_trainer(twice), _state(), tmp_path / "a", exit_on_stop=False)
    assert [d.name for _, d in ckpt.CheckpointStore(tmp_path / "a").complete()] == ["ckpt-000001-step-3"]

    with pytest.raises(PreemptionInterrupt, match="SIGTERM") as stopped:
        ckpt.run(_trainer({}), _state(), tmp_path / "b", shard=SignalsWhileWritten(), every=4,
                 exit_on_stop=False)  # fmt: skip
    assert stopped.value.commits == 5  # the periodic checkpoint of step 4 was completed first
    reasons = [
        (e["step"], e["reason"]) for e in ckpt.CheckpointStore(tmp_path / "b").history() if "step" in e
    ]
    assert reasons == [(4, "periodic"), (5, "SIGTERM")]


def test_a_stopped_job_exits_with_the_requeue_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit) as exited:
        ckpt.run(_trainer({2: _signal()}), _state(), tmp_path)
    assert exited.value.code == contract.DEFAULT_EXIT_CODE == 75
    monkeypatch.setenv(contract.EXIT_CODE_ENV, "3")
    monkeypatch.setenv(contract.PATH_ENV, str(tmp_path))
    with pytest.raises(SystemExit) as exited:
        ckpt.run(_trainer({4: ckpt.request_stop}), _state())
    assert exited.value.code == 3
    assert ckpt.load(tmp_path)[0].manifest.reason == "a stop request"
    monkeypatch.setenv(contract.EXIT_CODE_ENV, "300")
    with pytest.raises(CheckpointError, match="from 0 to 255"):
        ckpt.run(_trainer({}), _state())


def test_the_decorator_and_elastic_run_compose(tmp_path: Path) -> None:
    @ckpt.preemptible(tmp_path, exit_on_stop=False)
    def train(state: ObjectState, until: int) -> int:
        return _trainer({3: _signal()}, until)(state)

    with pytest.raises(PreemptionInterrupt):
        run_fn(train, reset=lambda: None)(_state(), 6)  # hvd.elastic.run lets the stop through
    assert train(_state(), 6) == 6


def test_a_checkpoint_of_another_training_is_refused_and_kept(tmp_path: Path) -> None:
    ckpt.run(_trainer({}, 2), _state(), tmp_path)
    other = ObjectState(epoch=0, weights=np.zeros(3))
    refused = (
        r"another training \(job unknown\): attributes: \['step', 'weights'\] in the checkpoint, \['epoch'"
    )
    with pytest.raises(CheckpointError, match=refused):
        ckpt.run(lambda s: 0, other, tmp_path)
    assert ckpt.load(tmp_path)[0].manifest.step == 2


def _rewrite_manifest(path: Path, **changes: Any) -> None:
    (directory,) = [d for d in path.iterdir() if d.name.startswith("ckpt-")]
    manifest = json.loads((directory / MANIFEST).read_text())
    (directory / MANIFEST).write_text(json.dumps({**manifest, **changes}))


def test_another_world_size_continues_data_parallel_state_unless_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt.run(_trainer({}, 2), _state(), tmp_path)
    _rewrite_manifest(tmp_path, world_size=4)
    with pytest.raises(CheckpointError, match="written by 4 ranks and this job has 1; run with 4 ranks"):
        ckpt.run(_trainer({}, 3), _state(), tmp_path, allow_resize=False)
    assert ckpt.run(_trainer({}, 3), _state(), tmp_path) == 3
    assert "continuing 4 ranks' checkpoint on 1 rank:" in capsys.readouterr().err

    ckpt.run(_trainer({}, 2), _state(), tmp_path / "sharded", shard=ckpt.RandomState())
    _rewrite_manifest(tmp_path / "sharded", world_size=2)
    with pytest.raises(CheckpointError, match="per-rank parts cannot be resharded: run with 2 ranks"):
        ckpt.run(_trainer({}, 3), _state(), tmp_path / "sharded", shard=ckpt.RandomState())
    with pytest.raises(CheckpointError, match=r"has per-rank parts \(shard=\) and this run passes no shard"):
        ckpt.run(_trainer({}, 3), _state(), tmp_path / "sharded")


def test_per_rank_random_generators_come_back(tmp_path: Path) -> None:
    import random

    draws: list[float] = []

    def train(state: ObjectState) -> int:
        while state.step < 6:
            state.step += 1
            draws.append(random.random() + float(np.random.rand()))
            if state.step == 3 and len(draws) == 3:
                os.kill(os.getpid(), signal.SIGUSR2)
            state.commit()
        return state.step

    random.seed(1)
    np.random.seed(1)
    with pytest.raises(PreemptionInterrupt):
        ckpt.run(train, _state(), tmp_path, shard=ckpt.RandomState(), exit_on_stop=False)
    random.seed(99)  # a new process would start anywhere
    np.random.seed(99)
    ckpt.run(train, _state(), tmp_path, shard=ckpt.RandomState())
    random.seed(1)
    np.random.seed(1)
    assert draws == [random.random() + float(np.random.rand()) for _ in range(6)]


def test_an_unpicklable_state_is_said_and_the_previous_checkpoint_kept(tmp_path: Path) -> None:
    state = ObjectState(step=0, weights=np.zeros(3), extra=None)

    def lock_up() -> None:
        state.extra = threading.Lock()  # not picklable

    with pytest.raises(CheckpointError, match=r"rank 0 on .* cannot pickle its state: TypeError: .*lock"):
        ckpt.run(_trainer({3: lock_up}), state, tmp_path, every=2)
    assert [d.name for d in tmp_path.iterdir() if d.name != "history.jsonl"] == ["ckpt-000001-step-2"]


def test_bad_settings_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no checkpoint path: pass path= .* or set HPCDL_CHECKPOINT"):
        ckpt.run(_trainer({}), _state())
    with pytest.raises(CheckpointError, match="'USR3' is not a signal name"):
        ckpt.run(_trainer({}), _state(), tmp_path, signals=["USR3"])
    with pytest.raises(CheckpointError, match="SIGKILL cannot be caught"):
        ckpt.run(_trainer({}), _state(), tmp_path, signals=["KILL"])
    with pytest.raises(CheckpointError, match="keep at least"):
        ckpt.run(_trainer({}), _state(), tmp_path, keep=0)
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="is not a directory"):
        ckpt.run(_trainer({}), _state(), tmp_path / "file")
    failed: list[BaseException] = []
    thread = threading.Thread(
        target=lambda: _catch(failed, lambda: ckpt.run(_trainer({}), _state(), tmp_path))
    )
    thread.start()
    thread.join()
    assert "must be called from the main thread" in str(failed[0])
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL  # handlers are put back


def _catch(into: list[BaseException], call: Callable[[], Any]) -> None:
    try:
        call()
    except BaseException as exc:
        into.append(exc)
