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


# ---- torch.distributed's interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME) ----------------------------


def _other_interface() -> str | None:
    """An interface of this machine with an IPv4 address other than the loopback, or None."""
    from hpcdl.runner.rank_agent import ipv4_of

    return next(
        (name for _, name in socket.if_nameindex() if name != "lo" and ipv4_of(name) is not None), None
    )


LOOPBACK = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"HPCDL_RENDEZVOUS_ADDR": "127.0.0.1"}, LOOPBACK),
        ({"HPCDL_ELASTIC_DRIVER": "127.0.0.1:4242"}, LOOPBACK),
        ({"MASTER_ADDR": "localhost"}, LOOPBACK),
        ({"HPCDL_IFACE": "127.0.0.1", "HPCDL_RENDEZVOUS_ADDR": "10.0.0.1"}, LOOPBACK),
        ({"HPCDL_RENDEZVOUS_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "ib0"}, {"NCCL_SOCKET_IFNAME": "lo"}),
        ({"HPCDL_RENDEZVOUS_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "a", "NCCL_SOCKET_IFNAME": "b"}, {}),
        ({"HPCDL_RENDEZVOUS_ADDR": "no-such-host.invalid"}, {}),
        ({}, {}),
    ],
)  # fmt: skip
def test_a_rank_gets_its_hosts_interface_towards_the_rendezvous_unless_set(
    env: dict[str, str], expected: dict[str, str]
) -> None:
    from hpcdl.runner.rank_agent import socket_interface_env

    assert socket_interface_env(env) == expected


def test_a_rank_uses_the_interface_hpcdl_iface_names_when_its_host_has_it() -> None:
    from hpcdl.runner.rank_agent import socket_interface_env

    other = _other_interface()
    if other is None:
        pytest.skip("this machine has no interface with an IPv4 address besides the loopback")
    env = {"HPCDL_IFACE": other, "HPCDL_RENDEZVOUS_ADDR": "127.0.0.1"}
    assert socket_interface_env(env) == {"GLOO_SOCKET_IFNAME": other, "NCCL_SOCKET_IFNAME": other}
    env = {"HPCDL_IFACE": "nosuch0", "HPCDL_RENDEZVOUS_ADDR": "127.0.0.1"}  # not on this host: the route's
    assert socket_interface_env(env)["GLOO_SOCKET_IFNAME"] == "lo"
