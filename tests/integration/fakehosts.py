"""A second "host" on this machine for launcher tests: a network namespace joined to this one by a
veth pair, with its own hostname (``unshare --uts``) and its own sshd (root, key auth) listening on
the namespace's address. Everything is named after this process and removed on exit, also when a
test fails half way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
READY_SECONDS = 15.0


@dataclass(frozen=True)
class FakeHost:
    hostname: str  # what `hostname` says inside
    address: str  # the namespace's address, reachable from here
    local_address: str  # this side's address on the link
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


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def missing_requirements() -> str | None:
    """Why no fake host can be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (apt install iproute2 openssh-client util-linux)"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (apt install openssh-server)"
    probe = f"hpcdl-probe{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"this machine cannot create network namespaces: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def _kill_namespace_processes(namespace: str) -> None:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30)
    for pid in done.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), 9)


def _remove_stale_hosts() -> None:
    """Delete namespaces (and their links) left by test runs that were killed before teardown."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    for line in done.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        tag = name[len("hpcdl-rt") :]
        if not name.startswith("hpcdl-rt") or not tag.isdigit() or Path(f"/proc/{tag}").exists():
            continue
        _kill_namespace_processes(name)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", f"hrt{tag}a"], capture_output=True, timeout=30)


@contextlib.contextmanager
def fake_host(workdir: Path, hostname: str = "fakehost2") -> Iterator[FakeHost]:
    """Create the namespace, link and sshd; yield the host; remove all of it."""
    _remove_stale_hosts()
    tag = os.getpid()  # names stay unique while this process lives; veth names fit in 15 bytes
    namespace, outside, inside = f"hpcdl-rt{tag}", f"hrt{tag}a", f"hrt{tag}b"
    subnet = f"198.18.{tag % 250}"  # RFC 2544 benchmarking range: not used by real networks
    local_address, address = f"{subnet}.1", f"{subnet}.2"
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o700)
    sshd: subprocess.Popen | None = None
    try:
        _run("ip", "netns", "add", namespace)
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _run("ip", "link", "set", inside, "netns", namespace)
        _run("ip", "addr", "add", f"{local_address}/24", "dev", outside)
        _run("ip", "link", "set", outside, "up")
        _run("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", inside)
        _run("ip", "-n", namespace, "link", "set", inside, "up")
        _run("ip", "-n", namespace, "link", "set", "lo", "up")
        for key in ("host_key", "id_ed25519"):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(workdir / key))
        shutil.copy(workdir / "id_ed25519.pub", workdir / "authorized_keys")
        os.chmod(workdir / "authorized_keys", 0o600)
        (workdir / "sshd_config").write_text(
            f"Port 22\nListenAddress {address}\nHostKey {workdir / 'host_key'}\n"
            f"PidFile {workdir / 'sshd.pid'}\nAuthorizedKeysFile {workdir / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nLogLevel ERROR\n"
        )
        ssh_config = workdir / "ssh_config"
        ssh_config.write_text(
            "Host *\n  User root\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
            "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        )
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        sshd = subprocess.Popen(
            ["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c",
             f'hostname {hostname} && exec {SSHD} -D -f "$0" -E "$1"',
             str(workdir / "sshd_config"), str(workdir / "sshd.log")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        host = FakeHost(hostname, address, local_address, namespace, workdir / "id_ed25519", ssh_config)
        _wait_for_ssh(host, sshd, workdir)
        yield host
    finally:
        if sshd is not None:
            sshd.kill()
            sshd.wait(timeout=10)
        _kill_namespace_processes(namespace)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", outside], capture_output=True, timeout=30)


def _wait_for_ssh(host: FakeHost, sshd: subprocess.Popen, workdir: Path) -> None:
    argv = ["ssh", "-F", str(host.ssh_config), "-i", str(host.identity_file), "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=2", host.address, "hostname"]  # fmt: skip
    deadline = time.monotonic() + READY_SECONDS
    last = ""
    while time.monotonic() < deadline:
        if sshd.poll() is not None:
            log = (workdir / "sshd.log").read_text() if (workdir / "sshd.log").exists() else ""
            raise RuntimeError(f"sshd in {host.namespace} exited ({sshd.returncode}): {log}")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        if done.returncode == 0 and done.stdout.strip() == host.hostname:
            return
        last = done.stderr.strip() or done.stdout.strip()
        time.sleep(0.1)
    raise RuntimeError(f"ssh to the fake host {host.address} did not work within {READY_SECONDS:g} s: {last}")
