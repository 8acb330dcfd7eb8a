"""A script of ``hpcdl submit --scheduler lsf`` run as LSF with CSM runs it: on the job's launch node, which
is not one of its compute nodes, all separate hosts (``virtual_hosts``), with a stand-in for ``jsrun``
(``launcher_stand_ins``). The script hosts the job's rendezvous on the launch node at the address that
reaches the compute nodes, and a one-task jsrun finds MASTER_PORT on the first compute node; the ranks,
started by jsrun on the compute nodes, meet at both: an hpcdl allreduce and an unchanged DDP (gloo) script."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from launcher_stand_ins import allocation_env, install, recorded
from virtual_hosts import VirtualHosts, missing_requirements

from hpcdl.schedulers import SiteConfig, get_scheduler

_MISSING = missing_requirements()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no virtual hosts: {_MISSING}")

DDP_TRAIN = Path(__file__).resolve().parents[1] / "parallel" / "ddp_train.py"
LAUNCH, NODES = "batch1", ["c01n01", "c01n02"]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VirtualHosts]:
    with VirtualHosts(tmp_path_factory.mktemp("hosts"), [LAUNCH, *NODES], ssh=False) as made:
        yield made


def test_the_script_on_the_launch_node_hosts_the_ranks_of_the_compute_nodes(
    hosts: VirtualHosts, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    bin_dir = install(tmp_path / "bin", "jsrun")
    site = SiteConfig()
    job = site.make_job(["python3", str(DDP_TRAIN)], nodes=2, ranks_per_node=1)
    script = tmp_path / "job.lsf.sh"
    script.write_text(get_scheduler("lsf").render(job, site))
    allocation = {"LSB_JOBID": "91", "LSB_MCPU_HOSTS": f"{LAUNCH} 1 {NODES[0]} 1 {NODES[1]} 1"}
    env = allocation_env(hosts, bin_dir, allocation)
    done = hosts.run(LAUNCH, ["bash", str(script)], env=env, cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = sorted(
        (json.loads(line.partition("RESULT ")[2]) for line in done.stdout.splitlines() if "RESULT " in line),
        key=lambda r: r["rank"],
    )
    assert [(r["rank"], r["hpcdl_rank"], r["world"], r["local_rank"]) for r in found] == [
        (0, 0, 2, 0),
        (1, 1, 2, 0),
    ]
    assert {r["hpcdl_sum"] for r in found} == {3.0}  # met at the launch node's rendezvous
    assert all(r["weights_agree"] and r["weights_moved"] for r in found)  # and at MASTER_ADDR:MASTER_PORT
    master_addr = {r["master"] for r in found}.pop().split(":")[0]
    assert master_addr == NODES[0]  # rank 0's node, not the launch node
    probe, ranks = recorded(bin_dir, "jsrun")
    assert probe[:8] == ["-n", "1", "-r", "1", "-a", "1", "-c", "1"]
    assert ranks[:6] == ["-n", "2", "-r", "1", "-a", "1"]
