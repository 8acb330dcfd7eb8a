"""Separate hosts on this one machine for multi-host tests: each host is a network namespace with its own
hostname (a UTS namespace), its own address on a bridge, its own ``/etc/hosts`` and, optionally, an sshd
on port 22 that every other host reaches with plain ``ssh HOST`` (root, key auth, no prompt).

The bridge lives in a namespace of its own, so by default nothing of the cluster's network appears in this
machine's namespace: its addresses and well-known ports (sshd's 22, Slurm's 6817/6818) cannot collide with
another test run or with a service of the machine. ``uplink=True`` also joins this machine's namespace to
the bridge (for tests where this machine is one of the hosts); the subnet is then claimed under a lock
that lives as long as the hosts, so concurrent runs never share one.

Commands run on a host through ``nsenter`` into the host's anchor process, which holds its network, UTS
and mount namespaces (in the mount namespace, ``/etc/netns/<namespace>/{hosts,hostname,ssh}`` are bound
over ``/etc``, as ``ip netns exec`` does). Namespaces, links and processes are named
after this process; all of it is removed on exit, also when a test fails half way, and the next run removes
whatever a killed run left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Optional

SSHD = "/usr/sbin/sshd"
PRIVATE_NETWORK = "10.99.0"  # used only inside the namespaces, never routed anywhere else
UPLINK_LOCK_DIR = Path("/run/lock")
READY_SECONDS = 20.0
STOP_GRACE_SECONDS = 5.0

_NAMESPACE_RE = re.compile(r"^hpcdl-vh(\d+)x(\d+)-")
_sequence = itertools.count()


def missing_requirements() -> Optional[str]:
    """Why no virtual host can be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "nsenter", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (apt install iproute2 util-linux openssh-client)"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (apt install openssh-server)"
    probe = f"hpcdl-probe{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"this machine cannot create network namespaces: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


@dataclass(frozen=True)
class Host:
    name: str  # its hostname, and the name every host resolves to its address
    address: str
    namespace: str
    anchor: int  # pid of the process that holds its namespaces


