"""Attacks on how ranks meet, each performed for real against real ranks and the runtime's rendezvous:
registering with a secret derived from public job facts, a second process claiming a registered rank,
a rendezvous table altered or replayed on the way (a man in the middle between a rank and the server), and
a table no rank can use from an authenticated but broken server."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from _ranks import free_port

from hpcdl.common import discovery
from hpcdl.common.handshake import ServerHandshake
from hpcdl.common.rendezvous import RendezvousServer, make_secret

ALLREDUCE = (
    "import json, time, numpy as np, hpcdl.common as hc\n"
    "start = time.monotonic()\n"
    "try:\n"
    "    hc.init()\n"
    "    print('RESULT', json.dumps(['sum', float(hc.allreduce(np.ones(2))[0])]), flush=True)\n"
    "    hc.shutdown()\n"
    "except hc.HpcdlError as e:\n"
    "    print('RESULT', json.dumps([type(e).__name__, str(e), time.monotonic() - start]), flush=True)\n"
)


def _clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any launcher's variables (HPCDL_LIBRARY stays: which build to test)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if (
            not k.startswith(("HPCDL_", "OMPI_", "PMI_", "SLURM_", "HOROVOD_"))
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        )
        or k == "HPCDL_LIBRARY"
    }
    env.update(extra)
    return env


def _start_rank(rank: int, size: int, **env: str) -> subprocess.Popen:
    variables = _clean_env(HPCDL_RANK=str(rank), HPCDL_SIZE=str(size), **env)
    return subprocess.Popen(
        [sys.executable, "-c", ALLREDUCE],
        env=variables,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _meet_at(port: int, secret: str, **extra: str) -> dict[str, str]:
    return dict(
        HPCDL_RENDEZVOUS_ADDR="127.0.0.1", HPCDL_RENDEZVOUS_PORT=str(port), HPCDL_SECRET=secret, **extra
    )


def _result(proc: subprocess.Popen, timeout: float = 60) -> list:
    stdout, stderr = proc.communicate(timeout=timeout)
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"exit {proc.returncode}: {stderr}"
    return json.loads(lines[-1][len("RESULT ") :])


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


# ---- a secret derived from what the job shares --------------------------------------------------------
def _old_derived_secret(addr: str, port: int, size: int) -> str:
    """The secret ranks derived without HPCDL_SECRET before: all of it public (squeue, id -u)."""
    return hashlib.sha256("|".join(["", addr, str(port), str(size), str(os.getuid())]).encode()).hexdigest()


def _mac(secret: str, *parts: bytes) -> bytes:
    return hmac.new(secret.encode(), b"".join(parts), hashlib.sha256).digest()


def _register_with(secret: str, port: int, header: bytes) -> bool:
    """Whether the listener at 127.0.0.1:port took this registration (the handshake of net/auth.h)."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return False
    with sock:
        try:
            challenge = _recv_exactly(sock, 40)
            nonce = secrets.token_bytes(32)
            mac = _mac(secret, b"client", challenge[8:], nonce, header)
            sock.sendall(b"HPCDLAU1" + nonce + mac + struct.pack("<I", len(header)) + header)
            reply = _recv_exactly(sock, 32)
        except OSError:
            return False
        return reply == _mac(secret, b"server", nonce, challenge[8:], header)


