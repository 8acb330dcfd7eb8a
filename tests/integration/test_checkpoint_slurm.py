"""Preemption-proof training on a real Slurm cluster of two nodes (separate hosts, TCP between the ranks):
a job training a small deterministic model, one rank per node, is preempted at random points, is requeued
by its rank 0 (``scontrol requeue``), resumes, and ends with parameters bitwise equal to those of the same
job never interrupted:

- PyTorch (``tests/parallel/preemptible_train.py``: DistributedOptimizer, ElasticSampler, per-rank noise),
  preempted twice: a signal that rank 1 gets while it waits in a gradient allreduce, then Slurm's USR2 to
  the batch script (``scancel --batch --signal``, as ``--signal=B:USR2@180`` does), which passes it to the
  ranks, with a second USR2 arriving while rank 1 writes its part of the checkpoint; ``hpcdl jobs status``
  then shows the restarts and the steps they resumed from;
- NumPy (``tests/parallel/preemptible_numpy.py``, which starts in a second): a USR2 sent to rank 1's process
  alone; a rank killed while it writes a checkpoint, after which the job fails, the previous checkpoint is
  loadable, and a new submission with the same checkpoint path resumes from it.

Slurm holds a requeued job for about two minutes before it may start again; the tests move that start
time to now (``scontrol update StartTime=now``), which changes nothing else about the requeue.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from slurm_cluster import SlurmCluster, missing_requirements

import hpcdl.checkpoint as ckpt

_MISSING = missing_requirements()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no Slurm test cluster: {_MISSING}")
PROGRAMS = Path(__file__).resolve().parents[1] / "parallel"


@dataclass(frozen=True)
class Program:
    path: Path
    commits: int  # of a whole run
    pause: float  # seconds per step: room for a signal sent from here to land before the run ends


TORCH = Program(PROGRAMS / "preemptible_train.py", 99, 0.02)  # 3 epochs of 32 steps, 3 epoch ends
NUMPY = Program(PROGRAMS / "preemptible_numpy.py", 26, 0.02)  # 2 epochs of 12 steps, 2 epoch ends


@pytest.fixture(scope="module")
def cluster(slurm_cluster: Callable[..., SlurmCluster]) -> SlurmCluster:
    pytest.importorskip("torch")
    return slurm_cluster(nodes=2, gpus_per_node=0)


def hpcdl(cluster: SlurmCluster, workdir: Path, *args: str) -> str:
    """``hpcdl ARGS`` on the login host, from ``workdir`` (where hpcdl keeps its job records); its output."""
    done = cluster.run(
        [sys.executable, "-m", "hpcdl", *args], cwd=workdir, env={"XDG_STATE_HOME": str(workdir)}
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class Job:
    """A job of two ranks (one per node) running a training program with a plan, submitted as a user would:
    ``hpcdl submit --checkpoint PATH`` (USR2 to the batch script 180 s before the walltime, forwarded to
    the ranks; requeue on; the path, the signals, the requeue command and the job id in the ranks'
    environment)."""

    def __init__(
        self,
        cluster: SlurmCluster,
        workdir: Path,
        path: Path,
        plan: list[dict[str, Any]],
        program: Program,
        *extra: str,
    ) -> None:
        self.cluster, self.workdir, self.path, self.steps = cluster, workdir, path, program.commits
        options = ["--scheduler", "slurm", "--nodes", "2", "--time", "10", "--checkpoint", str(path)]
        options += ["--stdout", "out-{job_id}.txt", "-e", "OMP_NUM_THREADS=1"]
        options += ["-e", f"PREEMPT_PLAN={json.dumps(plan)}"]
        command = [sys.executable, str(program.path), "--progress", "--pause", str(program.pause), *extra]
        self.id = hpcdl(cluster, workdir, "submit", *options, *command).strip()
        assert re.fullmatch(r"\d+", self.id), self.id

    @property
    def output(self) -> str:
        path = self.workdir / f"out-{self.id}.txt"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for(self, what: str, found: Callable[[str], Optional[Any]], timeout: float = 90) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = found(self.output)
            if value is not None:
                return value
            time.sleep(0.05)
        raise AssertionError(f"job {self.id}: no {what} within {timeout:.0f} s:\n{self.output[-4000:]}")

    def wait_step(self, run: int, step: int) -> None:
        """Until rank 0 of the job's ``run``-th start (from 1) reports commit ``step`` or later."""

        def reached(text: str) -> Optional[bool]:
            runs = text.split("PID rank=0")
            if len(runs) <= run:
                return None
            steps = [int(s) for s in re.findall(r"^STEP (\d+)$", runs[run], re.M)]
            return True if steps and steps[-1] >= step else None

        self.wait_for(f"step {step} in run {run}", reached)

    def rank_pid(self, run: int, rank: int) -> int:
        def pid(text: str) -> Optional[int]:
            found = re.findall(rf"PID rank={rank} pid=(\d+)", text)
            return int(found[run - 1]) if len(found) >= run else None

        return int(self.wait_for(f"the pid of rank {rank} in run {run}", pid))

    def wait_requeued(self, restarts: int) -> None:
        """Until Slurm has requeued the job ``restarts`` times; then let it start at once. Not within the
        second of the requeue: slurmd refuses a job's credential made in the second its earlier one was
        revoked ("Job credential revoked"), one thing Slurm's delay of a requeued job avoids."""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            state = self.cluster.job_field(self.id, "JobState")
            if self.cluster.job_field(self.id, "Restarts") == str(restarts) and state == "PENDING":
                seen = time.time()
                time.sleep(math.floor(seen) + 1.2 - seen)
                done = self.cluster.run(["scontrol", "update", f"JobId={self.id}", "StartTime=now"])
                assert done.returncode == 0, done.stderr
                return
            assert state not in ("COMPLETED", "FAILED", "CANCELLED"), f"{state}:\n{self.output[-4000:]}"
            time.sleep(0.1)
        raise AssertionError(f"job {self.id} was not requeued a {restarts}. time:\n{self.output[-4000:]}")

    def finish(self, state: str = "COMPLETED") -> None:
        ended = self.cluster.wait_done(self.id, timeout=180)
        assert ended == state, self.output[-5000:]

    def params(self) -> str:
        """The parameters both ranks ended with, once the job completed all its steps."""
        self.finish()
        results = [json.loads(line) for line in re.findall(r"^RESULT (.*)$", self.output, re.M)]
        assert sorted(r["rank"] for r in results) == [0, 1], results
        assert len({r["params"] for r in results}) == 1 and results[0]["steps"] == self.steps, results
        return str(results[0]["params"])


