"""The first failure named under real MPI launchers: ``hpcdl run --mpi`` (Open MPI's mpirun and MPICH's
mpiexec) names the raising rank in its summary every time, and under a bare Open MPI ``mpirun``, whose own
message names whichever rank it saw exit first, the ranks that failed because of it say so in their own
output and quote its error (their last words, kept in the job's debug directory)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl.runner.mpi import MPICH, OPENMPI

RANKS = str(Path(__file__).parents[1] / "parallel" / "first_failure_ranks.py")
LAUNCHERS = {OPENMPI: "/usr/bin/mpirun.openmpi", MPICH: "/usr/bin/mpiexec.mpich"}
HOST = socket.gethostname()
RAISE_LINE = next(
    n for n, line in enumerate(Path(RANKS).read_text().splitlines(), 1) if "raise ValueError" in line
)


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "PBS_", "LSB_", "COBALT_", "FLUX_", "HPCDL_", "PMIX_", "OMPI_"))
    }
    env.update(OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo", **extra)
    return env


def _launcher(flavor: str) -> str:
    if not os.access(LAUNCHERS[flavor], os.X_OK):
        pytest.skip(f"{LAUNCHERS[flavor]} is not installed (apt install openmpi-bin mpich)")
    return LAUNCHERS[flavor]


@pytest.mark.parametrize("flavor", [OPENMPI, MPICH])
def test_hpcdl_run_mpi_names_the_raising_rank_every_time(flavor: str, tmp_path: Path) -> None:
    """Four jobs at 2 and 3 ranks, then one whose culprit exits only after the others failed."""
    mpirun = _launcher(flavor)
    for run in range(5):
        num_proc = 2 + run % 2
        culprit = (run + 1) % num_proc
        extra = {"CULPRIT": str(culprit), **({"SLOW_EXIT": "1.0"} if run == 4 else {})}
        done = subprocess.run(
            [sys.executable, "-m", "hpcdl", "run", "--mpi", "--mpirun", mpirun, "-np", str(num_proc),
             sys.executable, RANKS, "raise"],
            capture_output=True, text=True, timeout=120, env=_env(**extra), cwd=tmp_path,
        )  # fmt: skip
        ours = [line for line in done.stderr.splitlines() if line.startswith("hpcdl run: ")]
        assert done.returncode == 1, done.stderr
        head = (
            f"hpcdl run: rank {culprit} on host {HOST} failed first, with ValueError: boom on rank {culprit}"
        )
        assert ours[0].startswith(f"{head} ("), f"run {run}: {done.stderr}"
        assert ours[1] == f"hpcdl run: its error (rank {culprit} on host {HOST}):"
        assert all("HpcdlShutdownError" in line for line in ours[2:]), ours


def mpirun_crashed(output: str) -> bool:
    """Open MPI 4.1's mpirun itself died of a signal (seen in PMIx_Finalize while it aborted a job); the
    ranks' output it had not forwarded yet is lost with it."""
    return "*** Process received signal ***" in output and "/mpirun.openmpi(" in output


def test_bare_mpirun_ranks_point_at_the_raising_rank(tmp_path: Path) -> None:
    """mpirun's own message names whichever rank it saw exit first (a consequence, in most runs); every
    rank that failed because of the culprit says so, with the culprit's error, in each of six jobs. A job
    whose mpirun crashed says nothing of hpcdl: it runs again (twice at most)."""
    mpirun = _launcher(OPENMPI)
    for run in range(6):
        num_proc = 2 + run % 2
        culprit = (run + 1) % num_proc
        for attempt in range(3):
            workdir = tmp_path / f"job{run}.{attempt}"
            workdir.mkdir()
            done = subprocess.run(
                [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(num_proc), sys.executable,
                 RANKS, "raise"],
                capture_output=True, text=True, timeout=120, env=_env(CULPRIT=str(culprit)), cwd=workdir,
            )  # fmt: skip
            output = done.stdout + done.stderr
            if not mpirun_crashed(output):
                break
        assert done.returncode != 0, output
        pointers = [line for line in output.splitlines() if line.startswith("hpcdl: rank ")]
        assert pointers, f"run {run}: no rank said it failed because of another:\n{output}"
        for line in pointers:
            assert line.endswith(
                f"'s error above is a consequence of rank {culprit}'s end, not its cause. Rank {culprit} "
                f"failed first, on host {HOST}: ValueError: boom on rank {culprit} "
                f'(File "{RANKS}", line {RAISE_LINE}, in fail).'
            ), line
        (job,) = (workdir / "hpcdl-debug").iterdir()  # named after mpirun's job (its PMIx namespace)
        words = json.loads((job / f"exit.rank{culprit}.json").read_text())
        assert words["error"] == f"ValueError: boom on rank {culprit}" and not words["consequence"]
        assert oct((job / f"exit.rank{culprit}.json").stat().st_mode & 0o777) == "0o600"
        assert oct(job.stat().st_mode & 0o777) == "0o700"
