"""The job's handshake and authenticated frames as the runtime speaks them (``collectives/src/net/auth.h``
and ``net/session.h``), for the parts of hpcdl written in Python: services the launcher hosts for its
ranks (the elastic driver) and their clients.

::

    server -> client  "HPCDLAU1" nonce_s[32]
    client -> server  "HPCDLAU1" nonce_c[32] mac_c[32] len[u32 le] header[len <= 4096]
                      mac_c = HMAC(secret, "client" nonce_s nonce_c header)
    server -> client  mac_s[32] = HMAC(secret, "server" nonce_c nonce_s header), or the 32-byte refusal
    session key       HMAC(secret, "session" nonce_s nonce_c)
    then frames       len[u32 le] body[len] mac[32]
                      mac = HMAC(session, "to-client"|"to-server" seq[u64 le] len[u32 le] body)

Nothing a peer sends is read before its MAC checks out, apart from bounded lengths. The state of a
handshake and of a session is kept apart from sockets (:class:`ServerHandshake`, :class:`Session`), so a
server may drive them from any event loop; :func:`connect`, :func:`recv_frame` and :func:`request` are the
blocking client. Standard library only (and hpcdl's exceptions when hpcdl is installed): the rank agent
runs this file from its source on hosts that need only Python.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

try:
    from hpcdl.common.exceptions import HpcdlAuthError, HpcdlError, HpcdlTimeoutError
except ImportError:  # run from its source by a rank agent on a host without hpcdl (hpcdl.runner.rank_agent)

    class HpcdlError(RuntimeError):  # type: ignore[no-redef]
        pass

    class HpcdlAuthError(HpcdlError):  # type: ignore[no-redef]
        pass

    class HpcdlTimeoutError(HpcdlError):  # type: ignore[no-redef]
        pass


MAGIC = b"HPCDLAU1"
NONCE_BYTES = 32
MAC_BYTES = 32
MAX_HEADER = 4096
CHALLENGE_BYTES = len(MAGIC) + NONCE_BYTES
CLIENT_FIXED = len(MAGIC) + NONCE_BYTES + MAC_BYTES + 4
REFUSAL = b"HPCDL refuses: wrong job secret\0"


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


@dataclass
class Session:
    """The frames of one authenticated connection, from one side (``"client"`` or ``"server"``)."""

    key: bytes
    side: str
    _sent: int = 0
    _received: int = 0

    def seal(self, body: bytes) -> bytes:
        """The next frame this side sends."""
        towards = b"to-server" if self.side == "client" else b"to-client"
        mac = _mac(self.key, towards, struct.pack("<QI", self._sent, len(body)), body)
        self._sent += 1
        return struct.pack("<I", len(body)) + body + mac

    def open(self, body: bytes, mac: bytes) -> bytes:
        """``body`` of the next frame received, once its ``mac`` checks out."""
        towards = b"to-client" if self.side == "client" else b"to-server"
        expected = _mac(self.key, towards, struct.pack("<QI", self._received, len(body)), body)
        if not hmac.compare_digest(expected, mac):
            raise HpcdlAuthError(
                "a message failed its integrity check (it was altered, replayed or reordered on the way: "
                "something on the network between the two sides interferes with the connection); refused"
            )
        self._received += 1
        return body


def _session_key(secret: bytes, nonce_s: bytes, nonce_c: bytes) -> bytes:
    return _mac(secret, b"session", nonce_s, nonce_c)


@dataclass
class ServerHandshake:
    """The server's side of one handshake: send :attr:`challenge`, collect the client's message until
    :meth:`needed` says it is complete, then :meth:`finish` it."""

    secret: bytes
    nonce: bytes = field(default_factory=lambda: secrets.token_bytes(NONCE_BYTES))

    @property
    def challenge(self) -> bytes:
        return MAGIC + self.nonce

    @staticmethod
    def needed(received: bytes) -> int | None:
        """How many bytes the client's whole message has, once its length field arrived (None before);
        raises when it is not hpcdl's protocol or announces a header beyond :data:`MAX_HEADER`."""
        if received[: len(MAGIC)] != MAGIC[: len(received)]:
            raise HpcdlAuthError("the client does not speak hpcdl's protocol")
        if len(received) < CLIENT_FIXED:
            return None
        (length,) = struct.unpack_from("<I", received, CLIENT_FIXED - 4)
        if length > MAX_HEADER:
            raise HpcdlAuthError(f"the client announced a {length}-byte header, more than {MAX_HEADER}")
        return CLIENT_FIXED + length

    def finish(self, message: bytes) -> tuple[bytes, bytes | None, Session | None]:
        """(reply, header, session) for the client's complete message: the server's MAC, the header and
        the session when the client proved the secret; the refusal, None and None when it did not."""
        nonce_c = message[8:40]
        header = message[CLIENT_FIXED:]
        if not hmac.compare_digest(message[40:72], _mac(self.secret, b"client", self.nonce, nonce_c, header)):
            return REFUSAL, None, None
        reply = _mac(self.secret, b"server", nonce_c, self.nonce, header)
        return reply, header, Session(_session_key(self.secret, self.nonce, nonce_c), "server")


