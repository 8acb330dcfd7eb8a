"""The environment each rank starts with (the contract in hpcdl.common's rank discovery)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpcdl import jobenv
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import RankSlot

# What ssh carries to a remote rank besides the rank's own variables.
FORWARDED_NAMES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "GLOO_SOCKET_IFNAME")
FORWARDED_PREFIXES = ("HPCDL_", "HOROVOD_", "NCCL_")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Rendezvous:
    """Where the job's rendezvous server listens and the secret ranks prove they hold."""

    addr: str
    port: int
    secret: str


def parse_extra_env(items: list[str], environ: Mapping[str, str]) -> dict[str, str]:
    """``-x NAME=VALUE`` sets a value; ``-x NAME`` passes this shell's value (an error if unset)."""
    extra: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not _NAME_RE.match(name):
            raise LaunchError(f"-x '{item}': '{name}' is not an environment variable name")
        if not sep:
            if name not in environ:
                raise LaunchError(f"-x {name}: {name} is not set here; export it or write -x {name}=VALUE")
            value = environ[name]
        extra[name] = value
    return extra


def rank_variables(slot: RankSlot, rendezvous: Rendezvous | None) -> dict[str, str]:
    """HPCDL_* (and Horovod's HOROVOD_*) identity of one rank."""
    values = {
        "RANK": slot.rank,
        "SIZE": slot.size,
        "LOCAL_RANK": slot.local_rank,
        "LOCAL_SIZE": slot.local_size,
        "CROSS_RANK": slot.cross_rank,
        "CROSS_SIZE": slot.cross_size,
        "HOSTNAME": slot.host,
    }
    env = {}
    for prefix in ("HPCDL_", "HOROVOD_"):
        env.update({prefix + name: str(value) for name, value in values.items()})
    if rendezvous is not None:
        env.update(jobenv.rendezvous_env(rendezvous.addr, rendezvous.port, rendezvous.secret))
    return env


def forwarded_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the launcher's environment a remote rank gets (before -x and rank variables)."""
    return {
        name: value
        for name, value in environ.items()
        if name in FORWARDED_NAMES or name.startswith(FORWARDED_PREFIXES)
    }


# torch.distributed's env:// variables, as torchrun sets them. The job-level ones a user set (in the
# launcher's environment or with -x) are kept; the per-rank ones only when given with -x (an inherited RANK
# cannot be right for every rank).
TORCH_JOB_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")
TORCH_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def torch_variables(slot: RankSlot) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE of one rank."""
    return {
        "RANK": str(slot.rank),
        "WORLD_SIZE": str(slot.size),
        "LOCAL_RANK": str(slot.local_rank),
        "LOCAL_WORLD_SIZE": str(slot.local_size),
    }
