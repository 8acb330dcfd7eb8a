"""Under a real Slurm ``srun``, a rank that raises or calls ``sys.exit(3)`` right after ``hvd.init()``
ends the step within seconds: it leaves at once (before, its exit-time shutdown waited for the other ranks,
up to the 60 s timeout), ``srun -K`` ends the other tasks, and a rank already waiting in a collective
fails at once naming it. The rank programs are those of ``tests/parallel/torch_lifecycle_checks.py``
(rank 0 computes outside hpcdl for a minute, rank 2 waits in an allreduce)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, missing_requirements

_MISSING = missing_requirements()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no Slurm test cluster: {_MISSING}")
CHECKS = Path(__file__).resolve().parents[1] / "parallel" / "torch_lifecycle_checks.py"


@pytest.fixture(scope="module")
def cluster(slurm_cluster: Callable[..., SlurmCluster]) -> SlurmCluster:
    return slurm_cluster(nodes=2, gpus_per_node=0)


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_srun_ends_the_step_within_seconds_of_a_failing_rank(cluster: SlurmCluster, how: str) -> None:
    # No rendezvous variables: the ranks meet by the Slurm fallback, rank 0 hosting on the step's first node.
    command = ["srun", "--kill-on-bad-exit", "-N2", "-n3", "--export=ALL", sys.executable, str(CHECKS), how]
    done = cluster.run(command, env={"HPCDL_SECRET": "ab" * 32}, timeout=120)
    ended = time.time()
    results = [
        json.loads(line.split("RESULT ", 1)[1]) for line in done.stdout.splitlines() if "RESULT " in line
    ]
    failing = next((r["failing_at"] for r in results if "failing_at" in r), None)
    assert failing is not None and done.returncode != 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert ended - failing < 5.0, f"the step ended {ended - failing:.1f} s after rank 1 failed"
    (waiting,) = [r for r in results if r.get("rank") == 2]
    assert waiting["error"] == "HpcdlShutdownError" and "rank 1 has shut down" in waiting["message"], waiting
    assert waiting["error_at"] - failing < 1.0, waiting
