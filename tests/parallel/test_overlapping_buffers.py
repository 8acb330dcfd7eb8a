"""Output buffers that overlap the input anywhere but exactly in place are refused with an error that says so,
on shared memory and over TCP, through the direct calls (hpcdl.common, the C ABI) and the engine; in-place and
disjoint calls still reduce right. Before, such calls returned wrong sums: every transport reads its input
while it writes its output."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from runner_helpers import hpcdl_run, rank_lines

RANK = str(Path(__file__).with_name("overlapping_buffers_rank.py"))


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_overlapping_output_is_refused_and_in_place_still_works(transport: str) -> None:
    done, _ = hpcdl_run("-np", "2", sys.executable, RANK, HPCDL_TRANSPORT=transport, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in range(2):
        cases = dict(line.split()[1:3] for line in rank_lines(done.stdout, rank) if line.startswith("CASE "))
        assert len(cases) == 22, cases
        for name, outcome in cases.items():
            expected = "right" if name.endswith((".inplace", ".apart")) else "refused"
            assert outcome == expected, (rank, name, outcome)
