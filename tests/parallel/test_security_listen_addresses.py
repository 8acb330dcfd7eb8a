"""Where the rendezvous servers of ``hpcdl run`` and of a batch script listen: on the address the ranks are
given, not on every interface (anyone who can reach another of the host's addresses need not be able to
reach the job). Each server is read from /proc/net/tcp while it runs, real processes."""

from __future__ import annotations

import signal
import subprocess
import sys

from runner_helpers import clean_env, hpcdl_run

SECRET = "5c" * 32

# Prints the addresses something listens on at the job's rendezvous port, from inside a rank of the job.
LISTENING = """
import os, socket
port = int(os.environ["HPCDL_RENDEZVOUS_PORT"])
found = set()
for line in open("/proc/net/tcp").read().splitlines()[1:]:
    local, state = line.split()[1], line.split()[3]
    address, _, hex_port = local.partition(":")
    if state == "0A" and int(hex_port, 16) == port:
        found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
print("LISTENING", os.environ["HPCDL_RENDEZVOUS_ADDR"], *sorted(found))
"""


def test_hpcdl_run_hosts_its_rendezvous_on_the_ranks_address_only() -> None:
    done, _ = hpcdl_run("-np", "1", sys.executable, "-c", LISTENING)
    assert done.returncode == 0, done.stderr
    listening = [line.split("LISTENING ", 1)[1] for line in done.stdout.splitlines() if "LISTENING " in line]
    assert listening == ["127.0.0.1 127.0.0.1"]  # a job on this host only: loopback, not 0.0.0.0


def test_a_batch_scripts_rendezvous_listens_on_the_address_it_announces() -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "hpcdl.runner.batch_rendezvous", "--size", "2"],
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(HPCDL_SECRET=SECRET, HPCDL_IFACE="lo"),
    )
    try:
        assert server.stdout is not None
        addr, port = server.stdout.readline().split()[:2]
        probe = subprocess.run(
            [sys.executable, "-c", LISTENING],
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(HPCDL_RENDEZVOUS_PORT=port, HPCDL_RENDEZVOUS_ADDR=addr),
        )
        assert probe.stdout.split() == ["LISTENING", "127.0.0.1", "127.0.0.1"], probe.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=10) == 0
