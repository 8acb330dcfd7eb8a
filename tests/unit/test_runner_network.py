"""Which hosts are this machine and which local address other hosts reach (real sockets, no traffic)."""

from __future__ import annotations

import socket

import pytest

from hpcdl.runner.errors import LaunchError
from hpcdl.runner.network import address_towards, interface_address, is_local_host, resolve


def test_this_machine_is_local() -> None:
    assert is_local_host("localhost")
    assert is_local_host("127.0.0.1")
    assert is_local_host(socket.gethostname())


def test_other_addresses_are_remote() -> None:
    assert not is_local_host("198.51.100.7")  # TEST-NET-2: never bound here


def test_interface_address() -> None:
    assert interface_address("lo") == "127.0.0.1"
    assert interface_address("10.1.2.3") == "10.1.2.3"
    with pytest.raises(LaunchError, match=r"no such interface with an IPv4 address here; have: .*lo"):
        interface_address("nosuchnic0")


def test_address_towards_loopback() -> None:
    assert address_towards("127.0.0.1") == "127.0.0.1"


def test_unresolvable_host() -> None:
    with pytest.raises(LaunchError, match=r"host .no-such-host\.invalid. does not resolve"):
        resolve("no-such-host.invalid")
