"""Ranks on separate hosts meet by host name: two virtual hosts (own hostname, address, /etc/hosts and sshd
each) and every way a job names its rendezvous or launches its ranks across them, including what a user
gets when the names cannot work (a loopback name across hosts, a loopback HPCDL_IFACE, one hostname on two
machines) and when another program holds a port the rendezvous would use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from multihost_checks import assert_spread, occupy, reports, write_report
from virtual_hosts import VirtualHosts, missing_requirements

_MISSING = missing_requirements()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no virtual hosts: {_MISSING}")

SECRET = "5e" * 32
# Anything of the environment that would tell a rank another launcher's story.
_FOREIGN = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "HPCDL_", "HOROVOD_", "MASTER_", "TORCHELASTIC_", "PALS_",
            "FLUX_", "LSB_", "JSM_")  # fmt: skip
_TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN) and k not in _TORCHRUN}
    return {**env, "HPCDL_TIMEOUT": "60", **extra}


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VirtualHosts]]:
    """Two two-host clusters: one whose hosts resolve every name to its address (as DNS does), one whose
    hosts resolve their own name to 127.0.1.1 (as Debian's installer writes /etc/hosts)."""
    base = tmp_path_factory.mktemp("hosts")
    dns = VirtualHosts(base / "dns", ["host1", "host2"])
    debian = VirtualHosts(base / "debian", ["host1", "host2"], own_name_loopback=True)
    with dns, debian:
        yield {"names in DNS": dns, "own name 127.0.1.1": debian}


@pytest.fixture(scope="module")
def hosts(clusters: dict[str, VirtualHosts]) -> VirtualHosts:
    return clusters["names in DNS"]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report(tmp_path_factory.mktemp("scripts"))


Command = tuple[str, Sequence[str], Mapping[str, str]]  # (host, argv, environment)


def run_on_hosts(
    hosts: VirtualHosts, commands: Sequence[Command], timeout: float = 120
) -> list[tuple[int, str, str]]:
    """Run the commands at once, each on its host (in the temporary directory, so that `python -m` imports
    hpcdl from where it is installed); (exit code, stdout, stderr) of each."""
    cwd = Path(tempfile.gettempdir())
    processes = [
        hosts.popen(host, argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for host, argv, env in commands
    ]
    results = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=timeout)
        finally:
            process.kill()
        results.append((process.returncode, out, err))
    return results


def succeeded(results: list[tuple[int, str, str]]) -> str:
    """The joined stdout of commands that must all have succeeded."""
    for code, _, err in results:
        assert code == 0, err[-3000:]
    return "".join(out for _, out, _ in results)


@pytest.mark.parametrize("naming", ["names in DNS", "own name 127.0.1.1"])
def test_rank_zero_serves_the_rendezvous_at_its_host_name(
    clusters: dict[str, VirtualHosts], report: Path, naming: str
) -> None:
    """The case of issue #25: ranks advertised 127.0.0.1 when the rendezvous was given by name."""
    hosts = clusters[naming]
    common = dict(HPCDL_SIZE="2", HPCDL_RENDEZVOUS_ADDR="host1", HPCDL_RENDEZVOUS_PORT="29400",
                  HPCDL_RENDEZVOUS_SERVE="1", HPCDL_SECRET=SECRET)  # fmt: skip
    argv = [sys.executable, str(report)]
    found = reports(
        succeeded(
            run_on_hosts(
                hosts, [(f"host{r + 1}", argv, clean_env(HPCDL_RANK=str(r), **common)) for r in range(2)]
            )
        )
    )
    assert [(found[r]["host"], found[r]["sum"], found[r]["cross"]) for r in (0, 1)] == [
        ("host1", 3.0, "tcp"),
        ("host2", 3.0, "tcp"),
    ]


@pytest.mark.parametrize("naming", ["names in DNS", "own name 127.0.1.1"])
def test_torchrun_job_meets_through_master_addr_hostname(
    clusters: dict[str, VirtualHosts], report: Path, naming: str
) -> None:
    """torchrun on each host, MASTER_ADDR=host1: hpcdl walks the ports after MASTER_PORT, where torchrun's
    own store listens (binding MASTER_PORT itself failed with 'Address already in use')."""
    pytest.importorskip("torch")
    hosts = clusters[naming]
    env = clean_env(HPCDL_SECRET=SECRET, OMP_NUM_THREADS="1")
    agents = [
        (f"host{node + 1}", [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
         "--node-rank", str(node), "--nproc-per-node", "2", "--master-addr", "host1",
         "--master-port", "29500", str(report)], env)
        for node in (0, 1)
    ]  # fmt: skip
    assert_spread(reports(succeeded(run_on_hosts(hosts, agents, timeout=180))), ["host1", "host2"], 2)


def hpcdl_run(*args: str) -> list[str]:
    return [sys.executable, "-m", "hpcdl", "run", *args]


def test_hpcdl_run_across_hosts_by_name(hosts: VirtualHosts, report: Path) -> None:
    """From host1, ranks on host1 by fork and on host2 over plain ssh; hierarchical allreduce."""
    results = run_on_hosts(
        hosts,
        [("host1", hpcdl_run("-np", "4", "-H", "host1:2,host2:2", sys.executable, str(report)), clean_env())],
    )
    assert_spread(reports(succeeded(results)), ["host1", "host2"], 2)


DDP_TRAIN = Path(__file__).parents[1] / "parallel" / "ddp_train.py"


def test_ddp_over_gloo_across_hosts_whose_own_names_resolve_to_loopback(
    clusters: dict[str, VirtualHosts],
) -> None:
    """An unchanged DDP (gloo) script under hpcdl run, one rank per host, where each host resolves its own
    name to 127.0.1.1: unset, GLOO_SOCKET_IFNAME makes gloo bind that address, which the other host cannot
    reach; hpcdl run gives each rank its host's interface towards the job's rendezvous."""
    pytest.importorskip("torch")
    argv = hpcdl_run("-np", "2", "-H", "host1:1,host2:1", sys.executable, str(DDP_TRAIN))
    env = clean_env(OMP_NUM_THREADS="1")
    env.pop("GLOO_SOCKET_IFNAME", None)
    env.pop("NCCL_SOCKET_IFNAME", None)
    output = succeeded(run_on_hosts(clusters["own name 127.0.1.1"], [("host1", argv, env)], timeout=90))
    found = sorted(
        (json.loads(line.partition("RESULT ")[2]) for line in output.splitlines() if "RESULT " in line),
        key=lambda result: result["rank"],
    )
    assert [(r["rank"], r["world"]) for r in found] == [(0, 2), (1, 2)], output
    assert all(r["weights_agree"] and r["weights_moved"] for r in found)  # DDP averaged across the hosts
    assert {r["hpcdl_sum"] for r in found} == {3.0}


@pytest.mark.parametrize("mpirun", ["/usr/bin/mpirun.openmpi", "/usr/bin/mpiexec.mpich"])
def test_hpcdl_run_mpi_across_hosts_by_name(hosts: VirtualHosts, report: Path, mpirun: str) -> None:
    if not os.access(mpirun, os.X_OK):
        pytest.skip(f"{mpirun} is not installed (apt install openmpi-bin mpich)")
    argv = hpcdl_run(
        "--mpi", "--mpirun", mpirun, "-np", "4", "-H", "host1:2,host2:2", sys.executable, str(report)
    )
    assert_spread(
        reports(succeeded(run_on_hosts(hosts, [("host1", argv, clean_env())]))), ["host1", "host2"], 2
    )


def test_mpirun_ranks_meet_through_mpi_across_hosts(hosts: VirtualHosts, report: Path) -> None:
    """bootstrap=mpi: rank 0 announces its host's addresses over MPI (it used the route towards 8.8.8.8,
    which hosts without a default route do not have, and fell back to 127.0.0.1)."""
    mpirun = "/usr/bin/mpirun.openmpi"
    from hpcdl.common import library

    if library.build_info().get("mpi_vendor") != "Open MPI" or not os.access(mpirun, os.X_OK):
        pytest.skip("needs an hpcdl built with Open MPI and Open MPI's mpirun")
    argv = [mpirun, "--allow-run-as-root", "-H", "host1:2,host2:2", "-np", "4", sys.executable, str(report)]
    assert_spread(
        reports(succeeded(run_on_hosts(hosts, [("host1", argv, clean_env())]))), ["host1", "host2"], 2
    )


def torchrun_env(rank: int, **extra: str) -> dict[str, str]:
    """The variables torchrun gives a worker of a two-rank job, one rank per host."""
    return clean_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                     HPCDL_SECRET=SECRET, **extra)  # fmt: skip


