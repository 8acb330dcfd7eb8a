"""The job's rendezvous: where ranks meet and prove they hold the job's secret.

The launcher (``hpcdl run``) hosts a :class:`RendezvousServer`, gives every rank its address in
``HPCDL_RENDEZVOUS_ADDR``/``HPCDL_RENDEZVOUS_PORT`` and the secret from :func:`make_secret` in
``HPCDL_SECRET`` (environment only, never on a command line). The server is the compiled runtime's:
clients authenticate with an HMAC-SHA-256 challenge-response before anything they send is read, and
connections that fail, stall or send garbage are dropped without disturbing the job.
"""

from __future__ import annotations

import contextlib
import ctypes
import secrets
from types import TracebackType

from hpcdl.common import library
from hpcdl.common.exceptions import error_for


def make_secret() -> str:
    """A fresh job secret: 32 random bytes, hex-encoded."""
    return secrets.token_hex(32)


class RendezvousServer:
    """A rendezvous server for a job of ``size`` ranks that know ``secret``; ``port=0`` picks a free port."""

    def __init__(self, size: int, secret: str, host: str = "0.0.0.0", port: int = 0) -> None:
        if size < 1:
            raise ValueError(f"a job needs at least one rank, got size={size}")
        if not secret:
            raise ValueError("the rendezvous needs the job's secret; make one with make_secret()")
        self.size = size
        self.host = host
        self._secret = secret
        self._requested_port = port
        self._id = 0

    def start(self) -> None:
        """Start listening (it is when this returns)."""
        if self._id:
            return
        lib = library.load()
        server = lib.hpcdl_rendezvous_server_start(
            self.host.encode(), self._requested_port, self._secret.encode(), self.size
        )
        if server <= 0:
            raise error_for(int(-server), library.last_error())
        self._id = int(server)

    @property
    def port(self) -> int:
        if not self._id:
            raise RuntimeError("the rendezvous server is not running; call start() first")
        return int(library.load().hpcdl_rendezvous_server_port(self._id))

    def arrived(self) -> list[int]:
        """World ranks that have registered in the current round (all of them once it completed)."""
        if not self._id:
            return []
        buf = (ctypes.c_int32 * self.size)()
        n = library.load().hpcdl_rendezvous_server_arrived(self._id, buf, self.size)
        return sorted(buf[i] for i in range(max(0, min(n, self.size))))

    def stop(self) -> None:
        if self._id:
            library.load().hpcdl_rendezvous_server_stop(self._id)
            self._id = 0

    def __enter__(self) -> RendezvousServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
