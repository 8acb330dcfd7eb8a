"""The TensorFlow and Keras examples under ``hpcdl run -np 2``: they train (loss down, accuracy well above
chance), print averaged metrics from rank 0 only, checkpoint on rank 0, and the Keras one resumes from its
last checkpoint with the distributed optimizer restored; ``hpcdl submit --dry-run`` renders both."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow", reason="TensorFlow is not installed: pip install 'hpcdl[tensorflow]'")

REPO = Path(__file__).resolve().parent.parent.parent
KERAS_EXAMPLE = REPO / "examples" / "keras_mnist_synthetic.py"
TAPE_EXAMPLE = REPO / "examples" / "tensorflow_gradient_tape_synthetic.py"


def _run(*command: str) -> str:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    return output


def _on_two_ranks(example: Path, *args: str) -> str:
    return _run(sys.executable, "-m", "hpcdl", "run", "-np", "2", sys.executable, str(example), *args)


def _epochs(output: str) -> list[tuple[int, float, float]]:
    """(epoch, loss, accuracy) of every epoch line: printed by rank 0 only."""
    lines = re.findall(r"\[(\d)\]<stdout>:epoch (\d+)/\d+: loss=([\d.]+) accuracy=([\d.]+) .*ranks=2", output)
    assert {rank for rank, *_ in lines} <= {"0"}, "only rank 0 prints"
    return [(int(e), float(loss), float(acc)) for _, e, loss, acc in lines]


def test_keras_example_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    small = ["--train-samples", "2048", "--val-samples", "512", "--checkpoint-dir", str(tmp_path)]
    epochs = _epochs(_on_two_ranks(KERAS_EXAMPLE, "--epochs", "2", *small))
    assert [e for e, _, _ in epochs] == [1, 2] and epochs[1][1] < epochs[0][1], epochs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1.keras", "checkpoint-2.keras"]
    resumed = _epochs(_on_two_ranks(KERAS_EXAMPLE, "--epochs", "3", "--fp16-allreduce", *small))
    assert [e for e, _, _ in resumed] == [3], resumed
    assert resumed[0][1] < epochs[1][1], "the resumed run goes on from the checkpoint, not from scratch"
    # three short epochs: 0.3984 has been seen, so the bound is three times chance
    assert resumed[0][2] > 0.3, "the task is learnable: accuracy must beat chance (0.1) clearly"


def test_gradient_tape_example_trains_and_checkpoints_on_rank_zero(tmp_path: Path) -> None:
    output = _on_two_ranks(
        TAPE_EXAMPLE, "--epochs", "2", "--samples", "2048", "--checkpoint-dir", str(tmp_path)
    )
    epochs = _epochs(output)
    assert [e for e, _, _ in epochs] == [1, 2] and epochs[1][1] < epochs[0][1], epochs
    assert epochs[1][2] > 0.5, "the task is learnable: accuracy must beat chance (0.1) clearly"
    assert sorted(p.name for p in tmp_path.glob("*.index")) == ["checkpoint-1.index", "checkpoint-2.index"]


@pytest.mark.parametrize("example", [KERAS_EXAMPLE, TAPE_EXAMPLE], ids=lambda p: p.stem)
def test_submit_renders_the_examples(example: Path) -> None:
    relative = example.relative_to(REPO)
    submit = ["submit", "-s", "slurm", "--dry-run", "-N", "2", "--ranks-per-node", "2", "-t", "20"]
    script = _run(sys.executable, "-m", "hpcdl", *submit, str(relative), "--epochs", "3")
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=2" in script
    # The job runs the example with the interpreter that rendered it (the one submit was run with).
    line = rf"^srun .* {re.escape(sys.executable)} {re.escape(str(relative))} --epochs 3$"
    assert re.search(line, script, re.MULTILINE), script
