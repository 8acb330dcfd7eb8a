"""``hpcdl run`` across two hosts: this one and a network namespace with its own hostname and sshd,
reached over ssh with -p/-i. Checks placement, the forwarded environment, the secret staying off
every command line, failures and signals crossing the ssh hop, and nothing left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakehosts import FakeHost, fake_host, missing_requirements

_MISSING = missing_requirements()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no fake host: {_MISSING}")

REPORT = r"""
import json, os, socket
secret = os.environ.get("HPCDL_SECRET", "").encode()
exposed = []
for pid in os.listdir("/proc"):
    try:
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        continue
    if secret and secret in cmdline:
        exposed.append(pid)
names = ("PYTHONPATH", "VIRTUAL_ENV", "FOO", "NOT_FORWARDED", "NCCL_DEBUG")
print(json.dumps({
    "hostname": socket.gethostname(),
    "env": {k: v for k, v in os.environ.items() if k.startswith(("HPCDL_", "HOROVOD_")) or k in names},
    "secret_in_cmdlines": exposed,
    "cwd": os.getcwd(),
}))
"""

RANK = r"""
import os, subprocess, sys, time
rank, out = os.environ["HPCDL_RANK"], sys.argv[1]
child = subprocess.Popen(["sleep", "60"])
for name, pid in (("child", child.pid), ("rank", os.getpid())):
    with open(f"{out}/{name}{rank}.tmp", "w") as f:
        f.write(str(pid))
    os.rename(f"{out}/{name}{rank}.tmp", f"{out}/{name}{rank}.pid")
if rank == sys.argv[2]:
    size = int(os.environ["HPCDL_SIZE"])
    while len([p for p in os.listdir(out) if p.startswith("rank") and p.endswith(".pid")]) < size:
        time.sleep(0.05)
    print(f"rank {rank} fails on {os.uname().nodename}", file=sys.stderr, flush=True)
    sys.exit(3)
try:
    time.sleep(60)
except KeyboardInterrupt:
    print(f"rank {rank} got SIGINT on {os.uname().nodename}", flush=True)
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHost]:
    with fake_host(tmp_path_factory.mktemp("fakehost") / "host2") as made:
        yield made


def _run_args(host: FakeHost, hosts: str, *command: str) -> list[str]:
    return [sys.executable, "-m", "hpcdl", "run", "-np", "4", "-H", hosts, *host.ssh_args(), *command]


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "PBS_", "LSB_", "COBALT_", "FLUX_"))
    }
    env.update(extra)
    return env


def _pids(directory: Path) -> list[int]:
    return [int(p.read_text()) for p in directory.glob("*.pid")]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if _running(pid)]


