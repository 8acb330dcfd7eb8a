"""Runtime tunables: each ``hpcdl run`` flag / config-file key and the environment variable it sets.

The ranks' runtime reads these variables (``hpcdl.common``); the launcher only translates. A setting
given on the command line beats the same key in ``--config-file``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from hpcdl.common import config
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.horovodrun import NO_EFFECT

LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")
TRANSPORTS = ("auto", "shm", "tcp", "mpi")


def _flag(value: bool) -> str:
    return "1" if value else "0"


def _mb_to_bytes(value: float) -> str:
    return str(round(value * 1024 * 1024))


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


_RUNTIME_SETTINGS = {setting.name: setting for setting in config.SETTINGS}


@dataclass(frozen=True)
class Tunable:
    """One flag / config-file key (flag name with '_' for '-'), its value type, and the runtime setting
    (``hpcdl.common.config``, the one place that names the variables) it sets for the ranks."""

    key: str
    kind: type
    setting: str
    help: str
    to_env: Callable[[Any], str] = str
    choices: tuple[str, ...] = ()
    minimum: float | None = None

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def env(self) -> str:
        return _RUNTIME_SETTINGS[self.setting].env


TUNABLES: tuple[Tunable, ...] = (
    Tunable("fusion_threshold_mb", float, "fusion_threshold",
            "Fusion buffer size in MB (0 disables tensor fusion).", _mb_to_bytes, minimum=0),
    Tunable("cycle_time_ms", float, "cycle_time", "Engine cycle time in milliseconds.", _number, minimum=0),
    Tunable("cache_capacity", int, "cache_capacity", "Response cache entries (0 disables).", minimum=0),
    Tunable("hierarchical_allreduce", bool, "hierarchical_allreduce",
            "Intra-host then inter-host allreduce/allgather.", _flag),
    Tunable("timeline_filename", str, "timeline", "Write a Chrome-trace timeline (rank 0) to this file."),
    Tunable("timeline_mark_cycles", bool, "timeline_mark_cycles", "Mark engine cycles in the timeline.",
            _flag),
    Tunable("autotune", bool, "autotune", "Tune fusion threshold and cycle time while training.", _flag),
    Tunable("autotune_log_file", str, "autotune_log", "CSV log of the autotuner's samples."),
    Tunable("autotune_warmup_samples", int, "autotune_warmup_samples",
            "Samples the autotuner discards first.", minimum=0),
    Tunable("autotune_steps_per_sample", int, "autotune_steps_per_sample",
            "Engine steps per autotune sample.", minimum=1),
    Tunable("no_stall_check", bool, "stall_check_disable", "Disable the stall inspector.", _flag),
    Tunable("stall_check_warning_time_seconds", float, "stall_check_time_seconds",
            "Warn about ranks that have not submitted a tensor for this long.", _number, minimum=0),
    Tunable("stall_check_shutdown_time_seconds", float, "stall_shutdown_time_seconds",
            "Shut down after a stall this long (0: never).", _number, minimum=0),
    Tunable("flight_recorder_size", int, "flight_recorder_size",
            "Recent operations each rank's flight recorder keeps for its dumps (0 disables it).", minimum=0),
    Tunable("log_level", str, "log_level", "Runtime log level.", str.lower, choices=LOG_LEVELS),
    Tunable("timeout", float, "timeout", "Deadline in seconds of every blocking wait in the runtime.",
            _number, minimum=0),
    Tunable("transport", str, "transport", "Data plane between ranks.", str.lower, choices=TRANSPORTS),
    Tunable("mpi_library", str, "mpi",
            "MPI library the ranks load if they use MPI: auto (their launcher's), openmpi, mpich or a path."),
    Tunable("network_interface", str, "iface",
            "Network interface (or IPv4 address) for TCP traffic; also used to reach other hosts."),
    Tunable("small_message_bytes", int, "small_message_bytes",
            "Below this size use latency-optimal algorithms, at/above it the ring.", minimum=0),
    Tunable("shm_chunk_bytes", int, "shm_chunk_bytes", "Chunk size of shared-memory transfers.", minimum=1),
    Tunable("tcp_spin_us", int, "tcp_spin_us",
            "Microseconds a wait on TCP sockets polls them before it sleeps (0: sleep at once); polling "
            "stops by itself while it does not pay.", minimum=0),
    Tunable("tcp_send_buffer_bytes", int, "tcp_send_buffer_bytes",
            "Send buffer of each TCP data connection (default 192 KiB: a sender that runs far ahead of its "
            "receiver makes large transfers slower; raise it for long round trips; 0: 4 MiB).",
            minimum=0),
    Tunable("tcp_congestion", str, "tcp_congestion",
            "Congestion control of the job's TCP connections (default cubic: where the system chose BBR, its "
            "pacing slowed allreduces of 1-4 MiB across hosts about twice; 'system' keeps the system's)."),
    Tunable("shm_stores", str, "shm_stores",
            "How shared-memory chunks are written: cached, streaming (non-temporal) or auto (timed).",
            str.lower, choices=("auto", "cached", "streaming")),
    Tunable("gpu_operations", str, "gpu_operations",
            "Who moves CUDA tensors the engine negotiated: nccl, host (staged through the engine's data "
            "plane), gloo-standin (the NCCL path's code on any tensor, gloo in place of NCCL) or auto.",
            str.lower, choices=("auto", "nccl", "host", "gloo-standin")),
    Tunable("num_nccl_streams", int, "num_nccl_streams",
            "CUDA streams (each with its own NCCL communicators) the GPU path spreads batches over.",
            minimum=1),
    Tunable("disable_nvtx_ranges", bool, "disable_nvtx_ranges",
            "Do not mark the GPU path's batches with NVTX ranges (for Nsight).", _flag),
    Tunable("dynamic_process_sets", bool, "dynamic_process_sets",
            "Allow process sets to be added and removed after init.", _flag),
)  # fmt: skip
# Launcher-side settings that a config file may also hold: hpcdl's own, horovodrun's controller choice and
# hierarchical allgather (hpcdl's one hierarchical switch covers every collective), and horovodrun's settings
# that have no effect here.
LAUNCHER_KEYS: dict[str, type] = {
    "start_timeout": float,
    "controller": str,
    "hierarchical_allgather": bool,
    **{key: kind for key, (kind, _) in NO_EFFECT.items()},
}
CONTROLLERS = ("gloo", "mpi")

_BY_KEY = {t.key: t for t in TUNABLES}

# horovodrun's --config-file sections (runner/common/util/config_parser.py) -> hpcdl keys.
HOROVOD_SECTIONS: dict[str, dict[str, str]] = {
    "params": {
        "fusion_threshold_mb": "fusion_threshold_mb",
        "cycle_time_ms": "cycle_time_ms",
        "cache_capacity": "cache_capacity",
        "hierarchical_allreduce": "hierarchical_allreduce",
        "hierarchical_allgather": "hierarchical_allgather",
    },
    "autotune": {
        "enabled": "autotune",
        "log_file": "autotune_log_file",
        "warmup_samples": "autotune_warmup_samples",
        "steps_per_sample": "autotune_steps_per_sample",
        "bayes_opt_max_samples": "autotune_bayes_opt_max_samples",
        "gaussian_process_noise": "autotune_gaussian_process_noise",
    },
    "timeline": {"filename": "timeline_filename", "mark_cycles": "timeline_mark_cycles"},
    "stall_check": {
        "enabled": "no_stall_check",  # inverted below
        "warning_time_seconds": "stall_check_warning_time_seconds",
        "shutdown_time_seconds": "stall_check_shutdown_time_seconds",
    },
    "library_options": {
        "gloo_timeout_seconds": "timeout",
        "mpi_threads_disable": "mpi_threads_disable",
        "num_nccl_streams": "num_nccl_streams",
        "ccl_bgt_affinity": "ccl_bgt_affinity",
    },
    "logging": {"level": "log_level", "with_timestamp": "log_with_timestamp"},
}


def _valid_keys() -> list[str]:
    return sorted([*_BY_KEY, *LAUNCHER_KEYS])


def check_value(key: str, value: Any, where: str) -> Any:
    """Check one setting's type and range; return it normalised (ints accepted for floats)."""
    tunable = _BY_KEY.get(key)
    kind = tunable.kind if tunable else LAUNCHER_KEYS[key]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise LaunchError(f"{where}: '{key}' must be a {kind.__name__}, got {value!r}")
    choices = tunable.choices if tunable else (CONTROLLERS if key == "controller" else ())
    if choices and value.lower() not in choices:
        raise LaunchError(f"{where}: '{key}' must be one of {', '.join(choices)}, got {value!r}")
    minimum = tunable.minimum if tunable else 0
    if minimum is not None and kind in (int, float) and value < minimum:
        raise LaunchError(f"{where}: '{key}' must be at least {minimum:g}, got {value}")
    return value


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML mapping of settings (keys as the long flags, '-' or '_'); refuse unknown keys."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise LaunchError(f"cannot read config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise LaunchError(f"config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LaunchError(f"config file {path} must be a mapping of setting: value, e.g. 'cycle_time_ms: 5'")
    settings: dict[str, Any] = {}
    for raw_key, value in _flatten_horovod_sections(data, path).items():
        key = str(raw_key).replace("-", "_")
        if key not in _BY_KEY and key not in LAUNCHER_KEYS:
            raise LaunchError(
                f"config file {path}: unknown setting '{raw_key}'; valid settings: {', '.join(_valid_keys())}"
            )
        settings[key] = check_value(key, value, f"config file {path}")
    return settings


def _flatten_horovod_sections(data: dict[Any, Any], path: Path) -> dict[Any, Any]:
    """Turn horovodrun's sectioned layout (``params: {cycle_time_ms: 5}``) into flat keys."""
    flat: dict[Any, Any] = {}
    for key, value in data.items():
        section = HOROVOD_SECTIONS.get(str(key))
        if section is None or not isinstance(value, dict):  # a flat key ('autotune: true' is both)
            flat[key] = value
            continue
        for inner, inner_value in value.items():
            if inner not in section:
                raise LaunchError(
                    f"config file {path}: '{key}.{inner}' has no hpcdl equivalent; "
                    f"valid in '{key}': {', '.join(sorted(section))}"
                )
            target = section[inner]
            if target == "no_stall_check" and isinstance(inner_value, bool):
                inner_value = not inner_value
            flat[target] = inner_value
    return flat


def merge_hierarchical(settings: dict[str, Any], allgather: bool | None) -> None:
    """Fold horovodrun's hierarchical allgather (flag `allgather`, else the config file's) into hpcdl's one
    hierarchical switch, which covers allreduce, allgather and every other collective."""
    from_file = settings.pop("hierarchical_allgather", None)
    value = allgather if allgather is not None else from_file
    if value is None:
        return
    allreduce = settings.get("hierarchical_allreduce")
    if allreduce is not None and allreduce != value:
        raise LaunchError(
            "hierarchical allreduce and allgather are one switch in hpcdl (it covers every collective); "
            "give them the same value or only one of them"
        )
    settings["hierarchical_allreduce"] = value


def tunable_environment(settings: dict[str, Any]) -> dict[str, str]:
    """The environment variables for the ranks from resolved settings (launcher-only keys skipped)."""
    env: dict[str, str] = {}
    for key, value in settings.items():
        tunable = _BY_KEY.get(key)
        if tunable is None or value is None:
            continue
        env[tunable.env] = tunable.to_env(value)
        if key == "network_interface":
            env["NCCL_SOCKET_IFNAME"] = value
    return env