def _recv_exactly(sock: socket.socket, size: int, deadline: float, what: str) -> bytes:
    data = bytearray()
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HpcdlTimeoutError(f"{what}: no answer before the deadline")
        sock.settimeout(left)
        try:
            chunk = sock.recv(size - len(data))
        except TimeoutError:
            raise HpcdlTimeoutError(f"{what}: no answer before the deadline") from None
        except OSError as exc:
            raise HpcdlError(f"{what}: the connection failed ({exc})") from None
        if not chunk:
            raise HpcdlError(f"{what}: the other side closed the connection")
        data += chunk
    return bytes(data)


def connect(
    address: tuple[str, int], secret: str, header: bytes, timeout: float, what: str
) -> tuple[socket.socket, Session]:
    """Connects to an hpcdl server and authenticates with ``header``; the caller owns the socket."""
    if len(header) > MAX_HEADER:
        raise ValueError(f"a handshake header holds at most {MAX_HEADER} bytes, got {len(header)}")
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except OSError as exc:
        raise HpcdlError(f"{what}: cannot connect to {address[0]}:{address[1]} ({exc})") from None
    try:
        challenge = _recv_exactly(sock, CHALLENGE_BYTES, deadline, what)
        if challenge[: len(MAGIC)] != MAGIC:
            raise HpcdlAuthError(f"{what}: it does not speak hpcdl's protocol (wrong address or port?)")
        nonce_s, nonce_c, key = challenge[len(MAGIC) :], secrets.token_bytes(NONCE_BYTES), secret.encode()
        mac = _mac(key, b"client", nonce_s, nonce_c, header)
        sock.sendall(MAGIC + nonce_c + mac + struct.pack("<I", len(header)) + header)
        reply = _recv_exactly(sock, MAC_BYTES, deadline, what)
        if reply == REFUSAL:
            raise HpcdlAuthError(f"{what}: it does not accept this job's secret (HPCDL_SECRET differs)")
        if not hmac.compare_digest(reply, _mac(key, b"server", nonce_c, nonce_s, header)):
            raise HpcdlAuthError(f"{what}: the server does not know this job's secret; refusing it")
        return sock, Session(_session_key(key, nonce_s, nonce_c), "client")
    except BaseException:
        sock.close()
        raise


def recv_frame(sock: socket.socket, session: Session, max_bytes: int, timeout: float, what: str) -> bytes:
    """The next frame's body (at most ``max_bytes``), checked against its MAC before it is returned."""
    deadline = time.monotonic() + timeout
    (length,) = struct.unpack("<I", _recv_exactly(sock, 4, deadline, what))
    if length > max_bytes:
        raise HpcdlAuthError(f"{what}: the other side announced {length} bytes, more than {max_bytes}")
    body = _recv_exactly(sock, length, deadline, what)
    mac = _recv_exactly(sock, MAC_BYTES, deadline, what)
    try:
        return session.open(body, mac)
    except HpcdlAuthError as exc:
        raise HpcdlAuthError(f"{what}: {exc}") from None


MAX_ANSWER = 1 << 20


def request(address: tuple[str, int], secret: str, message: dict[str, Any], timeout: float, what: str) -> Any:
    """One request to a service of the launcher (``hpcdl.runner.service``): sent as the handshake's header,
    answered with one authenticated JSON frame, which is returned. A connection that fails before the
    server answered the handshake (it is not listening yet, or shed it) is tried again until ``timeout``;
    the server then has what is left of ``timeout`` to answer."""
    header = json.dumps(message).encode()
    deadline = time.monotonic() + timeout
    backoff = 0.01
    while True:
        try:
            sock, session = connect(address, secret, header, max(0.1, deadline - time.monotonic()), what)
            break
        except HpcdlAuthError:
            raise
        except HpcdlError:
            if time.monotonic() + backoff >= deadline:
                raise
            time.sleep(backoff)
            backoff = min(2 * backoff, 0.5)
    with sock:
        answer = recv_frame(sock, session, MAX_ANSWER, max(0.1, deadline - time.monotonic()), what)
    return json.loads(answer)
