"""A scaling study submitted to the real test Slurm (two nodes, separate hosts), watched and collected."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, missing_requirements

pytestmark = pytest.mark.skipif(missing_requirements() is not None, reason=str(missing_requirements()))


@pytest.fixture(scope="module")
def cluster(slurm_cluster: Callable[..., SlurmCluster]) -> SlurmCluster:
    return slurm_cluster(nodes=2, gpus_per_node=0)


def hpcdl(
    cluster: SlurmCluster, workdir: Path, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess:
    """``hpcdl ARGS`` on the cluster's login host."""
    env = {"XDG_STATE_HOME": str(workdir / "state")}
    return cluster.run([sys.executable, "-m", "hpcdl", *args], cwd=workdir, env=env, timeout=timeout)


@pytest.mark.slow
def test_a_study_runs_as_one_job_array_per_worker_count_and_is_collected(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    options = ["-W", "1,2,4", "--steps", "3", "--warmup", "1", "--repeats", "2", "--image-size", "16"]
    batch = ["--submit", "--scheduler", "slurm", "--ranks-per-node", "2", "-t", "10"]
    done = hpcdl(
        cluster, tmp_path, "scaling", "run", "--strong", *options, "--global-batch", "16", *batch, "-o", "s"
    )
    assert done.returncode == 0, done.stderr
    study = tmp_path / "s"
    jobs = json.loads((study / "jobs.json").read_text())
    assert [(j["workers"], j["repeats"], j["scheduler"]) for j in jobs] == [
        (1, [1, 2], "slurm"),
        (2, [1, 2], "slurm"),
        (4, [1, 2], "slurm"),
    ]
    # the jobs asked Slurm for the points' geometry: W=4 is two nodes of two ranks
    script = (study / "points" / "W4" / "job.slurm.sh").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --array=0-1" in script
    assert "hpcdl.scaling.synthetic" in script and "--batch 4" in script

    early = hpcdl(cluster, tmp_path, "scaling", "collect", "s")
    if early.returncode != 0:  # still queued or running: says which, and how to wait
        assert "have not finished" in early.stderr and "--wait" in early.stderr

    watched = hpcdl(cluster, tmp_path, "jobs", "watch", "--study", "s", "--interval", "1", timeout=400)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert "all 3 job(s) ended: 6 COMPLETED" in watched.stderr
    assert f"{jobs[2]['job_id']}_1 scaling-W4 COMPLETED" in watched.stdout  # state changes, one per line

    collected = hpcdl(cluster, tmp_path, "scaling", "collect", "s", "--wait", "--interval", "1", timeout=400)
    assert collected.returncode == 0, collected.stderr
    data = json.loads((study / "results.json").read_text())
    points = data["points"]
    assert [p["workers"] for p in points] == [1, 2, 4]
    assert all(p["repeats"] == 2 and p["step_s"] > 0 and p["communication_s"] is not None for p in points)
    assert all(len(list((study / "points" / f"W{w}").glob("job-*_*.out"))) == 2 for w in (1, 2, 4))
    assert data["study"]["launch"] == "batch" and (study / "speedup.png").stat().st_size > 10_000
    assert "as batch jobs" in (study / "report.md").read_text()


def test_an_impossible_geometry_is_refused_before_anything_is_submitted(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    done = hpcdl(
        cluster, tmp_path, "scaling", "run", "--strong", "-W", "1,3", "--global-batch", "6", "--submit",
        "--scheduler", "slurm", "--ranks-per-node", "2", "-o", "s",
    )  # fmt: skip
    assert done.returncode == 2
    assert "3 workers do not fill nodes of 2 ranks" in done.stderr
    assert not (tmp_path / "s").exists()  # not even the study directory was made
