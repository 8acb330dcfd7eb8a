"""The worker's side of an elastic job (``hpcdl run --min-np A --max-np B``).

The launcher runs a driver that groups the live workers into rounds. Each time hpcdl initializes in a
worker, :func:`join_next_round` asks the driver for this worker's place in the next round it belongs to
(rank, size, the round's rendezvous); :func:`round_changed` tells whether a newer round has formed since,
which ``hpcdl.torch.elastic.State.commit`` turns into ``HostsUpdatedInterrupt``. Protocol: one JSON request
per connection, in the header of the job's challenge-response handshake (the secret is proven, never
sent), answered with one authenticated frame (:func:`hpcdl.common.handshake.request`).
"""

from __future__ import annotations

import os
import time
from typing import Any

from hpcdl import jobenv
from hpcdl.common import handshake
from hpcdl.common.exceptions import HpcdlAuthError, HpcdlConfigError, HpcdlError

DRIVER_ENV = jobenv.ELASTIC_DRIVER
WORKER_ENV = jobenv.ELASTIC_WORKER
TIMEOUT_ENV = jobenv.ELASTIC_TIMEOUT
POLL_INTERVAL = 1.0  # round_changed() asks the driver at most this often

_joined_round = 0
_last_poll = 0.0
_last_seen_round = 0


def enabled() -> bool:
    return bool(os.environ.get(DRIVER_ENV))


def _request(message: dict[str, Any], timeout: float) -> dict[str, Any]:
    address = os.environ[DRIVER_ENV]
    host, _, port = address.rpartition(":")
    where = f"the elastic driver at {address}"
    try:
        answer = handshake.request(
            (host, int(port)),
            os.environ.get(jobenv.SECRET, ""),
            {**message, "worker": _worker()},
            timeout,
            where,
        )
    except HpcdlAuthError as exc:
        raise HpcdlAuthError(
            f"{exc}; the worker and its launcher (hpcdl run) do not share the job's secret"
        ) from None
    except (HpcdlError, ValueError) as exc:
        raise HpcdlError(f"cannot reach {where} ({exc}); the launcher (hpcdl run) may have ended") from None
    if not isinstance(answer, dict):
        raise HpcdlError(f"{where} answered something else than a JSON object")
    if "error" in answer:
        raise HpcdlError(f"elastic driver: {answer['error']}")
    return answer


def _worker() -> int:
    raw = os.environ.get(WORKER_ENV, "")
    try:
        return int(raw)
    except ValueError:
        raise HpcdlConfigError(f"{WORKER_ENV}={raw!r}: set by 'hpcdl run' in elastic mode only") from None


def join_next_round(timeout: float) -> dict[str, str]:
    """Wait (up to `timeout` s) for a round newer than the last one this process joined; return the
    environment that describes this worker's place in it (HPCDL_RANK, HPCDL_SIZE, rendezvous...)."""
    global _joined_round, _last_seen_round
    # The driver answers within `timeout` (no new round: an error); the margin lets that answer arrive.
    answer = _request({"op": "assign", "after": _joined_round}, timeout + 10.0)
    _joined_round = _last_seen_round = int(answer["round"])
    return {
        jobenv.RANK: str(answer["rank"]),
        jobenv.SIZE: str(answer["size"]),
        jobenv.HOSTNAME: str(answer["host"]),
        **jobenv.rendezvous_env(str(answer["addr"]), int(answer["port"]), None, serve=False),
    }


def round_changed(force: bool = False) -> bool:
    """Whether the driver formed a round after the one this process joined (asked at most once per
    POLL_INTERVAL unless `force`)."""
    global _last_poll, _last_seen_round
    if not enabled() or _joined_round == 0:
        return False
    now = time.monotonic()
    if force or now - _last_poll >= POLL_INTERVAL:
        _last_poll = now
        _last_seen_round = int(_request({"op": "round"}, 10.0)["round"])
    return _last_seen_round > _joined_round
