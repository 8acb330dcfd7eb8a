"""What the multi-host tests run on their hosts and how they read it: a rank that allreduces and reports
where it ran (REPORT), the check of a job's spread over hosts, and another program holding ports."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from virtual_hosts import VirtualHosts

REPORT = r"""
import json, socket, sys
import numpy as np
import hpcdl.common as hc
hc.init()
x = np.full(1 << 18, hc.rank() + 1.0, dtype=np.float32)  # beyond the small-message size
hc.allreduce(x, out=x)
report = json.dumps({
    "rank": hc.rank(), "size": hc.size(), "host": socket.gethostname(),
    "local_rank": hc.local_rank(), "local_size": hc.local_size(),
    "cross_rank": hc.cross_rank(), "cross_size": hc.cross_size(),
    "sum": float(x[0]), "uniform": bool((x == x[0]).all()),
    "local": hc.transport_name(True), "cross": hc.transport_name(False),
})
sys.stdout.write(report + "\n")  # one write: ranks sharing a pipe never interleave within a line
sys.stdout.flush()
hc.shutdown()
"""


def write_report(directory: Path) -> Path:
    """REPORT as a script in `directory`."""
    script = directory / "report.py"
    script.write_text(REPORT)
    return script


def reports(output: str) -> dict[int, dict]:
    """The JSON report of every rank in `output` (lines may carry a launcher's "[r]<stdout>:" tag)."""
    found = {}
    for line in output.splitlines():
        start = line.find("{")
        if start >= 0:
            report = json.loads(line[start:])
            found[report["rank"]] = report
    return found


def assert_spread(found: dict[int, dict], hostnames: Sequence[str], per_host: int) -> None:
    """`per_host` ranks on each of `hostnames`, in blocks, that summed over the hosts by TCP and within each
    host by shared memory (by TCP alone with one rank per host)."""
    size = len(hostnames) * per_host
    assert sorted(found) == list(range(size)), found
    for rank, report in found.items():
        assert report["host"] == hostnames[rank // per_host], report
        assert (report["local_rank"], report["local_size"]) == (rank % per_host, per_host), report
        assert (report["cross_rank"], report["cross_size"]) == (rank // per_host, len(hostnames)), report
        assert report["sum"] == size * (size + 1) / 2 and report["uniform"], report
        assert report["local"] == ("shm" if per_host > 1 else "self") and report["cross"] == "tcp", report


# Holds ports like another program of the host would: the first stays silent, the others speak another
# protocol. Prints "ready" once it listens.
OCCUPY = r"""
import socket, sys, threading, time
ports = [int(p) for p in sys.argv[1:]]
listeners = []
for port in ports:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT does not block it
    s.bind(("0.0.0.0", port))
    s.listen(16)
    listeners.append(s)

def serve(s, silent):
    while True:
        c, _ = s.accept()
        if not silent:
            c.sendall(b"SSH-2.0-OpenSSH_9.2 not hpcdl\r\n")
        threading.Thread(target=lambda c=c: (time.sleep(600), c.close()), daemon=True).start()

for i, s in enumerate(listeners):
    threading.Thread(target=serve, args=(s, i == 0), daemon=True).start()
print("ready", flush=True)
time.sleep(600)
"""


def occupy(hosts: VirtualHosts, host: str, ports: Sequence[int]) -> subprocess.Popen:
    """Another program on `host` holding `ports` (stopped with the hosts)."""
    process = hosts.popen(host, [sys.executable, "-c", OCCUPY, *map(str, ports)], stdout=subprocess.PIPE,
                          text=True)  # fmt: skip
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process
