"""``hpcdl run`` inside a real Slurm allocation (``salloc`` on the test cluster's login host): the hosts
and slots come from SLURM_JOB_NODELIST / SLURM_TASKS_PER_NODE, and the nodes are separate hosts."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator

import pytest
from slurm_cluster import SlurmCluster, missing_requirements

_MISSING = missing_requirements()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no Slurm test cluster: {_MISSING}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    made = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=3, gpus_per_node=0)
    try:
        yield made.start()
    finally:
        made.stop()


def _in_allocation(cluster: SlurmCluster, salloc_args: str, run_args: str) -> subprocess.CompletedProcess:
    """``salloc SALLOC_ARGS hpcdl run RUN_ARGS`` on the cluster's login host."""
    argv = ["salloc", *shlex.split(salloc_args), sys.executable, "-m", "hpcdl", "run", *shlex.split(run_args)]
    return cluster.run(argv, timeout=120)


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