def _ip(command: str) -> None:
    """Runs ``ip COMMAND`` (words separated by spaces); an error names the command and what ip said."""
    done = subprocess.run(["ip", *command.split()], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {command}: {done.stderr.strip()}")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _namespace_pids(namespace: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30)
    return [int(pid) for pid in done.stdout.split()]


def _stop_namespace_processes(namespaces: Sequence[str], grace: float) -> None:
    """SIGTERM every process in the namespaces, then SIGKILL what is still there after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [pid for ns in namespaces for pid in _namespace_pids(ns)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 10.0)
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)


def _delete_namespace(namespace: str) -> None:
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
    shutil.rmtree(Path("/etc/netns") / namespace, ignore_errors=True)


def remove_stale_namespaces() -> None:
    """Delete the namespaces (with their processes, links and /etc/netns files) of runs that are gone."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    stale = []
    for line in done.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NAMESPACE_RE.match(name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            stale.append(name)
    if stale:
        _stop_namespace_processes(stale, grace=0.0)
        for name in stale:
            _delete_namespace(name)


@contextlib.contextmanager
def _claimed_subnet() -> Iterator[str]:
    """A /24 of 198.18.0.0/15 (RFC 2544, unused by real networks) that no concurrent run holds."""
    UPLINK_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    for index in range(512):
        lock: IO[str] = open(UPLINK_LOCK_DIR / f"hpcdl-test-subnet-{index}.lock", "w")  # noqa: SIM115
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        try:
            yield f"198.{18 + index // 256}.{index % 256}"
        finally:
            lock.close()
        return
    raise RuntimeError("all 512 test subnets of 198.18.0.0/15 are held by other test runs")


class VirtualHosts:
    """Hosts named `names`, with addresses .1, .2, ... of one /24 (see the module docstring)."""

    def __init__(
        self,
        workdir: Path,
        names: Sequence[str],
        *,
        ssh: bool = True,
        own_name_loopback: bool = False,
        uplink: bool = False,
    ) -> None:
        """`own_name_loopback`: each host resolves its own name to 127.0.1.1, as Debian's installer
        writes /etc/hosts (the other hosts' names still resolve to their addresses).
        `uplink`: this machine's namespace joins the bridge too, at address .254 (`uplink_address`)."""
        if len(set(names)) != len(names) or not 0 < len(names) < 250:
            raise ValueError(f"need 1 to 249 distinct host names, got {list(names)}")
        self.workdir = workdir
        self.names = list(names)
        self.ssh = ssh
        self.own_name_loopback = own_name_loopback
        self.uplink = uplink
        self.uplink_address = ""
        self.hosts: dict[str, Host] = {}
        self._tag = f"hpcdl-vh{os.getpid()}x{next(_sequence)}"
        self._switch = f"{self._tag}-switch"
        self._namespaces: list[str] = []
        self._processes: list[subprocess.Popen] = []
        self._stack = contextlib.ExitStack()

    # ---- lifecycle ------------------------------------------------------------------------------------
    def __enter__(self) -> VirtualHosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> VirtualHosts:
        remove_stale_namespaces()
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o700)
        try:
            network = self._stack.enter_context(_claimed_subnet()) if self.uplink else PRIVATE_NETWORK
            self._make_switch(network)
            addresses = {name: f"{network}.{i + 1}" for i, name in enumerate(self.names)}
            if self.ssh:
                self._make_keys()
                self._write_known_hosts(addresses)
            for i, name in enumerate(self.names):
                self.hosts[name] = self._make_host(name, i, addresses)
            if self.ssh:
                for name in self.names:
                    self._start_sshd(self.hosts[name])
                self._wait_for_ssh()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process on the hosts and remove the namespaces, links and /etc/netns files."""
        namespaces = [*self._namespaces, self._switch]
        _stop_namespace_processes(namespaces, STOP_GRACE_SECONDS)
        for process in self._processes:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        self._processes.clear()
        for namespace in namespaces:
            _delete_namespace(namespace)
        self._namespaces.clear()
        self._stack.close()

    # ---- running commands on a host -------------------------------------------------------------------
    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def command(self, host: str, argv: Sequence[str], cwd: Optional[Path] = None) -> list[str]:
        """`argv` as a command line that runs it on `host` (in `cwd`, default: this process's)."""
        anchor = self.hosts[host].anchor
        return ["nsenter", "-t", str(anchor), "-n", "-u", "-m", f"--wd={cwd or os.getcwd()}", "--", *argv]

    def run(
        self,
        host: str,
        argv: Sequence[str],
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[Path] = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(host, argv, cwd),
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(
        self, host: str, argv: Sequence[str], *, cwd: Optional[Path] = None, **kwargs: Any
    ) -> subprocess.Popen:
        """A process on `host`; it is killed by stop() if still running."""
        process = subprocess.Popen(self.command(host, argv, cwd), **kwargs)
        self._processes.append(process)
        return process

    # ---- pieces ---------------------------------------------------------------------------------------
    def _add_namespace(self, namespace: str) -> None:
        _ip(f"netns add {namespace}")
        self._namespaces.append(namespace)

    def _make_switch(self, network: str) -> None:
        _ip(f"netns add {self._switch}")
        _ip(f"-n {self._switch} link add br0 type bridge")
        _ip(f"-n {self._switch} link set br0 up")
        if self.uplink:
            self.uplink_address = f"{network}.254"
            # The end in this namespace is named after the process (interface names are unique here).
            outside = f"hvu{os.getpid()}x{self._tag.rsplit('x', 1)[1]}"[:15]
            _ip(f"-n {self._switch} link add up0 type veth peer name {outside} netns {os.getpid()}")
            _ip(f"-n {self._switch} link set up0 master br0 up")
            _ip(f"addr add {self.uplink_address}/24 dev {outside}")
            _ip(f"link set {outside} up")

    def _hosts_file(self, me: str, addresses: Mapping[str, str]) -> str:
        lines = ["127.0.0.1 localhost"]
        if self.own_name_loopback:
            lines.append(f"127.0.1.1 {me}")
        lines += [f"{address} {name}" for name, address in addresses.items()
                  if not (self.own_name_loopback and name == me)]  # fmt: skip
        return "\n".join(lines) + "\n"

    def _make_host(self, name: str, index: int, addresses: Mapping[str, str]) -> Host:
        namespace = f"{self._tag}-{index}"
        self._add_namespace(namespace)
        link = f"h{index}"
        _ip(f"-n {self._switch} link add {link} type veth peer name eth0 netns {namespace}")
        _ip(f"-n {self._switch} link set {link} master br0 up")
        _ip(f"-n {namespace} addr add {addresses[name]}/24 dev eth0")
        _ip(f"-n {namespace} link set eth0 up")
        _ip(f"-n {namespace} link set lo up")
        etc = Path("/etc/netns") / namespace
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(self._hosts_file(name, addresses))
        (etc / "hostname").write_text(name + "\n")
        if self.ssh:
            (etc / "ssh").mkdir(exist_ok=True)
            (etc / "ssh" / "ssh_config").write_text(self._ssh_client_config())
        # Like `ip netns exec`, which binds /etc/netns/<namespace>/* over /etc, but without remounting /sys:
        # that would hide the cgroup hierarchies slurmd needs.
        setup = f'for f in {etc}/*; do mount --bind "$f" "/etc/${{f##*/}}" || exit 1; done; hostname {name}'
        anchor = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{namespace}", "unshare", "--mount", "--propagation", "slave",
             "--uts", "--", "sh", "-c", f"{setup} && exec sleep infinity"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        self._processes.append(anchor)
        deadline = time.monotonic() + READY_SECONDS
        while Path(f"/proc/{anchor.pid}/comm").read_text().strip() != "sleep":
            if anchor.poll() is not None:
                error = anchor.stderr.read().decode() if anchor.stderr else ""
                raise RuntimeError(f"host {name} ({namespace}) did not start: {error}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"host {name} ({namespace}) did not start within {READY_SECONDS:g} s")
            time.sleep(0.01)
        return Host(name, addresses[name], namespace, anchor.pid)

    # ---- ssh ------------------------------------------------------------------------------------------
    @property
    def identity_file(self) -> Path:
        return self.workdir / "ssh" / "id_ed25519"

    def _make_keys(self) -> None:
        keys = self.workdir / "ssh"
        keys.mkdir(mode=0o700, exist_ok=True)
        for key in ("host_ed25519", "id_ed25519"):
            if not (keys / key).exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / key)],
                               check=True, capture_output=True, timeout=30)  # fmt: skip
        shutil.copy(keys / "id_ed25519.pub", keys / "authorized_keys")
        os.chmod(keys / "authorized_keys", 0o600)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory

    @property
    def known_hosts(self) -> Path:
        """Every host's key under its name and address: ssh checks them strictly, nothing is trusted on
        first use."""
        return self.workdir / "ssh" / "known_hosts"

    def _write_known_hosts(self, addresses: Mapping[str, str]) -> None:
        key = (self.workdir / "ssh" / "host_ed25519.pub").read_text().split()[:2]
        lines = [f"{name},{address} {' '.join(key)}" for name, address in addresses.items()]
        self.known_hosts.write_text("\n".join(lines) + "\n")

    def _ssh_client_config(self) -> str:
        return (
            f"Host *\n  User root\n  IdentityFile {self.identity_file}\n  IdentitiesOnly yes\n"
            f"  StrictHostKeyChecking yes\n  UserKnownHostsFile {self.known_hosts}\n  BatchMode yes\n"
            "  ConnectTimeout 5\n  LogLevel ERROR\n"
        )

    def _start_sshd(self, host: Host) -> None:
        keys = self.workdir / "ssh"
        config = keys / f"sshd_config.{host.name}"
        config.write_text(
            f"Port 22\nListenAddress {host.address}\nHostKey {keys / 'host_ed25519'}\nPidFile none\n"
            f"AuthorizedKeysFile {keys / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "LogLevel ERROR\n"
        )
        log = keys / f"sshd.{host.name}.log"
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.popen(host.name, [SSHD, "-D", "-f", str(config), "-E", str(log)], **quiet)

    def _wait_for_ssh(self) -> None:
        """Every host reaches the next one by name (the last reaches the first)."""
        deadline = time.monotonic() + READY_SECONDS
        pending = list(self.names)
        last = ""
        while pending:
            source = self.names[(self.names.index(pending[0]) - 1) % len(self.names)]
            done = self.run(source, ["ssh", pending[0], "hostname"], timeout=15)
            if done.returncode == 0 and done.stdout.strip() == pending[0]:
                pending.pop(0)
                continue
            last = done.stderr.strip() or done.stdout.strip()
            if time.monotonic() > deadline:
                logs = " ".join(p.read_text() for p in (self.workdir / "ssh").glob("sshd.*.log"))
                raise RuntimeError(f"ssh {source} -> {pending[0]} does not work: {last}; sshd logs: {logs}")
            time.sleep(0.1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python tests/integration/virtual_hosts.py [--hosts host1,host2] -- COMMAND...``: run COMMAND on the
    first of these hosts (each reaches the others by name, over ssh too) and remove them afterwards; for
    benchmarks across hosts on one machine, e.g. ``... -- hpcdl bench allreduce --hosts host1:1,host2:1``."""
    import argparse
    import sys
    import tempfile

    parser = argparse.ArgumentParser(prog="virtual_hosts.py", description=main.__doc__)
    parser.add_argument("--hosts", default="host1,host2", help="comma list of names (default host1,host2)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    missing = missing_requirements()
    if missing:
        parser.error(f"no virtual hosts: {missing}")
    names = [name for name in args.hosts.split(",") if name]
    workdir = tempfile.TemporaryDirectory(prefix="hpcdl-vh-")
    with workdir, VirtualHosts(Path(workdir.name), names) as hosts:
        return hosts.popen(names[0], command, stdin=sys.stdin).wait()


if __name__ == "__main__":
    raise SystemExit(main())
