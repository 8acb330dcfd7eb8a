"""Attacks on the elastic driver of a real ``hpcdl run --min-np/--max-np`` job, from a process that can
connect to its port but does not hold the job's secret: a 1 MB line, 250 idle connections, a wrong MAC and
a replayed request; and a look at what a worker's request puts on the wire (the secret must not be in it).
The job's one worker waits at a gate (a file the test creates) before it asks the driver for its round, so
the attacks run while the driver serves."""

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
from collections.abc import Iterator
from pathlib import Path

WORKER = """
import json, os, sys, time
gate, proxy_file, secret_file = sys.argv[1], sys.argv[2], sys.argv[3]
with open(secret_file, "w") as out:  # for the test to look for it on the wire
    out.write(os.environ["HPCDL_SECRET"])
print("DRIVER " + os.environ["HPCDL_ELASTIC_DRIVER"], flush=True)
deadline = time.monotonic() + 120
while not os.path.exists(gate) and time.monotonic() < deadline:
    time.sleep(0.05)
if os.path.exists(proxy_file):  # ask through the test's recording relay
    os.environ["HPCDL_ELASTIC_DRIVER"] = open(proxy_file).read().strip()
import numpy as np, hpcdl.common as hc
hc.init()
print("RESULT " + json.dumps([hc.rank(), hc.size(), float(hc.allreduce(np.ones(1))[0])]), flush=True)
while not os.path.exists(gate + ".done") and time.monotonic() < deadline:  # the driver serves meanwhile
    time.sleep(0.05)
"""


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no thread count for {pid}")


class _Job:
    """A running elastic job of one worker that waits at a gate, then joins its round, then waits until
    the test is done with the driver."""

    def __init__(self, launcher: subprocess.Popen, driver: tuple[str, int], files: Path) -> None:
        self.launcher, self.driver = launcher, driver
        self.gate, self.proxy_file, self.secret_file = files / "gate", files / "proxy", files / "secret"
        self.stdout = ""

    def joined(self) -> list:
        """Opens the gate and waits for the worker's RESULT: its rank, the round's size and an allreduce."""
        assert self.launcher.stdout is not None
        self.gate.touch()
        while "RESULT " not in self.stdout:
            line = self.launcher.stdout.readline()
            assert line, f"the worker ended without a result: {self.stdout}"
            self.stdout += line
        return _result(self.stdout)

    def finish(self) -> str:
        """Lets the job end; its stderr (it must succeed)."""
        (self.gate.parent / "gate.done").touch()
        stdout, stderr = self.launcher.communicate(timeout=120)
        self.stdout += stdout
        assert self.launcher.returncode == 0, self.stdout + stderr
        return stderr