@pytest.fixture(scope="module")
def reference(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """``reference(program, *extra)``: the parameters of that job never interrupted (submitted when first
    asked for, so that it runs beside the test's job; awaited then)."""
    jobs: dict[tuple[Any, ...], Job] = {}

    def submit(program: Program, *extra: str) -> Callable[[], str]:
        key = (program, *extra)
        if key not in jobs:
            workdir = tmp_path_factory.mktemp("reference")
            jobs[key] = Job(cluster, workdir, workdir / "ckpt", [], program, *extra)
        return jobs[key].params

    return submit


@pytest.mark.slow
def test_a_job_preempted_twice_resumes_to_the_same_parameters(
    cluster: SlurmCluster, reference: Callable[..., Callable[[], str]], tmp_path: Path
) -> None:
    expected = reference(TORCH)
    choice = random.Random()
    steps = [
        step for step in range(5, 96) if step % 33
    ]  # a plan acts before a batch's step, not an epoch's end
    first = choice.choice([step for step in steps if step <= 45])
    second = choice.choice([step for step in steps if step >= first + 3])
    print(f"preempted in the allreduce of step {first}, then by Slurm at step {second}")
    plan = [
        {"name": "collective", "rank": 1, "step": first, "action": "signal", "where": "collective"},
        # Rank 0 waits before step `second` until Slurm's signal is there (rank 1, in that step's allreduce).
        {"name": "hold", "rank": 0, "step": second, "action": "hold"},
        {"name": "in-write", "rank": 1, "after": first, "action": "signal", "where": "write"},
    ]
    path = tmp_path / "ckpt"
    job = Job(cluster, tmp_path, path, plan, TORCH)
    job.wait_requeued(1)
    job.wait_step(2, second - 1)
    # What Slurm does 180 s before the walltime (--signal=B:USR2@180): USR2 to the batch script, which
    # passes it to srun, which passes it to every task.
    assert cluster.run(["scancel", "--batch", "--signal=USR2", job.id]).returncode == 0
    job.wait_requeued(2)
    assert job.params() == expected()
    history = ckpt.CheckpointStore(path).history()
    starts = [e["resumed_step"] for e in history if e["event"] == "start"]
    assert starts == [None, first, second], history
    assert [e["ok"] for e in history if e["event"] == "requeue"] == [True, True], history
    assert {e["job"] for e in history} == {job.id}
    assert "PLAN in-write: SIGUSR2 to rank 1" in job.output
    assert cluster.job_field(job.id, "Restarts") == "2"
    status = hpcdl(cluster, tmp_path, "jobs", "status", job.id)
    assert (
        f"checkpoint {path}: 2 restarts (run 1 from the start, run 2 from step {first}, run 3 from step"
        in status
    )
    assert "; last checkpoint: step 99 (finished)" in status


def test_a_signal_to_one_rank_only_stops_the_job_and_it_resumes_to_the_same_parameters(
    cluster: SlurmCluster, reference: Callable[..., Callable[[], str]], tmp_path: Path
) -> None:
    expected = reference(NUMPY, "--shard")
    step = random.Random().choice([step for step in range(3, 25) if step != 13])  # 13: an epoch's end
    # Rank 1 waits before that step until the signal is there (rank 0, in the step's allreduce).
    plan = [{"name": "hold", "rank": 1, "step": step, "action": "hold"}]
    job = Job(cluster, tmp_path, tmp_path / "ckpt", plan, NUMPY, "--shard")
    pid = job.rank_pid(1, rank=1)
    job.wait_step(1, step - 1)
    os.kill(pid, signal.SIGUSR2)  # rank 1's process on node2 alone
    job.wait_requeued(1)
    assert job.params() == expected()
    history = ckpt.CheckpointStore(tmp_path / "ckpt").history()
    assert [e["resumed_step"] for e in history if e["event"] == "start"] == [None, step]
    assert "SIGUSR2; 2 ranks" in job.output


def test_a_rank_killed_in_the_write_leaves_the_previous_checkpoint_for_a_new_submission(
    cluster: SlurmCluster, reference: Callable[..., Callable[[], str]], tmp_path: Path
) -> None:
    expected = reference(NUMPY, "--shard")
    path = tmp_path / "ckpt"
    plan = [
        {"name": "stop", "rank": 0, "step": 17, "action": "signal"},
        {"name": "killed", "rank": 1, "after": 15, "action": "kill", "where": "write"},
    ]
    job = Job(cluster, tmp_path, path, plan, NUMPY, "--shard", "--every", "5")
    job.finish("FAILED")
    found, _, parts = ckpt.load(path)  # the checkpoint before the one rank 1 died writing
    assert (found.manifest.step, sorted(parts)) == (15, [0, 1])
    assert [p.name for p in path.iterdir() if p.name.endswith(".partial")] == [".ckpt-000004-step-17.partial"]
    again = Job(cluster, tmp_path, path, plan, NUMPY, "--shard", "--every", "5")
    assert again.params() == expected()
    starts = [e["resumed_step"] for e in ckpt.CheckpointStore(path).history() if e["event"] == "start"]
    assert starts == [None, 15]
