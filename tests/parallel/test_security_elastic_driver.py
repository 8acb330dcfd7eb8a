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
import resource
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from hpcdl.common import handshake

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
        self.stdout = self.stderr = ""
        self._result = threading.Event()
        self._readers = [
            threading.Thread(target=self._read, args=(name,), daemon=True) for name in ("stdout", "stderr")
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, name: str) -> None:
        for line in getattr(self.launcher, name):
            setattr(self, name, getattr(self, name) + line)
            if "RESULT " in line:
                self._result.set()

    def joined(self, within: float = 120) -> list:
        """Opens the gate and waits (up to `within` s) for the worker's RESULT: its rank, the round's size
        and an allreduce."""
        self.gate.touch()
        assert self._result.wait(within), f"no result from the worker within {within} s: {self.stdout}"
        return _result(self.stdout)

    def finish(self) -> str:
        """Lets the job end; its stderr (it must succeed)."""
        (self.gate.parent / "gate.done").touch()
        self.launcher.wait(timeout=120)
        for reader in self._readers:
            reader.join(timeout=10)
        assert self.launcher.returncode == 0, self.stdout + self.stderr
        return self.stderr


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


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its socket descriptors matched in /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:
            ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


def _cpu_seconds(pid: int) -> float:
    """CPU time (user and system, every thread) process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_share_over(pid: int, seconds: float) -> float:
    """The share of one core process `pid` uses over the next `seconds` (a measurement, not a wait)."""
    before, started = _cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (_cpu_seconds(pid) - before) / (time.monotonic() - started)


def _open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _flood(ports: set[int], each: int) -> list[socket.socket]:
    """`each` idle connections to every port (the kernel queues them even when nobody accepts)."""
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(each) for port in ports]


def test_a_flood_with_few_descriptors_left_neither_stops_the_job_nor_spins(tmp_path: Path) -> None:
    """The launcher's descriptor limit lowered to what it has open plus 64, then to what it has open: idle
    connections at the elastic driver and at the round's rendezvous (both in the launcher) make neither stop
    accepting for good nor spin on a listen socket it cannot accept from; the job's worker joins its round
    while the flood lasts, both answer once it is over, and each reports running short once."""
    flood: list[socket.socket] = []
    with _elastic_job(tmp_path) as job:
        pid = job.launcher.pid
        ports = _listening_ports(pid)  # the driver's and the round's rendezvous
        assert job.driver[1] in ports and len(ports) == 2, ports
        _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        try:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (_open_descriptors(pid) + 64, hard))
            flood += _flood(ports, 150)
            assert _cpu_share_over(pid, 1.5) < 0.25
            assert job.joined(within=30) == [0, 1, 1.0]  # through the driver and the rendezvous
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (_open_descriptors(pid), hard))
            flood += _flood(ports, 50)  # no descriptor left for any of them
            assert _cpu_share_over(pid, 1.5) < 0.25
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (4096, hard))
            for sock in flood:
                sock.close()
        secret = job.secret_file.read_text()
        assert handshake.request(job.driver, secret, {"op": "round"}, 10, "the driver") == {"round": 1}
        rendezvous_port = (ports - {job.driver[1]}).pop()
        with socket.create_connection(("127.0.0.1", rendezvous_port), timeout=5) as sock:
            assert sock.recv(40, socket.MSG_WAITALL).startswith(b"HPCDLAU1")  # its challenge: it accepts
        stderr = job.finish()
    assert stderr.count("the elastic driver on port") == 2, stderr  # short of descriptors, then out of them
    assert stderr.count(f"the listener on port {rendezvous_port}") == 2, stderr
    assert "cannot accept a connection (Too many open files" in stderr
