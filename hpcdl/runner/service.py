"""Small services the launcher hosts for the job's ranks (the elastic driver): one request per connection,
carried in the header of the runtime's handshake (:mod:`hpcdl.common.handshake`), so that only a process
holding the job's secret is heard and the secret itself never travels, and answered with one JSON frame
MACed under the connection's session key.

Anyone who can reach the port may connect, so what a connection can cost is bounded: nothing is read
before the client's MAC but a fixed-size prefix and a header of at most 4096 bytes; a handshake not done
within :data:`HANDSHAKE_SECONDS` is dropped; at most ``capacity`` connections are open at once (the rest
wait in the kernel's listen queue), and when all are taken a handshake whose client has held its challenge
for :data:`SHED_GRACE_SECONDS` without answering makes room. One event-loop thread runs every handshake;
answers that wait (a worker waiting for its next round) run on at most ``capacity`` threads, and only for
clients that proved the secret.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import json
import resource
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from hpcdl.common.exceptions import HpcdlAuthError
from hpcdl.common.handshake import CLIENT_FIXED, MAGIC, ServerHandshake

Respond = Callable[[dict[str, Any]], dict[str, Any]]

HANDSHAKE_SECONDS = 10.0
SHED_GRACE_SECONDS = 2.0
REPLY_SECONDS = 10.0  # to hand the answer to a client that has stopped reading
_ROOM_POLL_SECONDS = 0.05
ACCEPT_BACKOFF_SECONDS = (0.01, 0.5)  # the first and the longest pause after a failed accept
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def capacity_for(ranks: int) -> int:
    """Connections a service for a job of `ranks` ranks keeps open at once: room for 256 handshakes (a
    coroutine and a socket each; a flood of idle connections beyond them waits in the listen queue) besides
    two requests per rank (one waiting while it makes another)."""
    return 256 + 2 * ranks


def descriptor_reserve(limit: int) -> int:
    """Descriptors of a process allowed `limit` open files that a listener leaves to the job's own ranks:
    an eighth, at least 32 (the runtime's listeners keep the same: ``collectives/src/net/auth.cpp``)."""
    return max(32, limit // 8)


def _descriptor_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


@dataclass(eq=False)
class _Client:
    writer: asyncio.StreamWriter
    accepted: float
    challenged: float = 0.0  # when the challenge was sent (0: not yet)
    authenticated: bool = False
    task: asyncio.Task | None = None

    def stalled(self, now: float) -> bool:
        return not self.authenticated and self.challenged > 0 and now - self.challenged > SHED_GRACE_SECONDS


class ServiceServer:
    """Answers each authenticated request with ``respond(request)``; listens on ``host`` (the address the
    ranks are given, not every interface), port 0; ``name`` says which service it is in warnings."""

    def __init__(
        self,
        secret: str,
        respond: Respond,
        host: str,
        capacity: int = capacity_for(1),
        name: str = "the launcher's service for its ranks",
    ) -> None:
        if not secret:
            raise ValueError("a service for the job's ranks needs the job's secret")
        self._secret = secret.encode()
        self._respond = respond
        self._capacity = capacity
        self._name = name
        self._warned: set[str] = set()
        self._listener = socket.create_server((host, 0), backlog=1024)
        self._listener.setblocking(False)
        self._clients: set[_Client] = set()
        self._pool = concurrent.futures.ThreadPoolExecutor(capacity, thread_name_prefix="hpcdl-service")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hpcdl-service", daemon=True)
        self._accepting: asyncio.Future | None = None

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def start(self) -> None:
        self._thread.start()
        self._accepting = asyncio.run_coroutine_threadsafe(self._accept(), self._loop)

    def stop(self) -> None:
        """Stop listening and drop every connection (requests still waiting get no answer)."""
        if self._accepting is not None:
            asyncio.run_coroutine_threadsafe(self._shut_down(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
            self._accepting = None
        self._listener.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _shut_down(self) -> None:
        assert self._accepting is not None
        self._accepting.cancel()
        tasks = [client.task for client in self._clients if client.task is not None]
        for client in list(self._clients):
            client.writer.transport.abort()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _room(self, now: float) -> bool:
        """Whether one more connection may be accepted (shedding a stalled handshake when needed)."""
        if len(self._clients) < self._capacity:
            return True
        stalled = next((c for c in self._clients if c.stalled(now)), None)
        if stalled is None:
            return False
        stalled.writer.transport.abort()
        self._clients.discard(stalled)
        return True

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = ACCEPT_BACKOFF_SECONDS[0]
        while True:
            while not self._room(time.monotonic()):
                await asyncio.sleep(_ROOM_POLL_SECONDS)
            try:
                conn, _ = await loop.sock_accept(self._listener)
            except OSError as exc:
                self._accept_failed(exc)
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, ACCEPT_BACKOFF_SECONDS[1])
                continue
            backoff = ACCEPT_BACKOFF_SECONDS[0]
            limit = _descriptor_limit()
            if conn.fileno() >= limit - descriptor_reserve(limit):  # no lower descriptor was free
                self._warn_once(
                    "reserve",
                    f"fewer than {descriptor_reserve(limit)} of the {limit} files this process may open are "
                    "left: connections that have not proven the job's secret are dropped to keep them for "
                    "the job's ranks (many connections to this port: another user's, or a stuck client's?)",
                )
                self._shed_unauthenticated()
            reader, writer = await asyncio.open_connection(sock=conn)
            client = _Client(writer, time.monotonic())
            self._clients.add(client)
            client.task = loop.create_task(self._serve(client, reader))

    def _accept_failed(self, exc: OSError) -> None:
        """Report a failed accept once per cause; out of descriptors, free one for the next try."""
        if exc.errno in _OUT_OF_DESCRIPTORS:
            self._warn_once(
                f"errno {exc.errno}",
                f"cannot accept a connection ({exc.strerror}; this process may open {_descriptor_limit()} "
                "files): it drops connections that have not proven the job's secret and tries again; if "
                "the job's ranks need more, raise the limit where 'hpcdl run' starts (ulimit -n)",
            )
            self._shed_unauthenticated()
        else:
            self._warn_once(f"errno {exc.errno}", f"cannot accept a connection ({exc}); it tries again")

    def _shed_unauthenticated(self) -> None:
        """Drop the oldest connection that has not proven the secret (the job's ranks answer at once)."""
        waiting = [c for c in self._clients if not c.authenticated]
        if waiting:
            oldest = min(waiting, key=lambda c: c.accepted)
            oldest.writer.transport.abort()
            self._clients.discard(oldest)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print(f"hpcdl: warning: {self._name} on port {self.port}: {message}", file=sys.stderr, flush=True)

    async def _serve(self, client: _Client, reader: asyncio.StreamReader) -> None:
        writer = client.writer
        try:
            handshake = ServerHandshake(self._secret)
            writer.write(handshake.challenge)
            await asyncio.wait_for(writer.drain(), HANDSHAKE_SECONDS)
            client.challenged = time.monotonic()
            message = await asyncio.wait_for(self._client_message(reader), HANDSHAKE_SECONDS)
            reply, header, session = handshake.finish(message)
            writer.write(reply)
            if session is None or header is None:
                await asyncio.wait_for(writer.drain(), REPLY_SECONDS)
                return
            client.authenticated = True
            answer = await asyncio.get_running_loop().run_in_executor(self._pool, self._answer, header)
            writer.write(session.seal(json.dumps(answer).encode()))
            await asyncio.wait_for(writer.drain(), REPLY_SECONDS)
        except (OSError, EOFError, asyncio.TimeoutError, asyncio.IncompleteReadError, HpcdlAuthError):
            pass  # dropped: a stray, stalled or foreign client
        finally:
            self._clients.discard(client)
            with contextlib.suppress(OSError):
                writer.close()

    @staticmethod
    async def _client_message(reader: asyncio.StreamReader) -> bytes:
        """The client's answer to the challenge; another protocol is refused at its first bytes, and an
        announced header beyond the bound before any of it is read."""
        message = await reader.readexactly(len(MAGIC))
        ServerHandshake.needed(message)
        message += await reader.readexactly(CLIENT_FIXED - len(MAGIC))
        total = ServerHandshake.needed(message)
        assert total is not None
        return message + await reader.readexactly(total - len(message))

    def _answer(self, header: bytes) -> dict[str, Any]:
        try:
            request = json.loads(header)
            if not isinstance(request, dict):
                raise ValueError("not a JSON object")
            return self._respond(request)
        except (KeyError, TypeError, ValueError) as exc:
            return {"error": f"malformed request: {exc}"}
