"""The Horovod-style example (examples/train_synthetic.py) under ``hpcdl run`` and under real Open MPI
``mpirun``: it trains, prints averaged metrics from rank 0 only, checkpoints on rank 0 and resumes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
EXAMPLE = REPO / "examples" / "train_synthetic.py"
MPIRUN = "/usr/bin/mpirun.openmpi"
SMALL = ["--train-samples", "512", "--val-samples", "256", "--batch-size", "32"]


def _run(command: list[str], env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=240, cwd=REPO, env=dict(os.environ, **(env or {}))
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    return output


def _epochs(output: str) -> list[tuple[int, float, float]]:
    """(epoch, train_loss, val_accuracy) of every epoch line (printed by rank 0 only)."""
    return [
        (int(m.group(1)), float(m.group(2)), float(m.group(3)))
        for m in re.finditer(
            r"epoch (\d+)/\d+: train_loss=([\d.]+) .*?val_accuracy=([\d.]+) .*?ranks=2", output
        )
    ]


def test_example_trains_checkpoints_and_resumes_under_hpcdl_run(tmp_path: Path) -> None:
    launcher = [sys.executable, "-m", "hpcdl", "run", "-np", "2", sys.executable, str(EXAMPLE)]
    checkpoints = tmp_path / "ckpt"
    output = _run([*launcher, "--epochs", "2", "--checkpoint-dir", str(checkpoints), *SMALL])
    epochs = _epochs(output)
    assert [e for e, _, _ in epochs] == [1, 2], output[-3000:]
    assert epochs[1][1] < epochs[0][1], "training loss must go down"
    assert epochs[1][2] > 0.5, "the synthetic task is learnable: accuracy must beat chance (0.1) clearly"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-1.pt", "checkpoint-2.pt"]

    resumed = _run([*launcher, "--epochs", "3", "--checkpoint-dir", str(checkpoints), *SMALL])
    assert [e for e, _, _ in _epochs(resumed)] == [3], resumed[-3000:]
    assert f"resuming from {checkpoints / 'checkpoint-2.pt'} (epoch 2 of 3)" in resumed
    assert (checkpoints / "checkpoint-3.pt").is_file()

    one_rank = [sys.executable, "-m", "hpcdl", "run", "-np", "1", sys.executable, str(EXAMPLE)]
    again = _run([*one_rank, "--epochs", "3", "--checkpoint-dir", str(checkpoints), *SMALL])
    assert "epoch 4" not in again  # README's second run: it says why it trains nothing
    assert f"{checkpoints / 'checkpoint-3.pt'} holds epoch 3 of 3: nothing left to train" in again


@pytest.mark.skipif(shutil.which(MPIRUN) is None, reason="Open MPI's mpirun.openmpi is not installed")
def test_example_runs_under_open_mpi_mpirun(tmp_path: Path) -> None:
    command = [
        MPIRUN,
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        "2",
        sys.executable,
        str(EXAMPLE),
        "--epochs",
        "2",
        "--fp16-allreduce",
        "--batches-per-allreduce",
        "2",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        *SMALL,
    ]
    env = {"OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo"}
    output = _run(command, env)
    epochs = _epochs(output)
    assert [e for e, _, _ in epochs] == [1, 2], output[-3000:]
    assert epochs[1][1] < epochs[0][1]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["checkpoint-1.pt", "checkpoint-2.pt"]
