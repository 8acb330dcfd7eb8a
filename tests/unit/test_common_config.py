"""Settings resolution: explicit argument > HPCDL_* > HOROVOD_* > default, with clear errors."""

from __future__ import annotations

import pytest

from hpcdl.common import config
from hpcdl.common.exceptions import HpcdlConfigError


def test_precedence_explicit_then_hpcdl_then_horovod_then_default() -> None:
    env = {"HPCDL_TIMEOUT": "7", "HOROVOD_GLOO_TIMEOUT_SECONDS": "9", "HOROVOD_FUSION_THRESHOLD": "1024"}
    resolved = config.resolve({"cycle_time": 2.5}, env)
    assert resolved.get("timeout_s") == 7.0  # HPCDL_ beats HOROVOD_
    assert resolved.get("fusion_threshold") == 1024  # HOROVOD_ alias beats the default
    assert resolved.get("cycle_time_ms") == 2.5  # explicit
    assert resolved.get("transport") == "auto"  # default
    assert config.resolve({"timeout": 3}, env).get("timeout_s") == 3.0  # explicit beats HPCDL_
    assert resolved.user_set == {"timeout_s", "fusion_threshold", "cycle_time_ms"}


def test_stall_check_disable_is_inverted_into_stall_check() -> None:
    assert config.resolve({}, {}).get("stall_check") is True
    assert config.resolve({}, {"HOROVOD_STALL_CHECK_DISABLE": "1"}).get("stall_check") is False
    assert config.resolve({"stall_check_disable": True}, {}).get("stall_check") is False


def test_bad_values_name_the_variable() -> None:
    with pytest.raises(HpcdlConfigError, match="HPCDL_TIMEOUT='soon'"):
        config.resolve({}, {"HPCDL_TIMEOUT": "soon"})
    with pytest.raises(HpcdlConfigError, match="one of auto, shm, tcp, mpi"):
        config.resolve({"transport": "infiniband"}, {})
    with pytest.raises(HpcdlConfigError, match=r"HPCDL_SHM_STORES.*one of auto, cached, streaming"):
        config.resolve({}, {"HPCDL_SHM_STORES": "non-temporal"})
    with pytest.raises(HpcdlConfigError, match="unknown setting"):
        config.resolve({"timeout_seconds": 3}, {})
    with pytest.raises(HpcdlConfigError, match="positive"):
        config.resolve({"timeout": 0}, {})
    with pytest.raises(HpcdlConfigError, match=r"HPCDL_TCP_SPIN_US='-5'.*non-negative"):
        config.resolve({}, {"HPCDL_TCP_SPIN_US": "-5"})
    assert config.resolve({}, {}).get("tcp_spin_us") is None  # unset: the runtime chooses


def test_options_text_and_user_set_knobs() -> None:
    resolved = config.resolve({"fusion_threshold": 0}, {"HPCDL_SMALL_MESSAGE_BYTES": "128"})
    text = config.options_text({"rank": 0, "hierarchical": True, "timeout_s": 1.5})
    assert text == "rank=0\nhierarchical=1\ntimeout_s=1.5\n"
    assert config.user_set_knobs(resolved) == "small_message_bytes,fusion_threshold"
    with pytest.raises(HpcdlConfigError, match="line break"):
        config.options_text({"timeline": "a\nrank=3"})


def test_hierarchical_allreduce_is_the_runtimes_choice_unless_set() -> None:
    """Unset, no option reaches the runtime (it chooses per process set); set, it forces either path."""
    assert config.resolve({}, {}).get("hierarchical") is None
    assert "hierarchical" not in config.options_text(config.resolve({}, {}).values)
    assert config.resolve({}, {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}).get("hierarchical") is True
    forced = config.resolve({"hierarchical_allreduce": False}, {"HPCDL_HIERARCHICAL_ALLREDUCE": "1"})
    assert "hierarchical=0\n" in config.options_text(forced.values)