def test_a_loopback_rendezvous_address_across_hosts_says_so(hosts: VirtualHosts, report: Path) -> None:
    env = dict(MASTER_ADDR="localhost", MASTER_PORT="29500", HPCDL_TIMEOUT="4")
    argv = [sys.executable, str(report)]
    results = run_on_hosts(hosts, [(f"host{r + 1}", argv, torchrun_env(r, **env)) for r in range(2)])
    assert [code for code, _, _ in results] == [1, 1]
    zero, one = (err for _, _, err in results)
    assert "still missing: rank 1" in zero
    assert "found no rendezvous of this job at localhost on ports 29501-29516" in one
    for err in (zero, one):
        assert "The rendezvous address 'localhost' resolves to 127.0.0.1 on this host" in err
        assert "set MASTER_ADDR/MASTER_PORT to a name or address of rank 0's host" in err


def test_hpcdl_iface_pins_the_address_a_rank_is_reached_at(hosts: VirtualHosts, report: Path) -> None:
    """Rank 1 listens only on a second address of host2 (HPCDL_IFACE may be an address); its peers must
    use that one, not the address the rendezvous saw it come from."""
    second = "10.99.0.102"
    subprocess.run(["ip", "-n", hosts["host2"].namespace, "addr", "add", f"{second}/24", "dev", "eth0"],
                   check=True, capture_output=True, timeout=30)  # fmt: skip
    try:
        env = dict(MASTER_ADDR="host1", MASTER_PORT="29500")
        argv = [sys.executable, str(report)]
        commands = [
            ("host1", argv, torchrun_env(0, **env)),
            ("host2", argv, torchrun_env(1, HPCDL_IFACE=second, **env)),
        ]
        found = reports(succeeded(run_on_hosts(hosts, commands)))
        assert [(found[r]["sum"], found[r]["host"]) for r in (0, 1)] == [(3.0, "host1"), (3.0, "host2")]
    finally:
        subprocess.run(["ip", "-n", hosts["host2"].namespace, "addr", "del", f"{second}/24", "dev", "eth0"],
                       capture_output=True, timeout=30)  # fmt: skip


