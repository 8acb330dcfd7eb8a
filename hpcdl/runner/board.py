"""The board through which rank 0 publishes what only its host can choose (the MASTER_PORT it holds for
torch.distributed) to the other ranks: served by :class:`hpcdl.runner.service.ServiceServer`, so only the
job's ranks are heard and the secret never travels.
"""

from __future__ import annotations

import threading
from typing import Any

from hpcdl.runner.service import ServiceServer, capacity_for

MAX_WAIT_SECONDS = 3600.0


class Board:
    """Named values ranks publish to each other: ``put`` once, ``get`` waits (bounded) until it is there."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}
        self._changed = threading.Condition()
        self._closed = False

    def put(self, key: str, value: str) -> None:
        with self._changed:
            self._values[key] = value
            self._changed.notify_all()

    def get(self, key: str, wait: float) -> str | None:
        with self._changed:
            self._changed.wait_for(
                lambda: key in self._values or self._closed, timeout=min(wait, MAX_WAIT_SECONDS)
            )
            return self._values.get(key)

    def close(self) -> None:
        """Wake every waiter: the job is ending."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def respond(self, request: dict[str, Any]) -> dict[str, Any]:
        key = str(request["key"])
        if request.get("op") == "put":
            self.put(key, str(request["value"]))
            return {"ok": True}
        if request.get("op") == "get":
            value = self.get(key, float(request["wait"]))
            if value is None:
                return {"error": f"nobody published {key} within {float(request['wait']):g} s"}
            return {"value": value}
        return {"error": f"unknown request {request.get('op')!r}"}


class BoardServer:
    """A :class:`Board` served for the `ranks` ranks of one job at `host` (the address they are given)."""

    def __init__(self, secret: str, host: str, ranks: int) -> None:
        self.board = Board()
        self._server = ServiceServer(
            secret, self.board.respond, host, capacity_for(ranks), "the launcher's board"
        )
        self._server.start()

    @property
    def port(self) -> int:
        return self._server.port

    def stop(self) -> None:
        self.board.close()
        self._server.stop()
