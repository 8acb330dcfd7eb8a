"""Runtime settings: the one place where they are resolved.

Order: explicit argument (``init(timeout=5)``) > ``HPCDL_*`` > ``HOROVOD_*`` > default. The result is the
``key=value`` text that ``hpcdl_init`` takes (keys listed in c_api.h); the runtime reads no environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from hpcdl import jobenv
from hpcdl.common.exceptions import HpcdlConfigError

_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}


@dataclass(frozen=True)
class Setting:
    name: str  # keyword argument of init()
    key: str  # option key of hpcdl_init
    env: str  # HPCDL_* variable
    horovod: Optional[str]  # HOROVOD_* alias, if Horovod has one
    default: Any
    kind: type  # int, float, bool or str
    invert: bool = False  # HPCDL_STALL_CHECK_DISABLE=1 means stall_check=0
    tunable: bool = False  # the engine may change it (autotuner, cache growth) unless the user set it


SETTINGS: tuple[Setting, ...] = (
    Setting("timeout", "timeout_s", "HPCDL_TIMEOUT", "HOROVOD_GLOO_TIMEOUT_SECONDS", 60.0, float),
    Setting("transport", "transport", "HPCDL_TRANSPORT", None, "auto", str),
    # Which MPI library (see mpi_library): auto (the launcher's), openmpi, mpich, or a libmpi path.
    Setting("mpi", "mpi", "HPCDL_MPI", None, "auto", str),
    Setting("iface", "iface", jobenv.IFACE, "HOROVOD_GLOO_IFACE", "", str),
    Setting(
        "small_message_bytes",
        "small_message_bytes",
        "HPCDL_SMALL_MESSAGE_BYTES",
        None,
        65536,
        int,
        tunable=True,
    ),
    # Unset (None): the runtime's choice, a quarter of the L2 cache within 256 KiB-2 MiB.
    Setting("shm_chunk_bytes", "shm_chunk_bytes", "HPCDL_SHM_CHUNK_BYTES", None, None, int),
    Setting("shm_stores", "shm_stores", "HPCDL_SHM_STORES", None, "auto", str),
    # Microseconds a wait on TCP sockets polls them before it sleeps, while polling pays; 0: never.
    # Unset (None): the runtime's choice, 30 where the host has more cores than local ranks, else 0.
    Setting("tcp_spin_us", "tcp_spin_us", "HPCDL_TCP_SPIN_US", None, None, int),
    # Bytes a TCP data connection may hold unsent; unset (None): the runtime's 192 KiB; 0: 4 MiB.
    Setting("tcp_send_buffer_bytes", "tcp_send_buffer_bytes", "HPCDL_TCP_SEND_BUFFER_BYTES", None, None, int),
    # Congestion control of the job's TCP connections (TCP_CONGESTION); unset (None): the runtime's cubic;
    # "system" keeps the system's default.
    Setting("tcp_congestion", "tcp_congestion", "HPCDL_TCP_CONGESTION", None, None, str),
    Setting(
        "hierarchical_allreduce",
        "hierarchical",
        "HPCDL_HIERARCHICAL_ALLREDUCE",
        "HOROVOD_HIERARCHICAL_ALLREDUCE",
        # Only matters when ranks span hosts. Unset (None): the runtime chooses per process set, shared
        # memory within hosts then TCP between them when a host has several members; True/False force it.
        None,
        bool,
    ),
    Setting(
        "fusion_threshold",
        "fusion_threshold",
        "HPCDL_FUSION_THRESHOLD",
        "HOROVOD_FUSION_THRESHOLD",
        128 << 20,
        int,
        tunable=True,
    ),
    Setting(
        "cycle_time", "cycle_time_ms", "HPCDL_CYCLE_TIME", "HOROVOD_CYCLE_TIME", 1.0, float, tunable=True
    ),
    Setting(
        "cache_capacity",
        "cache_capacity",
        "HPCDL_CACHE_CAPACITY",
        "HOROVOD_CACHE_CAPACITY",
        1024,
        int,
        tunable=True,
    ),
    Setting("timeline", "timeline", "HPCDL_TIMELINE", "HOROVOD_TIMELINE", "", str),
    Setting(
        "timeline_mark_cycles",
        "timeline_mark_cycles",
        "HPCDL_TIMELINE_MARK_CYCLES",
        "HOROVOD_TIMELINE_MARK_CYCLES",
        False,
        bool,
    ),
    Setting("autotune", "autotune", "HPCDL_AUTOTUNE", "HOROVOD_AUTOTUNE", False, bool),
    Setting("autotune_log", "autotune_log", "HPCDL_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_LOG", "", str),
    Setting(
        "autotune_warmup_samples",
        "autotune_warmup_samples",
        "HPCDL_AUTOTUNE_WARMUP_SAMPLES",
        "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
        3,
        int,
    ),
    Setting(
        "autotune_steps_per_sample",
        "autotune_steps_per_sample",
        "HPCDL_AUTOTUNE_STEPS_PER_SAMPLE",
        "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
        10,
        int,
    ),
    Setting(
        "stall_check_disable",
        "stall_check",
        "HPCDL_STALL_CHECK_DISABLE",
        "HOROVOD_STALL_CHECK_DISABLE",
        False,
        bool,
        invert=True,
    ),
    Setting(
        "stall_check_time_seconds",
        "stall_check_s",
        "HPCDL_STALL_CHECK_TIME_SECONDS",
        "HOROVOD_STALL_CHECK_TIME_SECONDS",
        60.0,
        float,
    ),
    Setting(
        "stall_shutdown_time_seconds",
        "stall_shutdown_s",
        "HPCDL_STALL_SHUTDOWN_TIME_SECONDS",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
        0.0,
        float,
    ),
    Setting("log_level", "log_level", "HPCDL_LOG_LEVEL", "HOROVOD_LOG_LEVEL", "warning", str),
    # Read by hpcdl.torch, not the runtime: who moves CUDA tensors once the engine decided (auto: NCCL when
    # PyTorch has it and a GPU is visible, else host: staged through host memory into the engine's data
    # plane; gloo-standin: every tensor takes the NCCL path's code with gloo in place of NCCL), over how
    # many streams (each with its own communicators), and whether NVTX ranges mark the batches.
    Setting("gpu_operations", "gpu_operations", "HPCDL_GPU_OPERATIONS", None, "auto", str),
    Setting(
        "num_nccl_streams", "num_nccl_streams", "HPCDL_NUM_NCCL_STREAMS", "HOROVOD_NUM_NCCL_STREAMS", 1, int
    ),
    Setting(
        "disable_nvtx_ranges",
        "disable_nvtx_ranges",
        "HPCDL_DISABLE_NVTX_RANGES",
        "HOROVOD_DISABLE_NVTX_RANGES",
        False,
        bool,
    ),
    # Submissions each rank's flight recorder keeps for its dumps in the job's debug directory (0: none).
    Setting("flight_recorder_size", "flight_recorder_size", "HPCDL_FLIGHT_RECORDER_SIZE", None, 2048, int),
    Setting(
        "dynamic_process_sets",
        "dynamic_process_sets",
        "HPCDL_DYNAMIC_PROCESS_SETS",
        "HOROVOD_DYNAMIC_PROCESS_SETS",
        False,
        bool,
    ),
)

_BY_NAME: dict[str, Setting] = {**{s.key: s for s in SETTINGS}, **{s.name: s for s in SETTINGS}}

_CHOICES = {
    "transport": ("auto", "shm", "tcp", "mpi"),
    "shm_stores": ("auto", "cached", "streaming"),
    "log_level": ("trace", "debug", "info", "warning", "error", "fatal"),
    "gpu_operations": ("auto", "nccl", "host", "gloo-standin"),
}


def _parse(setting: Setting, raw: Any, source: str) -> Any:
    """Convert a value from `source` (an env name or "argument") to the setting's kind, or explain why not."""
    try:
        if setting.kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError
        if setting.kind is int:
            if isinstance(raw, bool):
                raise ValueError
            value = int(str(raw).strip(), 0) if isinstance(raw, str) else int(raw)
            if value < 0:
                raise ValueError
            return value
        if setting.kind is float:
            value = float(raw)
            if value < 0:
                raise ValueError
            return value
        value = str(raw)
    except (TypeError, ValueError):
        kind = {bool: "0 or 1", int: "a non-negative integer", float: "a non-negative number"}[setting.kind]
        raise HpcdlConfigError(f"{source}={raw!r} is not valid: {setting.name} must be {kind}") from None
    choices = _CHOICES.get(setting.key)
    if choices and value.lower() not in choices:
        raise HpcdlConfigError(
            f"{source}={raw!r} is not valid: {setting.name} is one of {', '.join(choices)}"
        )
    return value.lower() if choices else value


