"""The rendezvous of a batch job, hosted by its own script:
``python -m hpcdl.runner.batch_rendezvous --size N [--master-port]`` (run by scripts of ``hpcdl submit``).

The script starts it in the background with HPCDL_SECRET in its environment. It starts the job's rendezvous
server on a port it binds itself (port 0), so nothing can take the port between choosing and binding it, as
``hpcdl run`` hosts its rendezvous; with ``--master-port`` it also holds a port for torch.distributed's rank
0 on this host (``rank_agent.reserve_port``). Then it writes one line on stdout,
``ADDR PORT MASTER_ADDR MASTER_PORT IFACE PID`` (one write; the script reads it before its launch line;
IFACE is this host's interface towards the ranks, for torch.distributed's GLOO/NCCL_SOCKET_IFNAME, or
``-``), and serves until the script's shell ends (it is then re-parented) or it gets SIGTERM. It never
writes to stdout again.
A port the user fixed in HPCDL_RENDEZVOUS_PORT (``--env``, a site file) is used instead of port 0. A failure
to start is one clear line on stderr (naming a fixed port that is taken) and exit status 1, and the script
then stops the job.

``--probe`` instead prints ``HOST PORT IFACE`` and exits: this host's name, a port free here, and the
interface towards HPCDL_RENDEZVOUS_ADDR (run on the first compute node where the script runs on a service
node).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping

from hpcdl import jobenv
from hpcdl.common.exceptions import HpcdlError
from hpcdl.runner.allocation import detect_allocation
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.network import address_towards, interface_address, is_local_host
from hpcdl.runner.rank_agent import meeting_interface, reserve_port

PARENT_POLL_SECONDS = 0.5


def advertised_address(environ: Mapping[str, str]) -> str:
    """The address the ranks reach this host at: HPCDL_IFACE's, else the one this host routes towards the
    first other host of the allocation, else (one node, or names that do not resolve here) its name."""
    if environ.get(jobenv.IFACE):
        return interface_address(environ[jobenv.IFACE])
    try:
        allocation = detect_allocation(environ)
    except LaunchError:
        allocation = None
    for host in allocation.hosts if allocation is not None else []:
        try:
            if not is_local_host(host.name):
                return address_towards(host.name)
        except LaunchError:
            continue
    return socket.gethostname()


def listen_address(advertised: str) -> str:
    """Where the server listens: the advertised address when it is one of this host's IPv4 addresses (the
    ranks are given it, so no other interface need be open), every interface when it is the host's name
    (which other hosts may resolve to another of its addresses than this host does)."""
    try:
        ipaddress.IPv4Address(advertised)
    except ValueError:
        return "0.0.0.0"
    return advertised


def socket_interface(environ: Mapping[str, str], address: str) -> str:
    """The interface the ranks' torch.distributed should use, as this host sees it (``-``: unknown)."""
    return (
        meeting_interface({jobenv.IFACE: environ.get(jobenv.IFACE, ""), jobenv.RENDEZVOUS_ADDR: address})
        or "-"
    )


def probe(environ: Mapping[str, str]) -> int:
    """``HOST PORT IFACE`` of this host (see the module's docstring)."""
    with socket.socket() as free:
        free.bind(("", 0))
        port = free.getsockname()[1]
    print(socket.gethostname(), port, socket_interface(environ, environ.get(jobenv.RENDEZVOUS_ADDR, "")))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hpcdl.runner.batch_rendezvous")
    parser.add_argument("--size", type=int, help="ranks of the job")
    parser.add_argument("--master-port", action="store_true", help="also hold MASTER_PORT on this host")
    parser.add_argument("--probe", action="store_true", help="print HOST PORT IFACE of this host and exit")
    return parser


def serve(args: argparse.Namespace) -> int:
    secret = os.environ.get(jobenv.SECRET, "")
    if not secret:
        print(f"hpcdl: the rendezvous server needs {jobenv.SECRET} in its environment", file=sys.stderr)
        return 1
    from hpcdl.common.rendezvous import RendezvousServer

    stopping: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda received, _frame: stopping.append(received))
    for signum in (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):  # the ranks' checkpoint signals
        signal.signal(signum, signal.SIG_IGN)
    parent = os.getppid()
    fixed = os.environ.get(jobenv.RENDEZVOUS_PORT, "")
    if fixed and not fixed.isdigit():
        print(f"hpcdl: {jobenv.RENDEZVOUS_PORT}={fixed!r} is not a port number", file=sys.stderr)
        return 1
    try:
        address = advertised_address(os.environ)
        server = RendezvousServer(args.size, secret, listen_address(address), int(fixed or 0))
        server.start()
    except (HpcdlError, OSError, ValueError) as exc:
        where = f"port {fixed} (your {jobenv.RENDEZVOUS_PORT}) on " if fixed else ""
        advice = "; choose another port or unset it to let the server pick a free one" if fixed else ""
        print(
            f"hpcdl: cannot host the job's rendezvous on {where}{socket.gethostname()}: {exc}{advice}",
            file=sys.stderr,
        )
        return 1
    holder = reserve_port() if args.master_port else None
    master = f"{address} {holder.getsockname()[1]}" if holder is not None else "- -"
    iface = socket_interface(os.environ, address)
    try:
        try:
            os.write(1, f"{address} {server.port} {master} {iface} {os.getpid()}\n".encode())
        except BrokenPipeError:
            print("hpcdl: the job script that started this rendezvous server is gone", file=sys.stderr)
            return 1
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # the script closes its end after reading the line
        while not stopping and os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
    finally:
        server.stop()
        if holder is not None:
            holder.close()
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.probe:
        return probe(os.environ)
    if args.size is None:
        _parser().error("--size N is required")
    return serve(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
