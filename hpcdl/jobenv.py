"""The job contract: the names of the variables through which ``hpcdl run``, the scripts of ``hpcdl
submit`` and the rank agent tell a rank who it is and where the job meets, and the functions that build
and read the rendezvous part of it.

Standard library only, with no import of hpcdl: the rank agent may run it from its source on a host that
has only Python (as it does ``hpcdl.common.handshake``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

RANK = "HPCDL_RANK"
SIZE = "HPCDL_SIZE"
LOCAL_RANK = "HPCDL_LOCAL_RANK"
LOCAL_SIZE = "HPCDL_LOCAL_SIZE"
HOSTNAME = "HPCDL_HOSTNAME"  # the host identity: ranks with the same value share memory
HOROVOD_HOSTNAME = "HOROVOD_HOSTNAME"  # Horovod's name for it, read after HOSTNAME
SECRET = "HPCDL_SECRET"  # every rank proves it holds it before it may join
RENDEZVOUS_ADDR = "HPCDL_RENDEZVOUS_ADDR"
RENDEZVOUS_PORT = "HPCDL_RENDEZVOUS_PORT"
RENDEZVOUS_SERVE = "HPCDL_RENDEZVOUS_SERVE"  # "1": rank 0 serves the rendezvous at exactly that port
IFACE = "HPCDL_IFACE"  # the interface (or address) a rank's transport binds
ELASTIC_DRIVER = "HPCDL_ELASTIC_DRIVER"  # host:port of the launcher's elastic driver
ELASTIC_WORKER = "HPCDL_ELASTIC_WORKER"  # an elastic worker's number in the job
ELASTIC_TIMEOUT = "HPCDL_ELASTIC_TIMEOUT"  # how long a worker waits for its next round (--elastic-timeout)
MASTER_BOARD = "HPCDL_MASTER_BOARD"  # where rank 0's agent posts MASTER_PORT for the others
START_TIMEOUT = "HPCDL_START_TIMEOUT"  # seconds all ranks may take to meet

# What points a rank at one job's rendezvous: a launcher clears these before it sets its own.
JOB_SPECIFIC = (
    RENDEZVOUS_ADDR, RENDEZVOUS_PORT, RENDEZVOUS_SERVE, SECRET,
    ELASTIC_DRIVER, ELASTIC_WORKER, ELASTIC_TIMEOUT,
)  # fmt: skip

_TRUE = ("1", "true", "yes", "on")


def rendezvous_env(
    addr: str, port: int, secret: Optional[str], serve: Optional[bool] = None
) -> dict[str, str]:
    """The variables that send a rank to the rendezvous at ``addr:port`` with the job's secret (None: the
    rank has it already); ``serve``: whether rank 0 hosts it there (None: left as it is)."""
    env = {RENDEZVOUS_ADDR: addr, RENDEZVOUS_PORT: str(port)}
    if secret is not None:
        env[SECRET] = secret
    if serve is not None:
        env[RENDEZVOUS_SERVE] = "1" if serve else "0"
    return env


def serves(env: Mapping[str, str]) -> bool:
    """Whether rank 0 hosts the rendezvous itself (RENDEZVOUS_SERVE)."""
    return env.get(RENDEZVOUS_SERVE, "").strip().lower() in _TRUE


def host_identity(env: Mapping[str, str]) -> str:
    """The host identity the launcher gave ('' when none: the host name stands for it)."""
    return env.get(HOSTNAME) or env.get(HOROVOD_HOSTNAME) or ""
