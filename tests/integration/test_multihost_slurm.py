"""Batch jobs across separate hosts: a Slurm cluster whose three nodes are virtual hosts (own hostname,
address and /etc/hosts each). Scripts made by ``hpcdl submit`` for two and three nodes allreduce and train
examples/train_synthetic.py through srun, a PBS script runs through Slurm's Torque wrappers (qsub), and
ranks that meet by the Slurm fallback start while another program holds the ports it would use."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from multihost_checks import assert_spread, occupy, reports, write_report
from slurm_cluster import SlurmCluster, missing_requirements, pals_mpiexec, running_cluster

from hpcdl.platforms import slurm

_MISSING = missing_requirements()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no Slurm test cluster: {_MISSING}")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_synthetic.py"
SMALL = ["--train-samples", "256", "--val-samples", "128", "--batch-size", "32"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with running_cluster(tmp_path_factory.mktemp("slurm"), nodes=3, gpus_per_node=0, pbs_plugin=True) as made:
        yield made


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report(tmp_path_factory.mktemp("scripts"))


def submit(cluster: SlurmCluster, workdir: Path, *args: str) -> str:
    """``hpcdl submit ARGS`` on the login host; the job id."""
    done = cluster.run(
        [sys.executable, "-m", "hpcdl", "submit", *args], cwd=workdir, env={"XDG_STATE_HOME": str(workdir)}
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert re.fullmatch(r"\d+", job_id), done.stdout
    return job_id


def finished_output(cluster: SlurmCluster, workdir: Path, job_id: str, timeout: float = 180) -> str:
    """The job's output once it ended; fails unless it COMPLETED."""
    state = cluster.wait_done(job_id, timeout=timeout)
    output = "".join(p.read_text() for p in sorted(workdir.glob(f"*{job_id}*")) if p.is_file())
    assert state == "COMPLETED", output[-5000:]
    return output


@pytest.mark.parametrize("nodes", [2, 3])
def test_submitted_job_allreduces_across_nodes(
    cluster: SlurmCluster, tmp_path: Path, report: Path, nodes: int
) -> None:
    job_id = submit(cluster, tmp_path, "--scheduler", "slurm", "--nodes", str(nodes), "--ranks-per-node", "2",
                    "-t", "5", sys.executable, str(report))  # fmt: skip
    found = reports(finished_output(cluster, tmp_path, job_id))
    assert_spread(found, [f"node{i}" for i in range(1, nodes + 1)], 2)


@pytest.mark.parametrize("nodes", [2, 3])
def test_submitted_training_runs_across_nodes(cluster: SlurmCluster, tmp_path: Path, nodes: int) -> None:
    pytest.importorskip("torch")
    checkpoints = tmp_path / "ckpt"
    job_id = submit(cluster, tmp_path, "--scheduler", "slurm", "--nodes", str(nodes), "-t", "10",
                    "-e", "OMP_NUM_THREADS=1", sys.executable, str(EXAMPLE), "--epochs", "2",
                    "--checkpoint-dir", str(checkpoints), *SMALL)  # fmt: skip
    output = finished_output(cluster, tmp_path, job_id, timeout=300)
    epochs = re.findall(rf"epoch (\d)/2: train_loss=([\d.]+) .*ranks={nodes}", output)
    assert [e for e, _ in epochs] == ["1", "2"], output[-3000:]
    assert float(epochs[1][1]) < float(epochs[0][1]), "training loss must go down"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-1.pt", "checkpoint-2.pt"]


def test_pbs_script_allreduces_across_nodes_through_qsub(
    cluster: SlurmCluster, tmp_path: Path, report: Path
) -> None:
    qsub = Path("/usr/bin/qsub")
    if not qsub.exists() or "SchedMD" not in qsub.read_text(errors="replace")[:4000]:
        pytest.skip("Slurm's PBS wrappers are not installed (apt-get install slurm-wlm-torque)")
    shim = pals_mpiexec(tmp_path / "pals")
    setup = f"export PATH={shim}:$PATH"
    job_id = submit(cluster, tmp_path, "--scheduler", "pbs", "--nodes", "2", "--ranks-per-node", "2",
                    "-t", "5", "--setup", setup, sys.executable, str(report))  # fmt: skip
    assert_spread(reports(finished_output(cluster, tmp_path, job_id)), ["node1", "node2"], 2)
    assert cluster.job_field(job_id, "NumNodes") == "2"  # from the script's "#PBS -l select=2:..."


def test_slurm_fallback_starts_while_another_program_holds_its_ports(
    cluster: SlurmCluster, tmp_path: Path, report: Path
) -> None:
    """srun ranks with no rendezvous variables meet on the step's first node: rank 0 binds the first free
    port of the job's sequence. Another program on node1 holds the first two (and the port the job id
    alone used to pick)."""
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --nodelist=node1,node2 --ntasks-per-node=2 --output={tmp_path}/out-%j.txt\n"
        f"export HPCDL_SECRET={'7a' * 32}\nsrun {sys.executable} {report}\n"
    )
    held = cluster.run(["sbatch", "--parsable", "--hold", str(script)], cwd=tmp_path)
    assert held.returncode == 0, held.stderr
    job_id = held.stdout.strip()
    assert cluster.hosts is not None
    ports = [*slurm.step_ports(job_id, "0")[:2], 20000 + int(job_id) % 20000]
    holder = occupy(cluster.hosts, "node1", ports)
    try:
        assert cluster.run(["scontrol", "release", job_id]).returncode == 0
        assert_spread(reports(finished_output(cluster, tmp_path, job_id)), ["node1", "node2"], 2)
    finally:
        holder.kill()
