"""Tunable flags, --config-file, -x and the rank environment of ``hpcdl run``."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import typer

from hpcdl.cli.main import app
from hpcdl.cli.run import run_command
from hpcdl.common import config
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.horovodrun import NO_EFFECT, no_effect_notes
from hpcdl.runner.hosts import RankSlot
from hpcdl.runner.launch import LaunchSpec, rank_settings_env, resolve_start_timeout
from hpcdl.runner.rank_env import Rendezvous, forwarded_environment, parse_extra_env, rank_variables
from hpcdl.runner.tunables import (
    TUNABLES,
    check_value,
    load_config_file,
    merge_hierarchical,
    tunable_environment,
)


def test_every_tunable_maps_to_a_documented_hpcdl_variable() -> None:
    documented = {
        "HPCDL_FUSION_THRESHOLD", "HPCDL_CYCLE_TIME", "HPCDL_CACHE_CAPACITY", "HPCDL_HIERARCHICAL_ALLREDUCE",
        "HPCDL_TIMELINE", "HPCDL_TIMELINE_MARK_CYCLES", "HPCDL_AUTOTUNE", "HPCDL_AUTOTUNE_LOG",
        "HPCDL_AUTOTUNE_WARMUP_SAMPLES", "HPCDL_AUTOTUNE_STEPS_PER_SAMPLE", "HPCDL_STALL_CHECK_DISABLE",
        "HPCDL_STALL_CHECK_TIME_SECONDS", "HPCDL_STALL_SHUTDOWN_TIME_SECONDS", "HPCDL_LOG_LEVEL",
        "HPCDL_TIMEOUT", "HPCDL_TRANSPORT", "HPCDL_IFACE", "HPCDL_SMALL_MESSAGE_BYTES",
        "HPCDL_DYNAMIC_PROCESS_SETS",
    }  # fmt: skip
    assert documented <= {t.env for t in TUNABLES}


def test_every_runtime_setting_has_a_flag() -> None:
    assert {t.env for t in TUNABLES} == {setting.env for setting in config.SETTINGS}


def test_tunable_values_become_environment() -> None:
    env = tunable_environment(
        {
            "fusion_threshold_mb": 32.0,
            "cycle_time_ms": 2.5,
            "cache_capacity": 0,
            "hierarchical_allreduce": True,
            "no_stall_check": False,
            "log_level": "DEBUG",
            "network_interface": "eth1",
            "start_timeout": 5.0,  # launcher side: no variable
        }
    )
    assert env == {
        "HPCDL_FUSION_THRESHOLD": str(32 * 1024 * 1024),
        "HPCDL_CYCLE_TIME": "2.5",
        "HPCDL_CACHE_CAPACITY": "0",
        "HPCDL_HIERARCHICAL_ALLREDUCE": "1",
        "HPCDL_STALL_CHECK_DISABLE": "0",
        "HPCDL_LOG_LEVEL": "debug",
        "HPCDL_IFACE": "eth1",
        "NCCL_SOCKET_IFNAME": "eth1",
    }


def test_fractional_fusion_threshold_rounds_to_bytes() -> None:
    assert tunable_environment({"fusion_threshold_mb": 0.5})["HPCDL_FUSION_THRESHOLD"] == "524288"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("cache_capacity", -1, "at least 0"),
        ("cache_capacity", 1.5, "must be a int"),
        ("log_level", "loud", "one of trace, debug"),
        ("transport", "ib", "one of auto, shm, tcp, mpi"),
        ("autotune", "yes", "must be a bool"),
    ],
)
def test_bad_values(key: str, value: object, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        check_value(key, value, "test")


def test_config_file(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("fusion-threshold-mb: 64\ncycle_time_ms: 3\nautotune: true\nstart_timeout: 12\n")
    assert load_config_file(config) == {
        "fusion_threshold_mb": 64.0,
        "cycle_time_ms": 3.0,
        "autotune": True,
        "start_timeout": 12.0,
    }


def test_config_file_unknown_key_lists_valid_ones(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("fusion_treshold_mb: 64\n")
    with pytest.raises(
        LaunchError, match=r"unknown setting 'fusion_treshold_mb'; valid settings: .*fusion_threshold_mb"
    ):
        load_config_file(config)


@pytest.mark.parametrize(
    ("content", "message"), [("- a\n- b\n", "must be a mapping"), ("a: [\n", "not valid YAML")]
)
def test_config_file_shape_errors(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(content)
    with pytest.raises(LaunchError, match=message):
        load_config_file(config)


def test_extra_env() -> None:
    assert parse_extra_env(["A=1", "B", "C=x=y"], {"B": "from-here"}) == {
        "A": "1",
        "B": "from-here",
        "C": "x=y",
    }
    with pytest.raises(LaunchError, match="-x UNSET: UNSET is not set here"):
        parse_extra_env(["UNSET"], {})
    with pytest.raises(LaunchError, match="not an environment variable name"):
        parse_extra_env(["1BAD=2"], {})


def test_rank_variables_hpcdl_and_horovod() -> None:
    slot = RankSlot(rank=3, size=4, host="node2", local_rank=1, local_size=2, cross_rank=1, cross_size=2)
    env = rank_variables(slot, Rendezvous("10.0.0.1", 4242, "ab" * 32))
    for prefix in ("HPCDL_", "HOROVOD_"):
        assert env[prefix + "RANK"] == "3"
        assert env[prefix + "SIZE"] == "4"
        assert env[prefix + "LOCAL_RANK"] == "1"
        assert env[prefix + "LOCAL_SIZE"] == "2"
        assert env[prefix + "CROSS_RANK"] == "1"
        assert env[prefix + "CROSS_SIZE"] == "2"
        assert env[prefix + "HOSTNAME"] == "node2"
    assert env["HPCDL_RENDEZVOUS_ADDR"] == "10.0.0.1"
    assert env["HPCDL_RENDEZVOUS_PORT"] == "4242"
    assert env["HPCDL_SECRET"] == "ab" * 32


def test_forwarded_environment_for_ssh() -> None:
    environ = {
        "PATH": "/p",
        "PYTHONPATH": "/pp",
        "LD_LIBRARY_PATH": "/l",
        "VIRTUAL_ENV": "/v",
        "HPCDL_X": "1",
        "HOROVOD_Y": "2",
        "NCCL_DEBUG": "INFO",
        "HOME": "/root",
        "SSH_AUTH_SOCK": "/tmp/agent",
    }
    assert set(forwarded_environment(environ)) == {
        "PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "HPCDL_X", "HOROVOD_Y", "NCCL_DEBUG",
    }  # fmt: skip


def test_tcp_flag_sets_transport_and_conflicts_are_refused() -> None:
    env = rank_settings_env(LaunchSpec(["x"], tcp=True))
    assert env["HPCDL_TRANSPORT"] == "tcp" and env["NCCL_IB_DISABLE"] == "1"  # as horovodrun --tcp
    with pytest.raises(LaunchError, match="--tcp contradicts --transport shm"):
        rank_settings_env(LaunchSpec(["x"], tcp=True, settings={"transport": "shm"}))


def test_start_timeout_resolution() -> None:
    assert resolve_start_timeout(None, {}) == 30.0
    assert resolve_start_timeout(None, {"HOROVOD_START_TIMEOUT": "7"}) == 7.0
    assert resolve_start_timeout(None, {"HPCDL_START_TIMEOUT": "5", "HOROVOD_START_TIMEOUT": "7"}) == 5.0
    assert resolve_start_timeout(2.0, {"HPCDL_START_TIMEOUT": "5"}) == 2.0
    with pytest.raises(LaunchError, match="HPCDL_START_TIMEOUT='soon' is not a number"):
        resolve_start_timeout(None, {"HPCDL_START_TIMEOUT": "soon"})
    with pytest.raises(LaunchError, match="must be a positive number"):
        resolve_start_timeout(0.0, {})


def test_horovod_sectioned_config_file(tmp_path: Path) -> None:
    config = tmp_path / "horovod.yaml"
    config.write_text(
        "params:\n  fusion_threshold_mb: 32\n  cycle_time_ms: 10\n  cache_capacity: 2048\n"
        "autotune:\n  enabled: true\n  log_file: at.csv\n"
        "timeline:\n  filename: tl.json\n  mark_cycles: false\n"
        "stall_check:\n  enabled: false\n  warning_time_seconds: 120\n"
        "logging:\n  level: info\n"
    )
    assert load_config_file(config) == {
        "fusion_threshold_mb": 32.0,
        "cycle_time_ms": 10.0,
        "cache_capacity": 2048,
        "autotune": True,
        "autotune_log_file": "at.csv",
        "timeline_filename": "tl.json",
        "timeline_mark_cycles": False,
        "no_stall_check": True,
        "stall_check_warning_time_seconds": 120.0,
        "log_level": "info",
    }


def test_horovod_setting_without_equivalent(tmp_path: Path) -> None:
    config = tmp_path / "horovod.yaml"
    config.write_text("params:\n  torus_allreduce: true\n")
    with pytest.raises(LaunchError, match=r"'params.torus_allreduce' has no hpcdl equivalent; valid in"):
        load_config_file(config)


def test_every_tunable_is_a_flag_of_hpcdl_run() -> None:
    flags = set(inspect.signature(run_command).parameters)
    assert {t.key for t in TUNABLES} - {"network_interface"} <= flags
    assert "network_interfaces" in flags  # --network-interface(s): one or several, each host takes the first


# Every flag of horovodrun 0.28's parser (horovod/runner/launch.py), with its aliases and negations;
# --slots is argparse's abbreviation of --slots-per-host that Horovod's elastic docs use.
HOROVODRUN_FLAGS = (
    "-v", "--version", "-np", "--num-proc", "-cb", "--check-build", "--disable-cache", "--start-timeout",
    "--network-interfaces", "--network-interface", "--output-filename", "--verbose", "--config-file", "-p",
    "--ssh-port", "-i", "--ssh-identity-file", "--fusion-threshold-mb", "--cycle-time-ms",
    "--cache-capacity", "--hierarchical-allreduce", "--no-hierarchical-allreduce",
    "--hierarchical-allgather", "--no-hierarchical-allgather", "--autotune", "--no-autotune",
    "--autotune-log-file", "--autotune-warmup-samples", "--autotune-steps-per-sample",
    "--autotune-bayes-opt-max-samples", "--autotune-gaussian-process-noise", "--min-np", "--min-num-proc",
    "--max-np", "--max-num-proc", "--slots-per-host", "--slots", "--elastic-timeout", "--reset-limit",
    "--blacklist-cooldown-range", "--timeline-filename", "--timeline-mark-cycles",
    "--no-timeline-mark-cycles", "--no-stall-check", "--stall-check", "--stall-check-warning-time-seconds",
    "--stall-check-shutdown-time-seconds", "--mpi-threads-disable", "--no-mpi-threads-disable",
    "--mpi-args", "--tcp", "--binding-args", "--num-nccl-streams", "--thread-affinity",
    "--gloo-timeout-seconds", "--log-level", "--log-with-timestamp", "--log-without-timestamp",
    "-prefix-timestamp", "--prefix-output-with-timestamp", "--log-hide-timestamp",
    "--no-log-hide-timestamp", "-H", "--hosts", "-hostfile", "--hostfile", "--host-discovery-script",
    "--gloo", "--mpi", "--jsrun",
)  # fmt: skip


def _run_option_names() -> set[str]:
    command = typer.main.get_command(app).commands["run"]
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)}


def test_every_horovodrun_flag_is_accepted() -> None:
    missing = sorted(set(HOROVODRUN_FLAGS) - _run_option_names())
    assert not missing, f"hpcdl run lacks horovodrun's {missing}"


def test_horovodrun_flags_without_effect_say_why() -> None:
    notes = no_effect_notes(["thread_affinity", "log_with_timestamp"])
    assert notes == [
        "--thread-affinity has no effect here: hpcdl's engine thread moves to the core of the thread that "
        "submits work by itself",
        "--log-with[out]-timestamp (--[no-]log-hide-timestamp) has no effect here: hpcdl's runtime messages "
        "carry no timestamp; --prefix-output-with-timestamp stamps every line",
    ]
    for key, (_, reason) in NO_EFFECT.items():
        assert reason and key.replace("_", "-") in " ".join(HOROVODRUN_FLAGS) + " ccl-bgt-affinity"


def test_horovod_config_file_keys_without_effect_and_the_controller(tmp_path: Path) -> None:
    config = tmp_path / "horovod.yaml"
    config.write_text(
        "controller: mpi\n"
        "params:\n  hierarchical_allgather: false\n"
        "autotune:\n  enabled: true\n  bayes_opt_max_samples: 40\n  gaussian_process_noise: 0.75\n"
        "library_options:\n  mpi_threads_disable: true\n  num_nccl_streams: 2\n  ccl_bgt_affinity: 1\n"
        "logging:\n  with_timestamp: false\n"
    )
    assert load_config_file(config) == {
        "controller": "mpi",
        "hierarchical_allgather": False,
        "autotune": True,
        "autotune_bayes_opt_max_samples": 40,
        "autotune_gaussian_process_noise": 0.75,
        "mpi_threads_disable": True,
        "num_nccl_streams": 2,
        "ccl_bgt_affinity": 1,
        "log_with_timestamp": False,
    }
    config.write_text("controller: ucx\n")
    with pytest.raises(LaunchError, match="'controller' must be one of gloo, mpi, got 'ucx'"):
        load_config_file(config)


def test_hierarchical_allgather_is_hpcdls_one_hierarchical_switch() -> None:
    settings: dict[str, object] = {"hierarchical_allgather": True}
    merge_hierarchical(settings, None)
    assert settings == {"hierarchical_allreduce": True}
    settings = {"hierarchical_allreduce": False}
    merge_hierarchical(settings, False)
    assert settings == {"hierarchical_allreduce": False}
    with pytest.raises(LaunchError, match="one switch in hpcdl"):
        merge_hierarchical({"hierarchical_allreduce": True}, False)
