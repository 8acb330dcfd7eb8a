"""Real scaling studies on this machine: ``hpcdl scaling run`` at W = 1, 2, 4 through ``hpcdl run``, strong
and weak, with the built-in model and with a user's script, down to the report and the pictures.

A small model (the built-in CNN on 16x16 images) and few steps keep each study well under a minute.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from runner_helpers import clean_env, read_pids, wait_gone

from hpcdl.scaling import plots

STUDY_OPTIONS = ["-W", "1,2,4", "--steps", "3", "--warmup", "1", "--repeats", "2", "--image-size", "16"]


def scaling(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcdl", "scaling", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=clean_env(),
    )


def pixels_of(image: np.ndarray, colour: str, tolerance: float = 0.02) -> int:
    """How many pixels of an RGBA image are (almost exactly) ``colour``."""
    rgb = np.array([int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return int(np.sum(np.all(np.abs(image[:, :, :3] - rgb) <= tolerance, axis=2)))


def check_pictures(directory: Path) -> None:
    from matplotlib.image import imread

    size = (int(plots.SIZE_INCHES[1] * plots.DPI), int(plots.SIZE_INCHES[0] * plots.DPI))
    speedup = imread(directory / "speedup.png")
    assert speedup.shape[:2] == size
    # each curve left a line of its own colour: measured (with markers), model and the dashed ideal line
    assert pixels_of(speedup, plots.MEASURED) > 300
    assert pixels_of(speedup, plots.MODEL) > 500
    assert pixels_of(speedup, plots.IDEAL) > 300
    efficiency = imread(directory / "efficiency.png")
    assert efficiency.shape[:2] == size
    assert pixels_of(efficiency, plots.MEASURED) > 300 and pixels_of(efficiency, plots.MODEL) > 500
    assert pixels_of(efficiency, plots.THRESHOLD) > 200
    breakdown = imread(directory / "breakdown.png")
    assert breakdown.shape[:2] == size
    # three stacked bars; how much of each is compute depends on the machine's load, their sum does not
    compute, communication = pixels_of(breakdown, plots.COMPUTE), pixels_of(breakdown, plots.COMMUNICATION)
    assert compute > 2_000 and compute + communication > 20_000, (compute, communication)
    assert (directory / "speedup.svg").read_text().lstrip().startswith("<?xml")


def check_points(directory: Path, mode: str) -> list[dict]:
    data = json.loads((directory / "results.json").read_text())
    points = data["points"]
    assert [p["workers"] for p in points] == [1, 2, 4]
    t1 = points[0]["step_s"]
    for p in points:
        assert p["repeats"] == 2 and len(p["runs"]) == 2 and p["step_s"] > 0
        assert p["step_min_s"] <= p["step_s"] <= p["step_max_s"]
        assert all(r["steps"] == 3 and r["timing"] == "steps" for r in p["runs"])  # warm-up discarded
        assert 0 <= p["communication_s"] < p["step_s"]  # measured waits, a part of the step
        assert p["compute_s"] == pytest.approx(p["step_s"] - p["communication_s"])
        expected = t1 / (p["workers"] * p["step_s"]) if mode == "strong" else t1 / p["step_s"]
        assert p["efficiency"] == pytest.approx(expected)
        assert p["throughput_samples_per_s"] == pytest.approx(
            p["batch_per_worker"] * p["workers"] / p["step_s"]
        )
        assert p["reduced_bytes"] == 5_180_200  # the small CNN's float32 gradients
    assert data["model"]["compute_s"]["value"] == pytest.approx(t1)
    return points


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strong", "weak"])
def test_a_local_study_measures_fits_and_draws(tmp_path: Path, mode: str) -> None:
    batch = ["--global-batch", "16", "--timeline", "2"] if mode == "strong" else ["--batch", "4"]
    done = scaling("run", f"--{mode}", *STUDY_OPTIONS, *batch, "-o", "study", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    study = tmp_path / "study"
    points = check_points(study, mode)
    expected_batches = [16, 8, 4] if mode == "strong" else [4, 4, 4]
    assert [p["batch_per_worker"] for p in points] == expected_batches
    check_pictures(study)
    report = (study / "report.md").read_text()
    assert f"# {mode.capitalize()} scaling: built-in small model" in report
    assert "### Measured against the model" in report and "### Predicted" in report
    assert f"hpcdl scaling run --{mode}" in report  # the command that made it
    # the terminal got the same report with its text plots, and the repeats' progress as lines
    assert "o measured" in done.stdout and "# compute, = communication" in done.stdout
    assert "W=4 repeat 2/2:" in done.stderr and "ms per step" in done.stderr
    # every run's ranks wrote their records in the run's own directory
    for w in (1, 2, 4):
        for r in (1, 2):
            assert len(list((study / "points" / f"W{w}" / f"repeat-{r}").glob("steps.rank*.jsonl"))) == w

    if mode == "strong":  # rank 0 recorded an engine timeline of two measured steps of each run
        trace = study / "points" / "W2" / "repeat-1" / "timeline.json"
        picture = subprocess.run(
            [sys.executable, "-m", "hpcdl", "timeline", "step", str(trace)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert picture.returncode == 0, picture.stderr
        lanes = picture.stdout.splitlines()
        assert lanes[1].startswith("rank 0 ") and lanes[2].startswith("rank 1 ") and "fused" in picture.stdout
        assert (trace.parent / "timeline-step2.png").stat().st_size > 5_000  # steps 1 and 2 traced: the later

    # the report can be made again (other threshold), and never over the user's own file
    again = scaling("report", "study", "--threshold", "0.9", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads((study / "results.json").read_text())["threshold"] == 0.9
    (study / "report.md").write_text("my own notes")
    refused = scaling("report", "study", cwd=tmp_path)
    assert refused.returncode == 2 and "add --force" in refused.stderr
    assert (study / "report.md").read_text() == "my own notes"


USER_SCRIPT = """
import os, sys, time
import torch
import hpcdl.torch as hvd

