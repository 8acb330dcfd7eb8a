"""Rank program of tests/parallel/test_tcp_connections.py: after an allreduce over TCP, prints ``SNDBUF`` and
the send buffer (SO_SNDBUF, as the kernel reports it) of every connected TCP socket this process holds, and
``CONGESTION`` and the congestion control (TCP_CONGESTION) of each, and ``USES`` and what
``hpcdl.common.tcp_congestion()`` says."""

from __future__ import annotations

import os
import socket

import numpy as np

import hpcdl.common as hc


def connected_sockets() -> list[socket.socket]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.fromfd(int(fd), socket.AF_INET, socket.SOCK_STREAM)  # a duplicate, same socket
        except OSError:
            continue
        try:
            sock.getpeername()
        except OSError:  # a listener, or not TCP
            sock.close()
            continue
        found.append(sock)
    return found


if __name__ == "__main__":
    hc.init()
    values = np.ones(1 << 18, np.float32)
    hc.allreduce(values, out=values)
    assert values[0] == hc.size(), values[0]
    sockets = connected_sockets()
    print("SNDBUF", *sorted(s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) for s in sockets), flush=True)
    names = [
        s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 64).rstrip(b"\0").decode() for s in sockets
    ]
    print("CONGESTION", *sorted(names), flush=True)
    print("USES", hc.tcp_congestion(), flush=True)
    for s in sockets:
        s.close()
    hc.shutdown()
