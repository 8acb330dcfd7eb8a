"""What the benchmarks share: launching themselves on N ranks (on other hosts too), reading back what the
ranks print, telling every rank what rank 0 knows, and showing how far they are (rank 0 prints ``PROGRESS
done total`` lines; the launcher draws a bar on a terminal, see ``hpcdl.common.progress``)."""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import threading
from typing import Optional

import numpy as np

from hpcdl.common import progress

OPENMPI = "/usr/bin/mpirun.openmpi"
# Open MPI across hosts, tuned (benchmarks/README.md): TCP between hosts and shared memory within one (not its
# libfabric BTL), a 4 MiB receive buffer (Linux's default sizes cut 1-16 MiB allreduces 5-10x) and a 128 KiB
# send buffer (4-64 MiB allreduces 1.6-2.7x faster than with 4 MiB, and ahead of 256 KiB and of autotuning).
OPENMPI_ACROSS_HOSTS = ["--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_sndbuf", "131072"]
OPENMPI_ACROSS_HOSTS += ["--mca", "btl_tcp_rcvbuf", "4194304"]
PROGRESS = "PROGRESS"
DEFAULT_TIMEOUT_S = 3600.0
NO_PROGRESS_HELP = progress.NO_PROGRESS_HELP
# mpirun may cut a rank's long line and tag each piece: the tags are dropped from what the ranks print.
_TAG = re.compile(r"\[\d+(?:,\d+)?\]<std(?:out|err)>:")


def add_gpu_operations_option(parser: argparse.ArgumentParser) -> None:
    """``--gpu-operations`` of the GPU benchmarks; :func:`use_gpu_operations` applies it."""
    parser.add_argument(
        "--gpu-operations",
        choices=("auto", "nccl", "gloo-standin"),
        default="auto",
        help="nccl (CUDA tensors), gloo-standin (CPU tensors, gloo in place of NCCL) or auto: nccl when "
        "this PyTorch has NCCL and a GPU is visible",
    )


def use_gpu_operations(mode: str) -> None:
    """Have the ranks this process launches run their GPU operations as ``mode`` says (``auto`` resolved
    here, where the GPUs are visible)."""
    if mode == "auto":
        import torch

        nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
        mode = "nccl" if nccl and torch.cuda.is_available() else "gloo-standin"
    os.environ["HPCDL_GPU_OPERATIONS"] = mode


def slots_per_host(parser: argparse.ArgumentParser, hosts: Optional[str]) -> list[int]:
    """The ranks on each host of a ``--hosts`` list (``hpcdl run -H`` syntax, read as ``hpcdl run`` reads
    it: a host without ``:N`` has one, a repeated host adds up); none without one. A list ``hpcdl run``
    would refuse is a usage error of `parser`, naming the entry."""
    from hpcdl.runner.errors import LaunchError
    from hpcdl.runner.hosts import parse_hosts_arg

    if not hosts:
        return []
    try:
        return [host.slots for host in parse_hosts_arg(hosts)]
    except LaunchError as exc:
        parser.error(str(exc))


def free_port() -> int:
    """A TCP port that is free on every interface of this host now."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def broadcast_text(text: str) -> str:
    """Rank 0's `text` (up to 255 bytes) on every rank, over hpcdl (initialised)."""
    import hpcdl.common as hc

    raw = np.zeros(256, dtype=np.uint8)
    data = text.encode()[:255]
    raw[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    hc.broadcast(raw, root=0)
    return bytes(raw).rstrip(b"\0").decode()


def report_progress(done: int, total: int) -> None:
    """Tell the launcher (from rank 0 of a worker) that ``done`` of ``total`` units are measured."""
    print(f"{PROGRESS} {done} {total}", flush=True)


def _progress_of(line: str) -> tuple[int, int] | None:
    at = line.find(PROGRESS + " ")
    if at < 0:
        return None
    fields = line[at + len(PROGRESS) + 1 :].split()
    if len(fields) != 2 or not all(f.isdigit() for f in fields):
        return None
    return int(fields[0]), int(fields[1])


def run_ranks(
    script: str,
    ranks: int,
    args: list[str],
    marker: str,
    use_mpi: bool = False,
    no_progress: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    hosts: str | None = None,
    mpi_args: str = "",
) -> list[str]:
    """Run ``python SCRIPT ARGS`` on `ranks` ranks with ``hpcdl run`` (through Open MPI's mpirun when
    `use_mpi`, so that mpi4py runs in the same job) and return the texts the ranks printed after
    ``MARKER ``, with a progress bar fed by the ranks' PROGRESS lines; `hosts` (``-H`` syntax) places the
    ranks on other hosts, `mpi_args` adds to mpirun's arguments. Exits with the ranks' output when
    they failed, printed no such line, or ran past `timeout` seconds."""
    command = [sys.executable, "-m", "hpcdl", "run"]
    if use_mpi:
        command += [
            "--mpi",
            "--mpirun",
            OPENMPI,
            "--mpi-args",
            # One host runs more ranks than mpirun counts slots; across hosts the slots are given, and
            # --oversubscribe makes Open MPI yield the core in every wait (4-byte allreduce: 90 us, not 7).
            f"--allow-run-as-root {'' if hosts else '--oversubscribe '}--bind-to none {mpi_args}".strip(),
        ]
    if hosts:
        command += ["-H", hosts]
    command += ["-np", str(ranks), sys.executable, os.path.abspath(script), *args]
    env = dict(os.environ)
    if not hosts:  # one host: Open MPI's TCP stays on loopback
        env.setdefault("OMPI_MCA_btl_tcp_if_include", "lo")
        env.setdefault("OMPI_MCA_oob_tcp_if_include", "lo")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    timed_out = threading.Event()

    def stop() -> None:
        timed_out.set()
        process.kill()

    watchdog = threading.Timer(timeout, stop)
    watchdog.start()
    lines, found = [], []
    name = os.path.basename(script).removesuffix(".py")
    try:
        with progress.bar(f"{name} -np {ranks}", None, no_progress=no_progress) as bar:
            for line in process.stdout:  # type: ignore[union-attr]
                lines.append(line)
                at = line.find(marker + " {")
                if at >= 0:
                    found.append(_TAG.sub("", line[at + len(marker) + 1 :]).rstrip("\n"))
                step = _progress_of(line)
                if step is not None:
                    bar.update(completed=step[0], total=step[1])
            code = process.wait()
    finally:
        watchdog.cancel()
    reader.join()
    if found and code == 0:
        return found
    why = f"stopped after {timeout:.0f} s" if timed_out.is_set() else f"exit {code}"
    sys.exit(
        f"hpcdl run -np {ranks} {os.path.basename(script)} failed ({why}):\n"
        f"{''.join(lines)[-4000:]}\n{''.join(errors)[-4000:]}"
    )
