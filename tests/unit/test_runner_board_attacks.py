"""Attacks on the launcher's board (``hpcdl.runner.board``, through which rank 0 publishes MASTER_PORT when it
runs on another host than ``hpcdl run``), from a process that can reach its port but does not hold the job's
secret: a wrong MAC, a 1 MB line, 250 idle connections; and a rank agent run from its source by a Python
without hpcdl (a remote host) that proves the secret to it without sending it. Real sockets and processes."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import hpcdl.runner.rank_agent as rank_agent
from hpcdl.common import handshake
from hpcdl.common.rendezvous import make_secret
from hpcdl.runner.board import BoardServer
from hpcdl.runner.rank_agent import learn_master_port

SECRET = make_secret()


@pytest.fixture
def board() -> Iterator[BoardServer]:
    server = BoardServer(SECRET, "127.0.0.1", 4)
    yield server
    server.stop()


def _threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count in /proc/self/status")


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the other side closes `sock` within `seconds` (reading and discarding what it sends)."""
    sock.settimeout(seconds)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if not sock.recv(4096):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def _run_agent(spec: dict) -> subprocess.CompletedProcess:
    """The rank agent started as ``hpcdl run`` starts it, in a Python that cannot import hpcdl; its stdin
    (the end of which stops the rank) stays open until the rank has ended."""
    agent = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", Path(rank_agent.__file__).read_text()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    assert agent.stdin is not None and agent.stderr is not None
    try:
        agent.stdin.write(json.dumps(spec) + "\n")
        agent.stdin.flush()
        stderr = ""
        while f"{spec['token']} exit" not in stderr:
            line = agent.stderr.readline()
            if not line:
                break
            stderr += line
        stdout, rest = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    return subprocess.CompletedProcess(agent.args, agent.returncode, stdout, stderr + rest)


def test_the_board_listens_only_where_the_ranks_are_told_to_reach_it(board: BoardServer) -> None:
    listening = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, port = local.partition(":")
        if state == "0A" and int(port, 16) == board.port:
            listening.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    assert listening == {"127.0.0.1"}


def test_a_wrong_mac_is_refused_and_nothing_is_published(board: BoardServer) -> None:
    header = json.dumps({"op": "put", "key": "MASTER_PORT", "value": "1"}).encode()
    with socket.create_connection(("127.0.0.1", board.port), timeout=5) as sock:
        challenge = sock.recv(40, socket.MSG_WAITALL)
        nonce = secrets.token_bytes(32)
        mac = hmac.new(make_secret().encode(), b"client" + challenge[8:] + nonce + header, hashlib.sha256)
        sock.sendall(b"HPCDLAU1" + nonce + mac.digest() + struct.pack("<I", len(header)) + header)
        assert sock.recv(32, socket.MSG_WAITALL) == b"HPCDL refuses: wrong job secret\0"
        assert sock.recv(64) == b"", "the board answered a client that did not prove the secret"
    assert board.board.get("MASTER_PORT", 0) is None


def test_the_secret_never_travels_in_a_request(board: BoardServer) -> None:
    """What a rank sends to the board is a nonce, a MAC and its request, never the secret itself."""
    sent = bytearray()
    real_sendall = socket.socket.sendall

    def recording_sendall(sock: socket.socket, data: bytes, *args: int) -> None:
        sent.extend(data)
        real_sendall(sock, data, *args)

    socket.socket.sendall = recording_sendall  # type: ignore[method-assign]
    try:
        holder, port = learn_master_port(f"127.0.0.1:{board.port}", SECRET, 0, 10)
    finally:
        socket.socket.sendall = real_sendall  # type: ignore[method-assign]
    assert holder is not None
    holder.close()
    assert board.board.get("MASTER_PORT", 0) == str(port)
    assert b'"MASTER_PORT"' in sent and SECRET.encode() not in sent and bytes.fromhex(SECRET) not in sent


def test_a_1_mb_line_is_dropped_at_its_first_bytes_and_ranks_still_meet(board: BoardServer) -> None:
    with socket.create_connection(("127.0.0.1", board.port), timeout=10) as flood:
        with contextlib.suppress(OSError):  # the board may close before it is all sent
            flood.sendall(b"x" * (1 << 20))
        assert _closed_within(flood, 3), "the board kept reading a 1 MB line (waiting for its end)"
    holder, port = learn_master_port(f"127.0.0.1:{board.port}", SECRET, 0, 10)
    assert holder is not None
    holder.close()
    assert learn_master_port(f"127.0.0.1:{board.port}", SECRET, 1, 10) == (None, port)


def test_250_idle_connections_take_no_thread_each_and_a_rank_still_gets_the_port(board: BoardServer) -> None:
    address = f"127.0.0.1:{board.port}"
    holder, port = learn_master_port(address, SECRET, 0, 10)  # the board's threads exist from here on
    assert holder is not None
    holder.close()
    before = _threads()
    idle = [socket.create_connection(("127.0.0.1", board.port), timeout=10) for _ in range(250)]
    try:
        time.sleep(0.5)
        during = _threads()
        assert during <= before + 4, f"{during} threads with 250 idle connections open, {before} before"
        started = time.monotonic()
        assert learn_master_port(address, SECRET, 1, 30) == (None, port)
        assert time.monotonic() - started < 10
    finally:
        for sock in idle:
            sock.close()


def _agent_spec(board: BoardServer, argv: list[str], secret: str) -> dict:
    """What ``hpcdl run`` hands the rank agent of rank 1: the command, the job's secret (here `secret`),
    the board to learn MASTER_PORT from, and the handshake's source to prove the secret with."""
    return {
        "argv": argv,
        "env": {"HPCDL_SECRET": secret},
        "cwd": "/",
        "token": "TOKEN",
        "rank": 1,
        "start_timeout": 20,
        "master_board": f"127.0.0.1:{board.port}",
        "board_client": Path(handshake.__file__).read_text(),
    }


def test_a_rank_agent_without_hpcdl_learns_the_port_through_the_handshake_source(board: BoardServer) -> None:
    """The rank agent as ``hpcdl run`` starts it on another host: ``python -c <its source>``, here in an
    interpreter that cannot import hpcdl (-I -S: no site-packages), given the handshake's source."""
    board.board.put("MASTER_PORT", "29511")
    check = "import os, importlib.util; print(os.environ['MASTER_PORT'], importlib.util.find_spec('hpcdl'))"
    agent = _run_agent(_agent_spec(board, [sys.executable, "-I", "-S", "-c", check], SECRET))
    assert agent.stdout.split() == ["29511", "None"], agent.stderr
    assert "TOKEN exit 0" in agent.stderr


def test_a_rank_agent_with_a_wrong_secret_says_so_and_starts_nothing(board: BoardServer) -> None:
    agent = _run_agent(_agent_spec(board, [sys.executable, "-c", "print('STARTED')"], make_secret()))
    assert "STARTED" not in agent.stdout
    assert "does not accept this job's secret" in agent.stderr and "TOKEN exit 1" in agent.stderr