def test_a_rank_without_a_secret_refuses_to_start_so_a_derived_one_registers_nowhere() -> None:
    """torchrun's variables and no HPCDL_SECRET: rank 0 used to serve the rendezvous with a secret made of
    the rendezvous address, its port, the size and the uid, and another user who computed it registered as
    rank 1. Now rank 0 refuses to start, saying how to set a secret, and nothing listens."""
    master = free_port()
    rank0 = subprocess.Popen(
        [sys.executable, "-c", ALLREDUCE],
        env=_clean_env(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ports = discovery.ports_after(master)
        forged = _old_derived_secret("127.0.0.1", ports[0], 2)
        tag = hashlib.sha256("|".join(["127.0.0.1", str(ports[0]), "", "", "", ""]).encode()).hexdigest()[:16]
        header = f"purpose=register\nrank=1\nsize=2\njob={tag}\nhost=evil\naddr=\nport=1\npid=1\n".encode()
        accepted = []
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and rank0.poll() is None and not accepted:
            accepted = [port for port in ports if _register_with(forged, port, header)]
            time.sleep(0.1)
        assert accepted == [], "a registration with the derived secret was accepted"
        name, message, seconds = _result(rank0)
    finally:
        rank0.kill()
        rank0.wait()
    assert name == "HpcdlConfigError" and "HPCDL_SECRET is not set" in message, message
    assert "secrets.token_hex(32)" in message and seconds < 10


def test_an_empty_or_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="secret"):
        RendezvousServer(2, "")
    with pytest.raises(RuntimeError, match="fewer than 16"):
        RendezvousServer(2, "abc123").start()
    port = free_port()
    ranks = [_start_rank(r, 2, **_meet_at(port, "tooshort", HPCDL_RENDEZVOUS_SERVE="1")) for r in (0, 1)]
    for proc in ranks:
        name, message, _ = _result(proc)
        assert name == "HpcdlConfigError" and "has 8 characters" in message, message


# ---- two processes claiming one rank ---------------------------------------------------------------
def _wait_for(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_second_registration_of_a_registered_rank_is_refused_not_preferred() -> None:
    secret = make_secret()
    with RendezvousServer(2, secret, host="127.0.0.1") as server:
        env = _meet_at(server.port, secret)
        first = _start_rank(0, 2, **env)
        _wait_for(lambda: server.arrived() == [0], 30, "the first rank 0 to register")
        claimant = _start_rank(0, 2, **env)
        name, message, seconds = _result(claimant)
        assert name == "HpcdlConfigError", message
        assert "rank 0 is already registered, by process" in message, message
        assert "two processes claim rank 0" in message and str(first.pid) in message and seconds < 10
        other = _start_rank(1, 2, **env)
        assert _result(first) == ["sum", 2.0] and _result(other) == ["sum", 2.0]


def test_a_registration_whose_process_is_gone_is_left_out_and_replaced() -> None:
    """Rank 0 registers and dies; rank 1 arrives before rank 0's new process. The round used to complete
    with the dead registration: rank 1 got a table pointing at a closed port, the new rank 0 waited alone."""
    secret = make_secret()
    with RendezvousServer(2, secret, host="127.0.0.1") as server:
        env = _meet_at(server.port, secret)
        gone = _start_rank(0, 2, **env)
        _wait_for(lambda: server.arrived() == [0], 30, "rank 0 to register")
        gone.kill()
        gone.communicate()
        other = _start_rank(1, 2, **env)
        _wait_for(lambda: 1 in server.arrived(), 30, "rank 1 to register")
        again = _start_rank(0, 2, **env)
        assert _result(again) == ["sum", 2.0] and _result(other) == ["sum", 2.0]


# ---- a man in the middle between the ranks and the rendezvous ------------------------------------
Tamper = Callable[[int, bytes], bytes]  # (registering rank, frame) -> the frame passed on


class RendezvousProxy:
    """Relays ranks' connections to the rendezvous server as anyone on the path could: it cannot take part
    in the handshake, but sees every frame after it and may change what it passes on."""

    def __init__(self, server_port: int, tamper: Tamper) -> None:
        self.server_port = server_port
        self.tamper = tamper
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frames: dict[int, list[bytes]] = {}  # what the server sent each rank
        self.changed = threading.Condition()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                thread = threading.Thread(target=self._relay, args=(client,), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _relay(self, client: socket.socket) -> None:
        server = socket.create_connection(("127.0.0.1", self.server_port))
        self._sockets += [client, server]
        with contextlib.suppress(OSError, ConnectionError):
            client.sendall(_recv_exactly(server, 40))  # challenge
            fixed = _recv_exactly(client, 76)
            header = _recv_exactly(client, struct.unpack("<I", fixed[72:])[0])
            server.sendall(fixed + header)
            client.sendall(_recv_exactly(server, 32))  # the server's MAC
            rank = int(dict(line.split("=", 1) for line in header.decode().splitlines())["rank"])
            while True:
                length = _recv_exactly(server, 4)
                frame = length + _recv_exactly(server, struct.unpack("<I", length)[0] + 32)
                with self.changed:
                    self.frames.setdefault(rank, []).append(frame)
                    self.changed.notify_all()
                client.sendall(self.tamper(rank, frame))
        client.close()
        server.close()

    def table_of(self, rank: int, timeout: float = 30) -> bytes:
        """The table frame the server sent `rank` (waits for it)."""
        with self.changed:
            self.changed.wait_for(
                lambda: any(b"\nnonce=" in f for f in self.frames.get(rank, [])), timeout=timeout
            )
            return next(f for f in self.frames.get(rank, []) if b"\nnonce=" in f)

    def close(self) -> None:
        self.listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


@contextlib.contextmanager
def _job_behind_proxy(
    tamper: Tamper, started: tuple[int, ...] = (0, 1)
) -> Iterator[tuple[RendezvousProxy, list[subprocess.Popen]]]:
    """A job of two ranks (those in `started` run) that reach their rendezvous through the proxy."""
    secret = make_secret()
    with RendezvousServer(2, secret, host="127.0.0.1") as server:
        proxy = RendezvousProxy(server.port, tamper)
        env = _meet_at(proxy.port, secret, HPCDL_TIMEOUT="8")
        ranks = [_start_rank(r, 2, **env) for r in started]
        try:
            yield proxy, ranks
        finally:
            for proc in ranks:
                proc.kill()
                proc.wait()
            proxy.close()


def _is_table(frame: bytes) -> bool:
    return b"\nnonce=" in frame


def test_a_rendezvous_table_altered_on_the_way_is_refused() -> None:
    """The proxy sends rank 0 a table in which rank 1 lives at another address (one character changed)."""

    def redirect(rank: int, frame: bytes) -> bytes:
        if rank != 0 or not _is_table(frame):
            return frame
        at = frame.index(b"127.0.0.1", frame.index(b"\npeer=1\t"))
        return frame[:at] + b"127.0.0.2" + frame[at + 9 :]

    with _job_behind_proxy(redirect) as (_, (rank0, _rank1)):
        name, message, seconds = _result(rank0)
    assert name == "HpcdlAuthError" and "failed its integrity check" in message, message
    assert seconds < 8  # refused on arrival, not at the deadline


def test_a_rendezvous_table_replayed_from_another_connection_is_refused() -> None:
    """The proxy passes rank 0 the table the server sent rank 1: a valid frame, but of another session."""
    proxies: list[RendezvousProxy] = []

    def replay(rank: int, frame: bytes) -> bytes:
        return proxies[0].table_of(1) if rank == 0 and _is_table(frame) else frame

    with _job_behind_proxy(replay) as (proxy, (rank0, _rank1)):
        proxies.append(proxy)
        name, message, _ = _result(rank0)
    assert name == "HpcdlAuthError" and "failed its integrity check" in message, message


def test_a_frame_replayed_within_the_connection_is_refused() -> None:
    """Frames are numbered: rank 0, waiting alone, gets its first progress report twice."""

    def repeat(rank: int, frame: bytes) -> bytes:
        return frame + frame if b"progress=" in frame else frame

    with _job_behind_proxy(repeat, started=(0,)) as (_, (rank0,)):
        name, message, seconds = _result(rank0)
    assert name == "HpcdlAuthError" and "failed its integrity check" in message, message
    assert seconds < 8


# ---- an authenticated rendezvous that sends a table no rank can use -------------------------------
def _serve_one_table(secret: str, table: Callable[[str], bytes]) -> tuple[int, threading.Thread]:
    """A one-shot server that knows the secret and answers the first registration with `table(seen)`."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener, contextlib.closing(listener.accept()[0]) as conn:
            handshake = ServerHandshake(secret.encode())
            conn.sendall(handshake.challenge)
            message = _recv_exactly(conn, 76)
            message += _recv_exactly(conn, (handshake.needed(message) or 0) - len(message))
            reply, header, session = handshake.finish(message)
            conn.sendall(reply)
            assert session is not None and header is not None
            conn.sendall(session.seal(table(conn.getpeername()[0])))
            with contextlib.suppress(OSError):
                conn.recv(1)  # until the rank hangs up

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ("size=2\nnonce={n}\nvia=127.0.0.1\nlocal=1\npeer=0\th\t127.0.0.1\t1\t1\t\npeer=0\th\t127.0.0.1\t2\t1\t\n",
         "repeated or out-of-range rank"),
        ("size=2\nnonce={n}\nvia=127.0.0.1\nlocal=1\npeer=0\th\t127.0.0.1\t1\t1\t\npeer=7\th\t127.0.0.1\t2\t1\t\n",
         "repeated or out-of-range rank"),
        ("size=2\nnonce={n}\nvia=127.0.0.1\nlocal=1\npeer=0\th\t127.0.0.1\t1\t1\t\npeer=1\th\t127.0.0.1\t0\t1\t\n",
         "unusable entry for rank 1"),
        ("size=2\nnonce={n}\nvia=127.0.0.1\nlocal=1\npeer=0\th\t127.0.0.1\t1\t1\t\n", "1 of the 2 ranks"),
        ("size=2\nvia=127.0.0.1\nlocal=1\npeer=0\th\t127.0.0.1\t1\t1\t\npeer=1\th\t127.0.0.1\t2\t1\t\n",
         "no round nonce"),
        ("size=3\nnonce={n}\nvia=127.0.0.1\nlocal=1\npeer=0\th\t127.0.0.1\t1\t1\t\n", "a job of '3' ranks"),
    ],
)  # fmt: skip
def test_a_table_no_rank_can_use_is_a_clear_error(table: str, says: str) -> None:
    secret = make_secret()
    port, server = _serve_one_table(secret, lambda _seen: table.replace("{n}", "ab" * 32).encode())
    rank = _start_rank(1, 2, **_meet_at(port, secret, HPCDL_TIMEOUT="20"))
    name, message, seconds = _result(rank)
    server.join(timeout=10)
    assert name == "HpcdlConfigError" and "the rendezvous sent a table this rank cannot use" in message
    assert says in message and seconds < 10, message