def test_a_loopback_interface_across_hosts_is_refused_at_once(hosts: VirtualHosts, report: Path) -> None:
    env = dict(MASTER_ADDR="host1", MASTER_PORT="29500", HPCDL_TIMEOUT="60")
    argv = [sys.executable, str(report)]
    commands = [
        ("host1", argv, torchrun_env(0, **env)),
        ("host2", argv, torchrun_env(1, HPCDL_IFACE="lo", **env)),
    ]
    results = run_on_hosts(hosts, commands, timeout=30)
    for code, _, err in results:
        assert code == 1
        assert "rank 1 on host 'host2' pinned its data address to the loopback address 127.0.0.1" in err
        assert "set HPCDL_IFACE to an interface of the network between the hosts" in err


def test_one_host_identity_on_two_machines_is_refused(hosts: VirtualHosts, report: Path) -> None:
    env = dict(MASTER_ADDR="host1", MASTER_PORT="29500", HPCDL_HOSTNAME="node")
    argv = [sys.executable, str(report)]
    results = run_on_hosts(
        hosts, [(f"host{r + 1}", argv, torchrun_env(r, **env)) for r in range(2)], timeout=30
    )
    for code, _, err in results:
        assert code == 1
        assert "ranks 0 and 1 both call their host 'node' but run on different machines" in err
        assert "from the rendezvous server's host and 10.99.0.2" in err


def test_job_starts_while_other_programs_hold_master_port_and_the_first_walked_port(
    hosts: VirtualHosts, report: Path
) -> None:
    """Rank 0 binds the first free port after MASTER_PORT; the others pass over the ones it could not
    have (a silent listener, another protocol) and find it."""
    holder = occupy(hosts, "host1", [29501, 29500, 29502])
    try:
        env = dict(MASTER_ADDR="host1", MASTER_PORT="29500")
        argv = [sys.executable, str(report)]
        results = run_on_hosts(hosts, [(f"host{r + 1}", argv, torchrun_env(r, **env)) for r in range(2)])
        found = reports(succeeded(results))
        assert [(found[r]["sum"], found[r]["host"]) for r in (0, 1)] == [(3.0, "host1"), (3.0, "host2")]
    finally:
        holder.kill()


def test_a_taken_fixed_rendezvous_port_is_named(hosts: VirtualHosts, report: Path) -> None:
    holder = occupy(hosts, "host1", [29400])
    try:
        fixed = dict(HPCDL_RENDEZVOUS_ADDR="host1", HPCDL_RENDEZVOUS_PORT="29400", HPCDL_RENDEZVOUS_SERVE="1")
        env = clean_env(HPCDL_RANK="0", HPCDL_SIZE="2", HPCDL_SECRET=SECRET, **fixed)
        [(code, _, err)] = run_on_hosts(hosts, [("host1", [sys.executable, str(report)], env)], timeout=30)
    finally:
        holder.kill()
    assert code == 1
    assert (
        "rank 0 cannot host the rendezvous: port 29400 is taken on this host (cannot listen on "
        "0.0.0.0:29400: Address already in use); it is the fixed rendezvous port (from "
        "HPCDL_RENDEZVOUS_ADDR/HPCDL_RENDEZVOUS_PORT): choose a port that is free on this host"
    ) in err