def _wait_pid_files(directory: Path, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(list(directory.glob("*.pid"))) < count:
        assert time.monotonic() < deadline, f"ranks did not start: {sorted(os.listdir(directory))}"
        time.sleep(0.05)


def test_two_hosts_placement_and_environment(host: FakeHost, tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    env = _env(PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}", VIRTUAL_ENV="/opt/venv-x",
               NOT_FORWARDED="1", NCCL_DEBUG="WARN")  # fmt: skip
    done = subprocess.run(
        _run_args(host, f"localhost:2,{host.address}:2", "-x", "FOO=bar", sys.executable, str(script)),
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    reports = {}
    for line in done.stdout.splitlines():
        tag, _, payload = line.partition("<stdout>:")
        reports[int(tag.strip("[]"))] = json.loads(payload)
    assert sorted(reports) == [0, 1, 2, 3]
    local_name = os.uname().nodename
    for rank, report in reports.items():
        remote = rank >= 2
        e = report["env"]
        assert report["hostname"] == (host.hostname if remote else local_name)
        assert e["HPCDL_RANK"] == e["HOROVOD_RANK"] == str(rank)
        assert e["HPCDL_SIZE"] == "4"
        assert e["HPCDL_LOCAL_RANK"] == str(rank % 2) and e["HPCDL_LOCAL_SIZE"] == "2"
        assert e["HPCDL_CROSS_RANK"] == str(rank // 2) and e["HPCDL_CROSS_SIZE"] == "2"
        assert e["HPCDL_HOSTNAME"] == (host.address if remote else "localhost")
        assert e["FOO"] == "bar" and e["VIRTUAL_ENV"] == "/opt/venv-x" and e["NCCL_DEBUG"] == "WARN"
        assert e["PYTHONPATH"].startswith(str(tmp_path))
        assert ("NOT_FORWARDED" in e) == (not remote)  # ssh carries only the listed variables
        assert report["cwd"] == str(tmp_path)
        assert report["secret_in_cmdlines"] == []
        if "HPCDL_RENDEZVOUS_PORT" in e:  # the launcher hosts the rendezvous on an address both hosts reach
            assert e["HPCDL_RENDEZVOUS_ADDR"] == host.local_address


def test_remote_failure_stops_every_rank(host: FakeHost, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    started = time.monotonic()
    done = subprocess.run(
        _run_args(host, f"localhost:2,{host.address}:2", sys.executable, str(script), str(tmp_path), "3"),
        capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - started < 20
    assert (
        f"hpcdl run: rank 3 on host {host.address} exited with code 3; stopped the other 3 rank(s)"
        in done.stderr
    )
    assert f"rank 3 fails on {host.hostname}" in done.stderr.split("last lines of its stderr", 1)[1]
    pids = _pids(tmp_path)
    assert len(pids) == 8
    assert _wait_gone(pids, 5.0) == []


def test_ctrl_c_reaches_remote_ranks(host: FakeHost, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    launcher = subprocess.Popen(
        _run_args(host, f"localhost:2,{host.address}:2", sys.executable, str(script), str(tmp_path), "none"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    try:
        _wait_pid_files(tmp_path, 8)
        launcher.send_signal(signal.SIGINT)
        stdout, stderr = launcher.communicate(timeout=20)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, stderr
    assert f"[2]<stdout>:rank 2 got SIGINT on {host.hostname}" in stdout
    assert f"[3]<stdout>:rank 3 got SIGINT on {host.hostname}" in stdout
    assert _wait_gone(_pids(tmp_path), 5.0) == []


def test_killed_launcher_leaves_no_remote_rank(host: FakeHost, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    launcher = subprocess.Popen(
        _run_args(host, f"{host.address}:4", sys.executable, str(script), str(tmp_path), "none"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
    )  # fmt: skip
    try:
        _wait_pid_files(tmp_path, 8)
    finally:
        launcher.kill()  # SIGKILL: no chance to clean up; the remote agents see their stdin close
        launcher.wait(timeout=10)
    assert _wait_gone(_pids(tmp_path), 10.0) == []


def test_unreachable_ssh_port_is_reported(host: FakeHost) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "run", "-np", "2", "-H", f"localhost:1,{host.address}:1", "-p", "1",
         "-i", str(host.identity_file), "--ssh-config-file", str(host.ssh_config), "hostname"],
        capture_output=True, text=True, timeout=60, env=_env(),
    )  # fmt: skip
    assert done.returncode == 255
    assert f"rank 1 on host {host.address} exited with code 255 (ssh to {host.address} failed" in done.stderr
    assert "Connection refused" in done.stderr


def test_a_host_key_is_trusted_only_when_known_or_when_the_policy_says_so(
    host: FakeHost, tmp_path: Path
) -> None:
    """hpcdl run used to pass StrictHostKeyChecking=accept-new, trusting any host's key on first use. Now the
    user's ssh configuration decides (here: a known_hosts without the host), unless --ssh-host-key-policy
    says otherwise; a key that differs from the known one is refused even then."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  User root\n  IdentitiesOnly yes\n  UserKnownHostsFile {known_hosts}\n")

    def run(*policy: str) -> subprocess.CompletedProcess:
        ssh = ["-p", "22", "-i", str(host.identity_file), "--ssh-config-file", str(config), *policy]
        argv = [sys.executable, "-m", "hpcdl", "run", "-np", "1", "-H", f"{host.address}:1", *ssh, "hostname"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_env())

    unknown = run()
    assert unknown.returncode == 255 and "Host key verification failed" in unknown.stderr, unknown.stderr
    assert "--ssh-host-key-policy" in unknown.stderr and known_hosts.read_text() == ""
    accepted = run("--ssh-host-key-policy", "accept-new")
    assert accepted.returncode == 0 and host.hostname in accepted.stdout, accepted.stderr
    assert host.address in known_hosts.read_text()
    assert run().returncode == 0  # known now
    other_key = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")],
                               capture_output=True, timeout=30, check=True)  # fmt: skip
    assert other_key.returncode == 0
    forged = (tmp_path / "k.pub").read_text().split()[:2]
    known_hosts.write_text(f"{host.address} {' '.join(forged)}\n")
    changed = run("--ssh-host-key-policy", "accept-new")
    assert changed.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in changed.stderr, changed.stderr


ALLREDUCE = r"""
import numpy as np
import hpcdl.common as hc
hc.init()
total = hc.allreduce(np.array([hc.rank() + 1.0]))
print(hc.rank(), hc.size(), hc.local_rank(), hc.cross_rank(), float(total[0]), flush=True)
hc.shutdown()
"""


def _runtime_missing() -> str | None:
    try:
        from hpcdl.common.rendezvous import RendezvousServer, make_secret

        with RendezvousServer(1, make_secret()):
            return None
    except Exception as exc:  # any failure means the compiled runtime cannot run here
        return f"hpcdl's runtime cannot host a rendezvous here: {exc}"


def test_hpcdl_collective_across_two_hosts(host: FakeHost, tmp_path: Path) -> None:
    missing = _runtime_missing()
    if missing:
        pytest.skip(missing)
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    done = subprocess.run(
        _run_args(host, f"localhost:2,{host.address}:2", "--timeout", "30", sys.executable, str(script)),
        capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [
        f"[{r}]<stdout>:{r} 4 {r % 2} {r // 2} 10.0" for r in range(4)
    ]


@pytest.mark.parametrize("mpirun", ["/usr/bin/mpirun.openmpi", "/usr/bin/mpiexec.mpich"])
def test_mpi_across_two_hosts_uses_the_ssh_options(host: FakeHost, mpirun: str) -> None:
    if not os.access(mpirun, os.X_OK):
        pytest.skip(f"{mpirun} is not installed (apt install openmpi-bin mpich)")
    subnet = host.address.rsplit(".", 1)[0] + ".0/24"
    extra = (
        f"-mca oob_tcp_if_include {subnet} -mca btl_tcp_if_include {subnet}" if "openmpi" in mpirun else ""
    )
    env = {k: v for k, v in _env().items() if not k.startswith("OMPI_MCA_")}  # this test picks the link
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "run", "--mpi", "--mpirun", mpirun, "--mpi-args", extra, "-np", "4",
         "-H", f"{host.local_address}:2,{host.address}:2", *host.ssh_args(),
         "--", "sh", "-c", "echo $(hostname) ${OMPI_COMM_WORLD_RANK:-$PMI_RANK}"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    local_name = os.uname().nodename
    assert sorted(done.stdout.splitlines()) == [
        f"[{r}]<stdout>:{host.hostname if r >= 2 else local_name} {r}" for r in range(4)
    ]


def test_elastic_job_regroups_across_hosts(host: FakeHost, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    train = Path(__file__).parents[1] / "parallel" / "elastic_train.py"
    args = [sys.executable, "-m", "hpcdl", "run", "-np", "3", "--min-np", "2", "--max-np", "3",
            "-H", f"localhost:2,{host.address}:1", *host.ssh_args(), sys.executable, str(train)]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=180, env=_env(FAIL_WORKER="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"elastic round 2: 2 worker(s) (0@localhost, 2@{host.address})" in done.stderr
    results = {}
    for line in done.stdout.splitlines():
        _, sep, payload = line.partition("<stdout>:RESULT ")
        if sep:
            result = json.loads(payload)
            results[result["worker"]] = result
    assert sorted(results) == [0, 2]
    assert results[0]["sizes"] == results[2]["sizes"] == [2, 3]
    assert results[2]["rank"] == 1 and results[0]["weight"] == results[2]["weight"]
    alone = subprocess.run(
        [sys.executable, "-m", "hpcdl", "run", "-np", "1", "--min-np", "1", "--max-np", "1", sys.executable,
         str(train)], capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout.split("RESULT ", 1)[1])["weight"] == results[0]["weight"]
