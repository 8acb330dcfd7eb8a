"""``hpcdl run`` inside a real Slurm allocation (``salloc``): the hosts and slots come from
SLURM_JOB_NODELIST / SLURM_TASKS_PER_NODE. The fake nodes all live on this machine; a private
/etc/hosts (in a mount namespace of the test only) lets their names resolve as on a cluster."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, missing_requirements

_MISSING = missing_requirements() or (None if shutil.which("unshare") else "unshare is not installed")
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no Slurm test cluster: {_MISSING}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    made = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=3, gpus_per_node=0)
    try:
        yield made.start()
    finally:
        made.stop()


def _in_allocation(cluster: SlurmCluster, salloc_args: str, run_args: str) -> subprocess.CompletedProcess:
    hosts = cluster.base / "hosts"
    names = " ".join(cluster.node_names)
    hosts.write_text(Path("/etc/hosts").read_text() + f"\n127.0.0.1 {names}\n")
    inner = (
        f"mount --bind {hosts} /etc/hosts && exec salloc {salloc_args} "
        f"{shlex.quote(sys.executable)} -m hpcdl run {run_args}"
    )
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner],
        capture_output=True, text=True, timeout=120, env=cluster.env,
    )  # fmt: skip


_VARIABLES = ("RANK", "SIZE", "HOSTNAME", "LOCAL_RANK", "CROSS_RANK", "CROSS_SIZE")
SHOW = "sh -c 'echo " + " ".join(f"$HPCDL_{name}" for name in _VARIABLES) + "'"


def test_ranks_fill_the_allocation(cluster: SlurmCluster) -> None:
    done = _in_allocation(cluster, "-N3 --ntasks-per-node=2", f"--verbose -- {SHOW}")
    assert done.returncode == 0, done.stderr
    assert "hosts from the Slurm allocation (SLURM_JOB_NODELIST=node[1-3])" in done.stderr
    assert sorted(done.stdout.splitlines()) == [
        f"[{r}]<stdout>:{r} 6 node{r // 2 + 1} {r % 2} {r // 2} 3" for r in range(6)
    ]


def test_np_below_the_allocation_and_above_it(cluster: SlurmCluster) -> None:
    done = _in_allocation(cluster, "-N2 --ntasks-per-node=2", f"-np 3 -- {SHOW}")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [
        "[0]<stdout>:0 3 node1 0 0 2",
        "[1]<stdout>:1 3 node1 1 0 1",
        "[2]<stdout>:2 3 node2 0 1 2",
    ]
    done = _in_allocation(cluster, "-N2 --ntasks-per-node=1", "-np 3 true")
    assert done.returncode == 2
    assert "-np 3 asks for more ranks than the 2 slots of node1:1,node2:1" in done.stderr
