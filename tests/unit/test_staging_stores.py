"""The shared-memory staging stores (collectives/src/transport/staging_stores.*): the auto choice between
cached and streaming stores, fed synthetic chunk timings, and the two copies (streaming, and whole lines);
and the shared-memory transport feeding each kind of collective's choice with its own chunks' times."""

from __future__ import annotations

import subprocess
from pathlib import Path

from native_programs import SHM_SOURCES, assert_checks_pass, build_program


def test_auto_choice_and_copies(tmp_path: Path) -> None:
    program = build_program(
        "staging_stores_test.cpp", ["transport/staging_stores.cpp"], tmp_path / "staging_stores_test"
    )
    assert_checks_pass(program, 19)


def test_every_collective_times_its_chunks_and_ranks_choose_alike(tmp_path: Path) -> None:
    # Before, only allreduce chunks were timed: allgather, broadcast, alltoall and reducescatter kept cached
    # stores for good, 2.1-2.4x slower where the ranks' cores share no cache (benchmarks/README.md). And the
    # ranks shared their chunk times through one word each, which a rank could overwrite with its next chunk's
    # time while a descheduled peer had not read it yet: the ranks then chose differently. That happened in 6
    # of 40 runs made 4 at a time on 2 cores, so the program runs 4 at a time, 5 times.
    program = build_program("shm_store_choice_test.cpp", SHM_SOURCES, tmp_path / "shm_store_choice_test")
    for _ in range(5):
        jobs = [subprocess.Popen([str(program)], stdout=subprocess.PIPE, text=True) for _ in range(4)]
        for job in jobs:
            out, _ = job.communicate(timeout=120)
            lines = out.splitlines()
            assert [line for line in lines if not line.startswith("ok ")] == [], out
            assert len(lines) == 7, out
            assert job.returncode == 0
