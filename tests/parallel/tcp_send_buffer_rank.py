"""Rank program of tests/parallel/test_tcp_send_buffer.py: after an allreduce over TCP, prints ``SNDBUF`` and
the send buffer (SO_SNDBUF, as the kernel reports it) of every connected TCP socket this process holds."""

from __future__ import annotations

import os
import socket

import numpy as np

import hpcdl.common as hc


def connected_send_buffers() -> list[int]:
    sizes = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.fromfd(int(fd), socket.AF_INET, socket.SOCK_STREAM)  # a duplicate, same socket
        except OSError:
            continue
        with sock:
            try:
                sock.getpeername()
            except OSError:  # a listener, or not TCP
                continue
            sizes.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
    return sorted(sizes)


if __name__ == "__main__":
    hc.init()
    values = np.ones(1 << 18, np.float32)
    hc.allreduce(values, out=values)
    assert values[0] == hc.size(), values[0]
    print("SNDBUF", *connected_send_buffers(), flush=True)
    hc.shutdown()
