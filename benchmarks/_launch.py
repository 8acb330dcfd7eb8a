"""What the benchmarks share: launching themselves on N ranks and reading back what the ranks print."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

OPENMPI = "/usr/bin/mpirun.openmpi"
# mpirun may cut a rank's long line and tag each piece: the tags are dropped from what the ranks print.
_TAG = re.compile(r"\[\d+(?:,\d+)?\]<std(?:out|err)>:")


def free_port() -> int:
    """A TCP port that is free on every interface of this host now."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def run_ranks(script: str, ranks: int, args: list[str], marker: str, use_mpi: bool = False) -> list[str]:
    """Run ``python SCRIPT ARGS`` on `ranks` ranks with ``hpcdl run`` (through Open MPI's mpirun when
    `use_mpi`, so that mpi4py runs in the same job) and return the texts the ranks printed after
    ``MARKER ``. Exits with the ranks' output when they failed or printed no such line."""
    command = [sys.executable, "-m", "hpcdl", "run"]
    if use_mpi:
        command += [
            "--mpi",
            "--mpirun",
            OPENMPI,
            "--mpi-args",
            "--allow-run-as-root --oversubscribe --bind-to none",
        ]
    command += ["-np", str(ranks), sys.executable, os.path.abspath(script), *args]
    env = dict(os.environ)
    env.setdefault("OMPI_MCA_btl_tcp_if_include", "lo")
    env.setdefault("OMPI_MCA_oob_tcp_if_include", "lo")
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    found = []
    for line in done.stdout.splitlines():
        at = line.find(marker + " {")
        if at >= 0:
            found.append(_TAG.sub("", line[at + len(marker) + 1 :]))
    if found and done.returncode == 0:
        return found
    sys.exit(
        f"hpcdl run -np {ranks} {os.path.basename(script)} failed (exit {done.returncode}):\n"
        f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
