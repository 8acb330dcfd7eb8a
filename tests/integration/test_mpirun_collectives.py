"""The same script under real mpirun/mpiexec, with the one installation: Open MPI (ranks meet through Open
MPI's library, found at run time; MPI as the transport too), MPICH given MASTER_ADDR (ranks meet over TCP),
and MPICH without it (ranks meet through MPICH's library; MPICH as the transport too)."""

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
    not built().mpi.available, reason="this hpcdl finds no MPI library (see hpcdl check-build --verbose)"
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


IDLE_ENGINE = """
import json, time
import numpy as np
import hpcdl.common as hc
from hpcdl.common import engine

hc.init()
x = np.ones(1, np.float32)
engine.allreduce_async(x, name="warm", op=hc.ReduceOp.SUM, out=x).wait()
hc.barrier()
cpu, wall = time.process_time(), time.monotonic()
time.sleep(2.0)  # the training's compute: the engine has nothing to do
idle = (time.process_time() - cpu) / (time.monotonic() - wall)
out = engine.synchronize(engine.allreduce_async(np.ones(1, np.float32), name="after", op=hc.ReduceOp.SUM))
print("RESULT " + json.dumps({"idle_cpu": idle, "after": float(out[0])}), flush=True)
hc.shutdown()
"""


@needs_openmpi
@needs_mpi_build
def test_an_idle_engine_over_mpi_leaves_the_cores_to_the_training() -> None:
    # MPI cannot block on a message with a timeout; polling for the peers' doorbells every 50 us took 30%
    # of a core while the engine was idle. It now backs off to one look a millisecond.
    results = run_ranks(2, IDLE_ENGINE, launcher="openmpi", env={"HPCDL_TRANSPORT": "mpi"}, timeout=120)
    for r in results:
        assert r.result is not None, f"rank {r.rank}: {r.stdout}\n{r.stderr}\n{r.extra}"
        assert r.result["after"] == 2.0
        assert r.result["idle_cpu"] < 0.10, r.result


@pytest.mark.skipif(not shutil.which(MPICH), reason="mpiexec.mpich is not installed")
def test_mpich_mpiexec_meets_over_tcp() -> None:
    results = run_ranks(2, CHECKS, launcher="mpich", timeout=180)
    passed(results, 2)
    assert not any(r.result["mpi_enabled"] for r in results)


needs_mpich = pytest.mark.skipif(not shutil.which(MPICH), reason="mpich is not installed")


@needs_mpich
@pytest.mark.parametrize("transport", ["auto", "mpi"])
def test_mpich_mpiexec_meets_through_mpich(transport: str) -> None:
    results = run_ranks(3, CHECKS, launcher="mpich-mpi", env={"HPCDL_TRANSPORT": transport}, timeout=180)
    passed(results, 3)
    assert all(r.result["mpi_enabled"] for r in results)
    assert {r.result["transport_local"] for r in results} == {"shm" if transport == "auto" else "mpi"}


@needs_mpich
def test_an_mpi_library_of_the_wrong_family_is_refused_with_advice() -> None:
    # HPCDL_MPI names Open MPI's library under MPICH's mpiexec: MPICH's ranks cannot meet through it.
    results = run_ranks(2, CHECKS, launcher="mpich-mpi", env={"HPCDL_MPI": "openmpi"}, timeout=120)
    for r in results:
        assert r.result is None
        assert "cannot meet through MPICH/PMI mpiexec's MPI" in r.stderr, r.stderr


@needs_mpich
def test_hpcdl_mpi_may_name_the_library_itself() -> None:
    (library,) = Path("/usr/lib").glob("*/libmpich.so.12")  # as a module's LD_LIBRARY_PATH would give it
    results = run_ranks(2, CHECKS, launcher="mpich-mpi", env={"HPCDL_MPI": str(library)}, timeout=120)
    passed(results, 2)
    assert all(r.result["mpi_enabled"] for r in results)
