"""What hpcdl.torch and hpcdl.tensorflow share through hpcdl.common (process sets, reduction ops, elastic
state, ``init(comm, process_sets)``): one definition each, the same behaviour in both APIs, and the
elastic protocol on a job of one process."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import numpy as np
import pytest

import hpcdl.common as hc
from hpcdl.common import elastic_state, exceptions, process_sets, reduce_ops
from hpcdl.common.elastic_state import ObjectState, run_fn

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'hpcdl[torch]'")
tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed: pip install 'hpcdl[tensorflow]'")

import hpcdl.tensorflow as hvd_tf  # noqa: E402
import hpcdl.torch as hvd_torch  # noqa: E402

APIS = [pytest.param(hvd_torch, id="torch"), pytest.param(hvd_tf, id="tensorflow")]
SHARED = {
    "ProcessSet": process_sets,
    "global_process_set": process_sets,
    "add_process_set": process_sets,
    "remove_process_set": process_sets,
    "Average": reduce_ops,
    "Sum": reduce_ops,
    "Min": reduce_ops,
    "Max": reduce_ops,
    "Product": reduce_ops,
    "Adasum": reduce_ops,
    "HostsUpdatedInterrupt": exceptions,
}


@pytest.fixture
def one_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A job of this process alone (no launcher variables); shut down afterwards, whatever happened."""
    for var in ("HPCDL_RANK", "HPCDL_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(var, raising=False)
    yield
    hc.shutdown()


def test_both_apis_hand_out_the_very_same_objects() -> None:
    for name, home in SHARED.items():
        assert getattr(hvd_torch, name) is getattr(home, name) is getattr(hvd_tf, name), name
    for name in ("State", "ObjectState", "HostsUpdatedInterrupt"):
        shared = getattr(elastic_state, name)
        assert getattr(hvd_torch.elastic, name) is shared is getattr(hvd_tf.elastic, name), name
    assert issubclass(hvd_torch.elastic.TorchState, elastic_state.ObjectState)
    assert issubclass(hvd_tf.elastic.TensorFlowState, elastic_state.ObjectState)
    assert issubclass(hvd_tf.HostsUpdatedInterrupt, RuntimeError)


@pytest.mark.parametrize("hvd", APIS)
def test_init_refuses_a_bad_comm_or_process_sets_alike(one_process: None, hvd: ModuleType) -> None:
    cases = [
        ({"comm": 3}, "Invalid type of argument comm"),
        ({"comm": [0.0]}, "Invalid type of argument comm"),  # a rank is an integer, not rounded to one
        ({"process_sets": "static"}, 'or "dynamic"'),
        ({"process_sets": [[0]]}, "must contain hpcdl ProcessSet objects"),
    ]
    for arguments, message in cases:
        with pytest.raises(hc.HpcdlConfigError, match=message):
            hvd.init(**arguments)
        assert not hvd.is_initialized(), arguments


@pytest.mark.parametrize("hvd", APIS)
def test_init_with_a_comm_list_and_plain_object_state(one_process: None, hvd: ModuleType) -> None:
    hvd.init(comm=[0], process_sets="dynamic")
    assert (hvd.rank(), hvd.size()) == (0, 1)
    assert hvd.global_process_set.ranks == [0] and hvd.global_process_set.included()
    state = hvd.elastic.ObjectState(epoch=3)  # Horovod's bcast_object and get_rank are optional
    state.epoch = 4
    state.restore()
    state.sync()
    assert state.epoch == 3
    hvd.shutdown()
    assert not hvd.is_initialized()


def test_process_set_queries_before_init_say_not_initialised(one_process: None) -> None:
    assert not hc.is_initialized()
    for query in (hc.process_set_size, hc.process_set_rank, hc.process_set_ranks):
        with pytest.raises(hc.HpcdlNotInitializedError, match=r"call hpcdl.init\(\)"):
            query(0)
    with pytest.raises(hc.HpcdlNotInitializedError):
        hvd_torch.global_process_set.size()
    hc.init(timeout=5)
    with pytest.raises(hc.HpcdlConfigError, match="no process set with id 7"):
        hc.process_set_size(7)
    assert hc.process_set_rank(0) == 0


def _plain_state(**attributes: object) -> ObjectState:
    return ObjectState(bcast_object=lambda obj: obj, get_rank=hc.rank, **attributes)


def test_commit_raises_hosts_updated_on_every_rank_once_notified(one_process: None) -> None:
    hc.init(timeout=5)
    state = _plain_state(epoch=0)
    state.commit()  # nothing changed
    state.notify_hosts_updated()
    with pytest.raises(hc.HostsUpdatedInterrupt) as raised:
        state.commit()
    assert raised.value.skip_sync is False
    state.commit()  # the notice was consumed


def test_run_restores_after_a_failed_collective_and_keeps_state_after_a_host_change(
    one_process: None,
) -> None:
    hc.init(timeout=5)
    state = _plain_state(epoch=0, seen=np.zeros(1))
    attempts: list[int] = []
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(state.epoch)])

    def train(state: ObjectState) -> int:
        attempts.append(state.epoch)
        while state.epoch < 4:
            state.epoch += 1
            if state.epoch == 2 and len(attempts) == 1:
                raise hc.HpcdlInternalError("a peer was lost")  # epoch 2 is lost, epoch 1 was committed
            if state.epoch == 3 and len(attempts) == 2:
                raise hc.HostsUpdatedInterrupt(skip_sync=True)  # kept as it is: 3, not committed
            state.commit()
        return state.epoch

    assert run_fn(train, reset=lambda: None)(state) == 4
    assert attempts == [0, 1, 3] and resets == [1, 3]
