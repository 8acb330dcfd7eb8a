"""What plain TCP carries between two ranks on different hosts: the ceiling a cross-host collective is
measured against, taken inside the benchmark's own job (same processes, same moment, same load).

Rank 0 listens; the first rank on another host (the "peer") opens ``max(streams)`` connections to it. Then,
collectively over hpcdl (every rank calls each probe; ranks other than these two only wait):

- ``one_way(k)``: the peer sends ``nbytes`` to rank 0 over k connections at once (one thread each);
- ``both_ways()``: both send ``nbytes`` to each other over one connection at the same time (an
  allreduce of two ranks moves its whole buffer in each direction at once);
- ``round_trip()``: a 1-byte message there and back, the mean over a block of them.

Each probe returns seconds on every rank (rank 0's measurement, broadcast), so that every rank takes the
same decisions after it. The connections use the congestion control that hpcdl's own use
(``hpcdl.common.tcp_congestion()``), so that the ceiling is what one such connection carries.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Optional

import numpy as np

READY = b"r"
ROUND_TRIPS = 1000


def peer_of(hosts: list[str]) -> Optional[int]:
    """The first rank whose host is not rank 0's, or None when every rank shares rank 0's host."""
    return next((r for r, h in enumerate(hosts) if h != hosts[0]), None)


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("the other rank of the TCP probe closed its connection")
        view = view[n:]


def _connect(address: str, port: int, congestion: str) -> socket.socket:
    """A connection whose congestion control is set before it connects (set later, it keeps the first one's
    pacing)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion.encode())
    sock.settimeout(60)
    sock.connect((socket.gethostbyname(address), port))
    return sock


class TcpCeiling:
    """The probe's connections between rank 0 and `peer` (see the module docstring). `broadcast` sends a
    float64 array from rank 0 to every rank, `barrier` waits for all ranks (both over hpcdl)."""

    def __init__(
        self,
        rank: int,
        peer: int,
        address: str,
        port: int,
        listener: Optional[socket.socket],
        congestion: str,
        streams: int,
        nbytes: int,
        broadcast: Callable[[np.ndarray], None],
        barrier: Callable[[], None],
    ) -> None:
        self.rank, self.peer, self.nbytes = rank, peer, nbytes
        self._broadcast, self._barrier = broadcast, barrier
        self.socks: list[socket.socket] = []
        if rank == 0 and listener is not None:
            self.socks = [listener.accept()[0] for _ in range(streams)]
            listener.close()
        elif rank == peer:
            self.socks = [_connect(address, port, congestion) for _ in range(streams)]
        for s in self.socks:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(300)
        self.buffer = bytearray(2 * nbytes) if self.socks else bytearray()  # both_ways: out, then in

    @staticmethod
    def listen(congestion: str) -> tuple[socket.socket, int]:
        listener = socket.create_server(("", 0), backlog=64)
        # connections it accepts take the listener's congestion control
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion.encode())
        return listener, int(listener.getsockname()[1])

    def close(self) -> None:
        for s in self.socks:
            s.close()

    # ---- probes ------------------------------------------------------------------------------------
    def _sync(self, socks: list[socket.socket]) -> None:
        """Both ends ready: the peer sends a byte on each connection and waits for rank 0's answer."""
        one = bytearray(1)
        for s in socks:
            if self.rank == self.peer:
                s.sendall(READY)
                _recv_exactly(s, memoryview(one))
            else:
                _recv_exactly(s, memoryview(one))
                s.sendall(READY)

    def _timed(self, body: Callable[[], float]) -> float:
        """Runs `body` on the two ranks (it returns rank 0's seconds) and gives every rank that time."""
        self._barrier()
        seconds = np.zeros(1)
        if self.socks:
            seconds[0] = body()
        self._broadcast(seconds)
        return float(seconds[0])

    def one_way(self, streams: int) -> float:
        """Seconds for the peer to send ``nbytes`` to rank 0 over `streams` connections at once."""

        def body() -> float:
            socks = self.socks[:streams]
            self._sync(socks)
            share = self.nbytes // streams
            view = memoryview(self.buffer)
            start = time.perf_counter()
            if self.rank == self.peer:
                work = [
                    lambda s=s, i=i: s.sendall(view[i * share : (i + 1) * share]) for i, s in enumerate(socks)
                ]
            else:
                work = [lambda s=s, i=i: _recv_exactly(s, view[i * share : (i + 1) * share])
                        for i, s in enumerate(socks)]  # fmt: skip
            _run_all(work)
            self._sync(socks[:1])  # rank 0 received everything; the peer learns it too
            return time.perf_counter() - start

        return self._timed(body)

    def both_ways(self) -> float:
        """Seconds for both ranks to send ``nbytes`` to each other over one connection at the same time."""

        def body() -> float:
            sock = self.socks[0]
            self._sync([sock])
            view = memoryview(self.buffer)
            out, into = view[: self.nbytes], view[self.nbytes :]
            start = time.perf_counter()
            _run_all([lambda: sock.sendall(out), lambda: _recv_exactly(sock, into)])
            self._sync([sock])
            return time.perf_counter() - start

        return self._timed(body)

    def round_trip(self) -> float:
        """Seconds of a 1-byte message there and back: the mean of a block of ROUND_TRIPS (the statistic
        the benchmark takes of a collective)."""

        def body() -> float:
            sock = self.socks[0]
            self._sync([sock])
            one = bytearray(1)
            start = time.perf_counter()
            for _ in range(ROUND_TRIPS):
                if self.rank == 0:
                    sock.sendall(READY)
                    _recv_exactly(sock, memoryview(one))
                else:
                    _recv_exactly(sock, memoryview(one))
                    sock.sendall(READY)
            return (time.perf_counter() - start) / ROUND_TRIPS

        return self._timed(body)


def _run_all(work: list[Callable[[], None]]) -> None:
    """Runs the callables at once (threads; socket calls release the GIL) and re-raises the first error."""
    errors: list[BaseException] = []

    def run(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in work[1:]]
    for t in threads:
        t.start()
    run(work[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