@dataclass(frozen=True)
class Resolved:
    """Resolved settings: values by option key, and which keys the user set (explicitly or by env)."""

    values: dict[str, Any]
    user_set: frozenset[str]

    def get(self, key: str) -> Any:
        return self.values[key]


def resolve(explicit: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> Resolved:
    """Resolve every setting: explicit argument > HPCDL_* > HOROVOD_* > default."""
    env = os.environ if env is None else env
    explicit = dict(explicit or {})
    unknown = sorted(k for k in explicit if k not in _BY_NAME)
    if unknown:
        known = ", ".join(sorted(s.name for s in SETTINGS))
        raise HpcdlConfigError(f"unknown setting(s) {', '.join(unknown)}; known settings: {known}")
    by_key = {_BY_NAME[k].key: (k, v) for k, v in explicit.items() if v is not None}
    values: dict[str, Any] = {}
    user_set: set[str] = set()
    for setting in SETTINGS:
        if setting.key in by_key:
            name, raw = by_key[setting.key]
            value = _parse(setting, raw, name)
            if setting.invert and name == setting.name:
                value = not value
            user_set.add(setting.key)
            values[setting.key] = value
            continue
        for var in (setting.env, setting.horovod):
            if var and env.get(var, "") != "":
                value = _parse(setting, env[var], var)
                if setting.invert:
                    value = not value
                values[setting.key] = value
                user_set.add(setting.key)
                break
        else:
            values[setting.key] = (not setting.default) if setting.invert else setting.default
    if values["num_nccl_streams"] < 1:
        raise HpcdlConfigError("num_nccl_streams must be at least 1 (HPCDL_NUM_NCCL_STREAMS)")
    if values["timeout_s"] <= 0:
        raise HpcdlConfigError("timeout must be a positive number of seconds (HPCDL_TIMEOUT)")
    return Resolved(values, frozenset(user_set))


def options_text(options: Mapping[str, Any]) -> str:
    """The ``key=value`` lines of hpcdl_init; rejects values that would break the format."""
    lines = []
    for key, value in options.items():
        if value is None:  # unset: the runtime's own choice
            continue
        text = ("1" if value else "0") if isinstance(value, bool) else str(value)
        if "\n" in text or "\r" in text:
            raise HpcdlConfigError(f"setting {key} may not contain a line break")
        lines.append(f"{key}={text}")
    return "\n".join(lines) + "\n"


def user_set_knobs(resolved: Resolved) -> str:
    """Comma list of tunable knobs the user set, which the engine must leave alone."""
    return ",".join(s.key for s in SETTINGS if s.tunable and s.key in resolved.user_set)
