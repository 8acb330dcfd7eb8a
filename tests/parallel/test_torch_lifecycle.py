"""How hpcdl.torch jobs end and split, with real launchers: a rank that raises or calls ``sys.exit(3)``
right after ``hvd.init()`` ends the job within seconds under ``hpcdl run`` and ``mpirun`` (its peers'
collectives fail at once, naming it), a rank that shuts down leaves without waiting for its peers, and
``hvd.init(comm=...)`` makes a subset of the ranks a job of its own (a list, or an mpi4py communicator).

The rank programs are in ``torch_lifecycle_checks.py``; they print wall-clock times, compared here with
the time the launcher returned.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from _ranks import OPENMPI, RankResult, run_ranks

CHECKS = str(Path(__file__).with_name("torch_lifecycle_checks.py"))
needs_openmpi = pytest.mark.skipif(not Path(OPENMPI).exists(), reason="Open MPI's mpirun is not installed")


def results(rank: RankResult) -> list[dict]:
    """Every ``RESULT <json>`` line the rank printed, in order."""
    return [json.loads(line.split("RESULT ", 1)[1]) for line in rank.stdout.splitlines() if "RESULT " in line]


def merged(rank: RankResult) -> dict:
    out: dict = {}
    for fields in results(rank):
        out.update(fields)
    return out


@pytest.mark.parametrize("launcher", ["hpcdl", pytest.param("openmpi", marks=needs_openmpi)])
@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_rank_failing_after_init_ends_the_job_within_seconds(launcher: str, how: str) -> None:
    ranks = run_ranks(3, CHECKS, launcher=launcher, args=(how,), timeout=120)
    ended = time.time()
    failing = merged(ranks[1])
    assert "failing_at" in failing, ranks[1].stdout + ranks[1].stderr
    assert ranks[0].job_returncode != 0
    # Before, the failing rank's exit-time shutdown waited for rank 0 to shut down too (up to the 60 s
    # timeout), and the launcher saw the failure only then. Now the job ends in 1.7-2.2 s beside six busy
    # loops; beside a full test run, mpirun's teardown and rank 2's exit once took 8.3 s (1 of 11 runs).
    assert ended - failing["failing_at"] < 15.0, f"the job ended {ended - failing['failing_at']:.1f} s after"
    waiting = merged(ranks[2])  # its pending allreduce failed at once, naming the rank
    assert waiting.get("error") == "HpcdlShutdownError", ranks[2].stdout + ranks[2].stderr
    assert "rank 1 has shut down" in waiting["message"], waiting["message"]
    assert waiting["error_at"] - failing["failing_at"] < 1.0, waiting


def test_a_rank_that_shuts_down_leaves_at_once() -> None:
    ranks = run_ranks(2, CHECKS, launcher="hpcdl", args=("leave",), timeout=120)
    assert ranks[0].job_returncode == 0, ranks[0].stdout + ranks[0].stderr + ranks[1].stderr
    leaver, other = merged(ranks[1]), merged(ranks[0])
    # Rank 0 was computing outside hpcdl; its engine thread took part in the shutdown anyway.
    assert leaver["shutdown_seconds"] < 1.0, leaver
    assert "rank 1 has shut down" in other["error"], other
    assert other["usable"] is True and "rank 1 has shut down" in other["later_error"], other


def test_init_with_comm_lists_forms_independent_jobs() -> None:
    ranks = run_ranks(4, CHECKS, launcher="hpcdl", args=("subsets",), timeout=120)
    assert ranks[0].job_returncode == 0, "\n".join(r.stdout + r.stderr for r in ranks)
    first = {0: [0, 2], 2: [0, 2], 3: [3, 1], 1: [3, 1]}
    for world in range(4):
        seen = merged(ranks[world])
        members = first[world]
        assert (seen["rank"], seen["size"]) == (members.index(world), 2), seen
        assert seen["total"] == float(sum(members)), seen
        assert seen["root"] == members[1], seen  # root_rank=1 is the job's rank 1
        assert seen["gathered"] == members, seen
        assert seen["alone"] == (1.0 if seen["rank"] == 0 else None), seen
    # The first job shut down; the second kept working without it.
    assert merged(ranks[3])["still_working"] and merged(ranks[1])["still_working"]


def test_init_with_a_list_that_leaves_out_the_caller_says_so() -> None:
    ranks = run_ranks(2, CHECKS, launcher="hpcdl", args=("outsider",), timeout=120)
    for world in range(2):
        message = merged(ranks[world])["error"]
        assert message and f"world rank {world}, which is not in the list" in message, message


@needs_openmpi
@pytest.mark.skipif(shutil.which("mpirun.openmpi") is None, reason="needs mpirun.openmpi on PATH")
def test_init_with_an_mpi4py_communicator_under_mpirun() -> None:
    pytest.importorskip("mpi4py", reason="mpi4py is not installed")
    ranks = run_ranks(4, CHECKS, launcher="openmpi", args=("mpi_split",), timeout=120)
    assert ranks[0].job_returncode == 0, "\n".join(r.stdout + r.stderr for r in ranks)
    for world in range(4):
        seen = merged(ranks[world])
        part = [0, 1] if world < 2 else [2, 3]
        assert seen["size"] == 2 and seen["rank"] == seen["part_rank"], seen  # the communicator's order
        assert seen["total"] == float(sum(part)), seen
