"""Which hosts are this machine, and which address of this machine other hosts can reach (an interface's
address is looked up by the rank agent's :func:`~hpcdl.runner.rank_agent.ipv4_of`, which runs where hpcdl
is not installed)."""

from __future__ import annotations

import ipaddress
import socket

from hpcdl.runner.errors import LaunchError
from hpcdl.runner.rank_agent import ipv4_of


def resolve(host: str) -> list[str]:
    """IPv4 addresses of `host`; a clear error when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise LaunchError(
            f"host '{host}' does not resolve ({exc.strerror}); check the name in -H / the hostfile "
            "or add it to /etc/hosts"
        ) from None
    return sorted({str(info[4][0]) for info in infos})


def is_local_host(host: str) -> bool:
    """True when `host` is this machine: a loopback address or one bound to a local interface."""
    if host in ("localhost", socket.gethostname()):
        return True
    for addr in resolve(host):
        if ipaddress.ip_address(addr).is_loopback:
            return True
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind((addr, 0))
            except OSError:
                continue
            return True
    return False


def interface_address(iface: str) -> str:
    """IPv4 address of network interface `iface` (an IPv4 address is returned as it is)."""
    try:
        return str(ipaddress.IPv4Address(iface))
    except ValueError:
        pass
    address = ipv4_of(iface)
    if address is None:
        names = ", ".join(name for _, name in socket.if_nameindex())
        raise LaunchError(
            f"--network-interface {iface}: no such interface with an IPv4 address here; have: {names}"
        )
    return address


def address_towards(host: str) -> str:
    """The local address the kernel would use to reach `host` (no packet is sent)."""
    target = resolve(host)[0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((target, 9))
        except OSError as exc:
            raise LaunchError(f"no route from this machine to {host} ({target}): {exc.strerror}") from None
        return str(sock.getsockname()[0])