@contextlib.contextmanager
def _elastic_job(tmp_path: Path) -> Iterator[_Job]:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    gate = tmp_path / "gate"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCDL_RANK", "HPCDL_SIZE", "SLURM_"))}
    argv = [sys.executable, "-m", "hpcdl", "run", "-np", "1", "--min-np", "1", "--max-np", "1"]
    files = [str(tmp_path / name) for name in ("gate", "proxy", "secret")]
    launcher = subprocess.Popen(
        [*argv, sys.executable, str(worker), *files],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert launcher.stdout is not None
        line = ""
        while "DRIVER " not in line:
            line = launcher.stdout.readline()
            assert line, (
                f"the worker never printed its driver: {launcher.stderr.read() if launcher.stderr else ''}"
            )
        host, _, port = line.split("DRIVER ", 1)[1].strip().rpartition(":")
        job = _Job(launcher, (host, int(port)), tmp_path)
        yield job
    finally:
        gate.touch()
        (tmp_path / "gate.done").touch()
        with contextlib.suppress(subprocess.TimeoutExpired):
            launcher.wait(timeout=60)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def _listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses something listens on at `port` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def _result(stdout: str) -> list:
    lines = [line.split("RESULT ", 1)[1] for line in stdout.splitlines() if "RESULT " in line]
    assert lines, stdout
    return json.loads(lines[-1])


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


def test_a_1_mb_line_is_dropped_at_once_and_the_job_goes_on(tmp_path: Path) -> None:
    with _elastic_job(tmp_path) as job:
        # a job on this host only: the driver listens on loopback, where its workers reach it, not everywhere
        assert _listening_addresses(job.driver[1]) == {"127.0.0.1"} == {job.driver[0]}
        flood = socket.create_connection(job.driver, timeout=10)
        with flood:
            with contextlib.suppress(OSError):  # the driver may close before it is all sent
                flood.sendall(b"x" * (1 << 20))
            assert _closed_within(flood, 3), "the driver kept reading a 1 MB line (waiting for its end)"
        assert job.joined() == [0, 1, 1.0]
        job.finish()


def test_250_idle_connections_take_no_thread_each_and_the_worker_still_gets_its_round(tmp_path: Path) -> None:
    with _elastic_job(tmp_path) as job:
        before = _threads(job.launcher.pid)
        idle = [socket.create_connection(job.driver, timeout=10) for _ in range(250)]
        try:
            time.sleep(0.5)
            during = _threads(job.launcher.pid)
            assert during <= before + 4, f"{during} threads with 250 idle connections open, {before} before"
            started = time.monotonic()
            assert job.joined() == [0, 1, 1.0]  # the worker's own request goes through while they are open
            assert time.monotonic() - started < 30
        finally:
            for sock in idle:
                sock.close()
        job.finish()


def _handshake(driver: tuple[str, int], secret: bytes, header: bytes) -> tuple[bytes, bytes]:
    """A client's side of the handshake with `secret`; returns (what was sent, the 32-byte reply)."""
    with socket.create_connection(driver, timeout=5) as sock:
        challenge = sock.recv(40, socket.MSG_WAITALL)
        nonce = secrets.token_bytes(32)
        mac = hmac.new(secret, b"client" + challenge[8:] + nonce + header, hashlib.sha256).digest()
        sent = b"HPCDLAU1" + nonce + mac + struct.pack("<I", len(header)) + header
        sock.sendall(sent)
        reply = sock.recv(32, socket.MSG_WAITALL)
        rest = sock.recv(64)
    assert rest == b"", "the driver answered a client that did not prove the secret"
    return sent, reply


def test_a_wrong_mac_is_refused_and_answers_nothing(tmp_path: Path) -> None:
    header = json.dumps({"op": "assign", "after": 0, "worker": 0}).encode()
    with _elastic_job(tmp_path) as job:
        _, reply = _handshake(job.driver, secrets.token_hex(32).encode(), header)
        assert reply == b"HPCDL refuses: wrong job secret\0"
        assert job.joined() == [0, 1, 1.0]
        job.finish()


class _Relay:
    """Passes a worker's connections on to the driver and keeps every byte the worker sent."""

    def __init__(self, driver: tuple[str, int]) -> None:
        self.driver = driver
        self.sent = bytearray()
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.driver)
                threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
                threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if record:
                    self.sent += data
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def test_the_secret_never_travels_and_a_replayed_request_is_refused(tmp_path: Path) -> None:
    with _elastic_job(tmp_path) as job:
        relay = _Relay(job.driver)
        job.proxy_file.write_text(relay.address)
        assert job.joined() == [0, 1, 1.0]
        sent, secret = bytes(relay.sent), job.secret_file.read_text()
        assert len(secret) == 64 and secret.encode() not in sent and bytes.fromhex(secret) not in sent
        assert sent.startswith(b"HPCDLAU1"), sent[:80]
        (length,) = struct.unpack_from("<I", sent, 72)
        recorded = sent[: 76 + length]  # the worker's first answer to a challenge, with its request
        with socket.create_connection(job.driver, timeout=5) as sock:
            sock.recv(40, socket.MSG_WAITALL)
            sock.sendall(recorded)
            assert sock.recv(32, socket.MSG_WAITALL) == b"HPCDL refuses: wrong job secret\0"
            assert sock.recv(64) == b""
        relay.listener.close()
        job.finish()
