"""The engine's Python face without a running job: clear errors, stable names and ids."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdl.common as hc
from hpcdl.common import engine
from hpcdl.common.exceptions import HpcdlError, HpcdlNotInitializedError


def test_enqueue_before_init_says_to_call_init() -> None:
    assert not hc.is_initialized()
    with pytest.raises(HpcdlNotInitializedError, match=r"call hpcdl.init\(\)"):
        engine.allreduce_async(np.ones(3, np.float32), name="x")
    with pytest.raises(HpcdlNotInitializedError):
        engine.start_timeline("/tmp/never.json")
    with pytest.raises(HpcdlError, match="unknown engine knob"):
        engine.engine_knob("fusion_threshold")


def test_numpy_helpers_reject_bad_arrays_before_submitting() -> None:
    with pytest.raises(HpcdlError, match=r"numpy\.ndarray"):
        engine.allreduce_async([1.0, 2.0])  # type: ignore[arg-type]
    a = np.ones(4, np.float32)
    with pytest.raises(HpcdlError, match="shape and dtype"):
        engine.allreduce_async(a, out=np.ones(3, np.float32))
    strided = np.ones((4, 4), np.float32)[:, 1]
    with pytest.raises(HpcdlError, match="C-contiguous"):  # reduced in place, it would need a copy
        engine.allreduce_async(strided, out=strided)
    with pytest.raises(HpcdlError, match="in place"):
        engine.broadcast_async(np.ones((4, 4), np.float32)[:, 1])
    with pytest.raises(HpcdlError, match="names"):
        engine.grouped_allreduce_async([a, a], names=["only.one"])


def test_group_ids_increase_per_process_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HPCDL_RANK", "HPCDL_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(HpcdlNotInitializedError):
        engine.new_group_id()
    hc.init(timeout=5)
    try:
        first = engine.new_group_id()
        assert engine.new_group_id() == first + 1
        assert engine.new_group_id(1) == 1  # each set counts on its own
        assert engine.new_group_id() == first + 2
    finally:
        hc.shutdown()
