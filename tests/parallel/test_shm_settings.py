"""Ranks of one host that disagree on the shared-memory layout (HPCDL_SHM_CHUNK_BYTES) get a clear error
naming both values on every rank, at once, instead of SIGBUS (a member mapping past the end of the
segment) or wrong sums (members reading each other's buffers at the wrong offsets)."""

from __future__ import annotations

import time

import pytest
from _ranks import run_ranks

# Each rank takes its own setting from argv before init: `hpcdl run` hands every rank the same environment.
PROGRAM = """
import json, os, sys
os.environ["HPCDL_SHM_CHUNK_BYTES"] = sys.argv[1 + int(os.environ["HPCDL_RANK"])]
import numpy as np
import hpcdl.common as hc
from hpcdl.common.exceptions import HpcdlError
try:
    hc.init()
    x = np.ones(1 << 21, dtype=np.float32)
    hc.allreduce(x, out=x)
    print("RESULT " + json.dumps({"sum": float(x[0])}), flush=True)
except HpcdlError as exc:
    print("RESULT " + json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
"""
MIB = 1 << 20


@pytest.mark.parametrize(("rank0", "rank1"), [(2 * MIB, 4 * MIB), (4 * MIB, MIB)])
def test_different_chunk_sizes_per_rank_are_a_clear_error(rank0: int, rank1: int) -> None:
    started = time.monotonic()
    results = run_ranks(2, PROGRAM, env={"HPCDL_TIMEOUT": "60"}, args=(str(rank0), str(rank1)), timeout=120)
    elapsed = time.monotonic() - started
    assert results[0].job_returncode == 0, results[0].extra  # no rank was killed (SIGBUS) or hung
    both = f"HPCDL_SHM_CHUNK_BYTES is {rank1} on rank 1 but {rank0} on rank 0"
    for r in results:
        assert r.result is not None, r.stderr
        assert r.result.get("error") == "HpcdlConfigError", r.result
        assert (
            both in r.result["message"]
            and "every rank on a host must use the same value" in r.result["message"]
        )
    assert "refusing the shared memory segment" in results[1].result["message"]
    assert elapsed < 30, f"the refusal took {elapsed:.1f} s: the maker waited instead of failing at once"


def test_equal_chunk_sizes_set_per_rank_work() -> None:
    results = run_ranks(2, PROGRAM, args=(str(MIB), str(MIB)), timeout=120)
    assert [r.result for r in results] == [{"sum": 2.0}, {"sum": 2.0}], results[0].extra
