"""Small services the launcher hosts for its ranks: one JSON object per line over TCP, one request per
connection, each carrying the job secret (compared in constant time; a wrong one gets an error and nothing
else). The elastic driver answers on one (``hpcdl.runner.elastic``); the :class:`Board` on another lets rank 0
publish what only its host can choose (the MASTER_PORT it holds for torch.distributed) to the other ranks.
"""

from __future__ import annotations

import hmac
import json
import socketserver
import threading
from typing import Any, Callable

Respond = Callable[[dict[str, Any]], dict[str, Any]]
MAX_WAIT_SECONDS = 3600.0


class _Handler(socketserver.StreamRequestHandler):
    server: JsonLineServer
    timeout = 30.0  # a client that connects and sends nothing is dropped

    def handle(self) -> None:
        try:
            request = json.loads(self.rfile.readline())
        except ValueError:
            return
        secret = request.get("secret") if isinstance(request, dict) else None
        if not isinstance(secret, str) or not hmac.compare_digest(
            secret.encode(), self.server.secret.encode()
        ):
            answer: dict[str, Any] = {"error": "wrong job secret"}
        else:
            try:
                answer = self.server.respond(request)
            except (KeyError, TypeError, ValueError) as exc:
                answer = {"error": f"malformed request: {exc}"}
        self.wfile.write(json.dumps(answer).encode() + b"\n")


class JsonLineServer(socketserver.ThreadingTCPServer):
    """Answers each request with ``respond(request)`` on a thread of its own, on all interfaces, port 0."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, secret: str, respond: Respond) -> None:
        super().__init__(("0.0.0.0", 0), _Handler)
        self.secret = secret
        self.respond = respond

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


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
    """A :class:`Board` served for the ranks of one job."""

    def __init__(self, secret: str) -> None:
        self.board = Board()
        self._server = JsonLineServer(secret, self.board.respond)
        self._server.start()

    @property
    def port(self) -> int:
        return self._server.port

    def stop(self) -> None:
        self.board.close()
        self._server.stop()
