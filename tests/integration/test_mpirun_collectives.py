"""The same script under real mpirun/mpiexec: Open MPI (ranks meet through MPI; MPI as the transport
too) and MPICH (whose MPI this build does not link: ranks meet over TCP through MASTER_ADDR)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "parallel"))
from _ranks import MPICH, OPENMPI, run_ranks

from hpcdl.common import built

CHECKS = str(Path(__file__).parents[1] / "parallel" / "_collective_checks.py")


def passed(results, np_: int) -> None:
    assert len(results) == np_
    for r in results:
        assert r.result is not None, f"rank {r.rank}: {r.stdout}\n{r.stderr}\n{r.extra}"
        assert r.result["failures"] == [], r.result["failures"]
        assert r.result["rank"] == r.rank and r.result["size"] == np_


needs_openmpi = pytest.mark.skipif(not shutil.which(OPENMPI), reason="mpirun.openmpi is not installed")
needs_mpi_build = pytest.mark.skipif(
    built().mpi.detail.split(" 4")[0] != "Open MPI", reason="this hpcdl was built without Open MPI"
)


@needs_openmpi
@needs_mpi_build
@pytest.mark.parametrize("np_", [2, 3])
def test_openmpi_mpirun_meets_through_mpi(np_: int) -> None:
    results = run_ranks(np_, CHECKS, launcher="openmpi", timeout=180)
    passed(results, np_)
    assert all(r.result["mpi_enabled"] for r in results)
    assert {r.result["transport_local"] for r in results} == {"shm"}


@needs_openmpi
@needs_mpi_build
def test_openmpi_as_the_transport() -> None:
    results = run_ranks(3, CHECKS, launcher="openmpi", env={"HPCDL_TRANSPORT": "mpi"}, timeout=180)
    passed(results, 3)
    assert {r.result["transport_local"] for r in results} == {"mpi"}


@pytest.mark.skipif(not shutil.which(MPICH), reason="mpiexec.mpich is not installed")
def test_mpich_mpiexec_meets_over_tcp() -> None:
    results = run_ranks(2, CHECKS, launcher="mpich", timeout=180)
    passed(results, 2)
    assert not any(r.result["mpi_enabled"] for r in results)
