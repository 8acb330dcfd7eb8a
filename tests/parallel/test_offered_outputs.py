"""Allgather and alltoall through the engine write their result into an output the caller offers (c_api.h)
when it has the usual size, so hpcdl.torch returns it without a copy; a result of another size goes into the
engine's own buffer, and an offer that overlaps the input is refused. Real ranks, shared memory and TCP."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from runner_helpers import hpcdl_run, rank_lines

RANK = str(Path(__file__).with_name("offered_outputs_rank.py"))
EXPECTED = {
    "allgather.equal": "offered",
    "allgather.unequal": "copied",
    "allgather.small": "copied",
    "alltoall.even": "offered",
    "alltoall.uneven": "copied",
    "allgather.overlapping": "refused",
}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_results_go_where_offered_when_they_fit(transport: str) -> None:
    done, _ = hpcdl_run("-np", "3", sys.executable, RANK, HPCDL_TRANSPORT=transport, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in range(3):
        cases = {
            line.split()[1]: line.split()[2:]
            for line in rank_lines(done.stdout, rank)
            if line.startswith("CASE ")
        }
        assert len(cases) == 17, cases
        for name, (where, value) in cases.items():
            expected = EXPECTED.get(name.rsplit(".", 1)[0], "offered")  # torch.allgather, torch.alltoall
            assert (where, value) == (expected, "right"), (rank, name, where, value)
