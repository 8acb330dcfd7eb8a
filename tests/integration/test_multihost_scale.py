"""The bootstrap under load: 256 ranks meeting and allreducing over TCP on this machine, a handshake that
outlasts a flood of connections, and errors that name the real cause of a failed handshake."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcdl.common.rendezvous import RendezvousServer, make_secret

MAGIC = b"HPCDLAU1"

RANK = r"""
import sys
import numpy as np
import hpcdl.common as hc
hc.init()
x = np.full(1024, hc.rank() + 1.0)
hc.allreduce(x, out=x)
n = hc.size()
sys.stdout.write(f"rank {hc.rank()} of {n}: {'ok' if (x == n * (n + 1) / 2).all() else x[:4]}\n")
hc.shutdown()
"""


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"the server closed the connection after {len(data)} of {size} bytes")
        data += chunk
    return data


def _mac(secret: str, *parts: bytes) -> bytes:
    return hmac.new(secret.encode(), b"".join(parts), hashlib.sha256).digest()


@contextlib.contextmanager
def _rendezvous(size: int, secret: str) -> Iterator[RendezvousServer]:
    server = RendezvousServer(size, secret, host="127.0.0.1")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_slow_handshake_is_not_evicted_by_a_flood_of_connections() -> None:
    """A rank that takes its time to answer the challenge (a loaded host) keeps its place while 300 more
    connections are accepted. The server used to evict the oldest pending handshake past 128."""
    secret = make_secret()
    header = b"purpose=register\nrank=0\nsize=1\njob=\nhost=h\naddr=\nport=1\npid=1\n"
    with _rendezvous(1, secret) as server, contextlib.ExitStack() as flood:
        rank = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        flood.callback(rank.close)
        challenge = _recv_exactly(rank, 40)
        for _ in range(300):
            idle = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            flood.callback(idle.close)
            assert _recv_exactly(idle, 40)[:8] == MAGIC  # accepted by the server, not queued by the kernel
        nonce = os.urandom(32)
        mac = _mac(secret, b"client", challenge[8:], nonce, header)
        rank.sendall(MAGIC + nonce + mac + struct.pack("<I", len(header)) + header)
        assert _recv_exactly(rank, 32) == _mac(secret, b"server", nonce, challenge[8:], header)
        (length,) = struct.unpack("<I", _recv_exactly(rank, 4))
        table = _recv_exactly(rank, length).decode()
        assert "size=1\n" in table and "peer=0\th\t127.0.0.1\t1\t1\t" in table


def _rank_env(port: int, secret: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "HPCDL_"))}
    return {**env, "HPCDL_RANK": "1", "HPCDL_SIZE": "2", "HPCDL_RENDEZVOUS_ADDR": "127.0.0.1",
            "HPCDL_RENDEZVOUS_PORT": str(port), "HPCDL_SECRET": secret, "HPCDL_TIMEOUT": "3"}  # fmt: skip


def _run_rank(tmp_path: Path, port: int, secret: str) -> subprocess.CompletedProcess:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    return subprocess.run([sys.executable, str(script)], env=_rank_env(port, secret), capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)  # fmt: skip


def test_a_wrong_secret_is_named_at_once(tmp_path: Path) -> None:
    """The server refuses it explicitly (a dropped connection would be retried until the deadline and
    reported as dropped)."""
    with _rendezvous(2, make_secret()) as server:
        done = _run_rank(tmp_path, server.port, make_secret())
    assert done.returncode == 1
    assert "HpcdlAuthError" in done.stderr and "does not accept this job's secret" in done.stderr


def test_a_dropped_handshake_is_retried_and_not_blamed_on_the_secret(tmp_path: Path) -> None:
    """A server that closes every connection after its challenge (as an overloaded one sheds handshakes):
    the rank retries until its deadline and then says what happened."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def drop_after_challenge() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            client.sendall(MAGIC + os.urandom(32))
            answer = _recv_exactly(client, 76)  # magic, nonce, MAC, header length; then the header
            _recv_exactly(client, struct.unpack("<I", answer[72:])[0])
            client.close()

    threading.Thread(target=drop_after_challenge, daemon=True).start()
    try:
        done = _run_rank(tmp_path, listener.getsockname()[1], make_secret())
    finally:
        listener.close()
    assert done.returncode == 1
    assert "the server closed the connection before answering (it was overloaded" in done.stderr
    assert "secret" not in done.stderr.splitlines()[-1]
    assert len(accepted) > 1  # it came back


@pytest.mark.slow
def test_256_ranks_meet_and_allreduce_over_tcp(tmp_path: Path) -> None:
    """Each rank holds about 2000 connections (four full TCP meshes); the soft limit on open files is
    the common default of 1024 and the runtime raises it. 256 ranks connect to the launcher's rendezvous
    and to each other's listeners at once."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the hard limit on open files is {hard}; 256 ranks over TCP need about 2100 per rank")
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "HPCDL_"))}
    command = f"ulimit -Sn 1024 && exec {sys.executable} -m hpcdl run -np 256 --tcp --timeout 150 " \
              f"{sys.executable} {script}"  # fmt: skip
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    lines = sorted(line.split(":", 1)[1] for line in done.stdout.splitlines())
    assert lines == sorted(f"rank {r} of 256: ok" for r in range(256))
