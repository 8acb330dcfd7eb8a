"""A second "host" beside this one for launcher tests: a virtual host (see :mod:`virtual_hosts`) with its
own hostname and sshd (root, key auth), on a subnet joined to this machine's namespace. The subnet is
claimed for as long as the host lives, so concurrent test runs never share one; everything is removed on
exit, also when a test fails half way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from virtual_hosts import VirtualHosts, missing_requirements

__all__ = ["FakeHost", "fake_host", "missing_requirements"]


@dataclass(frozen=True)
class FakeHost:
    hostname: str  # what `hostname` says inside
    address: str  # the host's address, reachable from here
    local_address: str  # this machine's address on the link
    namespace: str
    identity_file: Path
    ssh_config: Path
    ssh_port: int = 22

    def ssh_args(self) -> list[str]:
        """The ``hpcdl run`` flags that reach this host."""
        return [
            "-p",
            str(self.ssh_port),
            "-i",
            str(self.identity_file),
            "--ssh-config-file",
            str(self.ssh_config),
        ]


@contextlib.contextmanager
def fake_host(workdir: Path, hostname: str = "fakehost2") -> Iterator[FakeHost]:
    """Create the host and its sshd; yield it; remove all of it."""
    with VirtualHosts(workdir, [hostname], uplink=True) as hosts:
        ssh_config = workdir / "ssh_config"  # for ssh from this machine (the host has its own /etc/ssh)
        ssh_config.write_text(
            f"Host *\n  User root\n  IdentitiesOnly yes\n  UserKnownHostsFile {hosts.known_hosts}\n"
            "  LogLevel ERROR\n"
        )
        host = hosts[hostname]
        yield FakeHost(
            hostname, host.address, hosts.uplink_address, host.namespace, hosts.identity_file, ssh_config
        )