hvd.init()
size = int(sys.argv[sys.argv.index("--size") + 1])
assert size == int(os.environ["SIZE"]), (size, os.environ["SIZE"])
model = torch.nn.Linear(size, 10)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
timer = hvd.StepTimer(samples_per_step=8)
timer.watch(optimizer)
x = torch.randn(8, size)
for _ in range(4):
    with timer.step():
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        time.sleep(0.005)
hvd.shutdown()
"""


def test_a_users_script_with_a_swept_parameter(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(USER_SCRIPT)
    done = scaling(
        "run", "--weak", "-W", "1,2", "--warmup", "1", "--repeats", "1", "--param", "SIZE=100,200", "-o", "s",
        "--", "train.py", "--size", "{SIZE}",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "s" / "results.json").read_text())
    assert [p["param_SIZE"] for p in data["points"]] == ["100", "200"]
    assert [p["reduced_bytes"] for p in data["points"]] == [(100 * 10 + 10) * 4, (200 * 10 + 10) * 4]
    assert all(r["steps"] == 3 for p in data["points"] for r in p["runs"])
    assert "SIZE = 100, 200" in (tmp_path / "s" / "report.md").read_text()


def test_a_script_without_step_records_is_timed_whole(tmp_path: Path) -> None:
    (tmp_path / "sleepy.py").write_text("import time\ntime.sleep(0.3)\n")
    done = scaling(
        "run", "--strong", "-W", "1,2", "--repeats", "1", "-o", "s", "--", "sleepy.py", cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "s" / "results.json").read_text())
    assert data["timing"] == "run"
    for p in data["points"]:
        assert p["communication_s"] is None and 0.3 <= p["step_s"] < 10
    assert "timed whole run(s)" in (tmp_path / "s" / "report.md").read_text()


def test_a_failing_run_stops_the_study_and_shows_why(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise SystemExit('no data found in /scratch/x')\n")
    again = ("run", "--strong", "-W", "1", "--repeats", "1", "-o", "s", "--", "broken.py")
    done = scaling(*again, cwd=tmp_path)
    assert done.returncode == 2
    assert "W=1 repeat 1 failed (hpcdl run exit 1)" in done.stderr
    assert "no data found in /scratch/x" in done.stderr
    assert "points/W1/repeat-1/output.log" in done.stderr
    # The corrected rerun needs no --force: what the failed run left is hpcdl's own, not the user's.
    (tmp_path / "broken.py").write_text("pass\n")
    done = scaling(*again, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "s" / "failed.txt").exists() and (tmp_path / "s" / "report.md").is_file()
    done = scaling(*again, cwd=tmp_path)  # a study that succeeded is kept unless --force
    assert done.returncode == 2 and "already holds a study" in done.stderr


def test_a_run_past_its_deadline_is_stopped_with_its_ranks(tmp_path: Path) -> None:
    (tmp_path / "stuck.py").write_text(
        "import os, time\n"
        "open(f'rank{os.environ[\"HPCDL_RANK\"]}.pid', 'w').write(str(os.getpid()))\n"
        "time.sleep(120)\n"
    )
    started = time.monotonic()
    done = scaling(
        "run", "--strong", "-W", "2", "--repeats", "1", "--run-timeout", "8", "-o", "s", "--", "stuck.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2 and time.monotonic() - started < 60
    assert "W=2 repeat 1 did not finish within 8 s and was stopped; raise --run-timeout" in done.stderr
    assert wait_gone(read_pids(tmp_path), 10) == []  # hpcdl run took its ranks down with it
