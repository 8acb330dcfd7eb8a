"""The same script under real mpirun/mpiexec: Open MPI (ranks meet through MPI; MPI as the transport
too), MPICH with this build (which does not link MPICH's MPI: ranks meet over TCP through MASTER_ADDR),
and MPICH with the runtime built against MPICH (ranks meet through MPICH; MPICH as the transport too)."""

from __future__ import annotations

import os
import shutil
import subprocess
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


@pytest.fixture(scope="module")
def mpich_runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The collectives built against MPICH (mpicc.mpich), as a site whose MPI is MPICH would build them."""
    build = tmp_path_factory.mktemp("mpich-build")
    configure = [
        "cmake", "-S", str(Path(__file__).parents[2] / "collectives"), "-B", str(build), "-G", "Ninja",
        "-DCMAKE_BUILD_TYPE=Release", "-DHPCDL_WITH_MPI=ON", "-DMPI_C_COMPILER=/usr/bin/mpicc.mpich",
    ]  # fmt: skip
    for cmd in (configure, ["ninja", "-C", str(build)]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return build / "_collectives.so"


needs_mpich = pytest.mark.skipif(
    not shutil.which(MPICH) or not Path("/usr/bin/mpicc.mpich").exists(), reason="mpich is not installed"
)


@needs_mpich
def test_check_build_names_mpich_for_a_runtime_built_against_it(mpich_runtime: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "check-build", "--verbose"],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, HPCDL_LIBRARY=str(mpich_runtime)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    mpi_lines = [line for line in done.stdout.splitlines() if line.startswith("    [X] MPI (MPICH ")]
    assert len(mpi_lines) == 2, done.stdout  # controller and tensor operation


@needs_mpich
@pytest.mark.parametrize("transport", ["auto", "mpi"])
def test_mpich_built_runtime_meets_through_mpich(mpich_runtime: Path, transport: str) -> None:
    env = {"HPCDL_LIBRARY": str(mpich_runtime), "HPCDL_TRANSPORT": transport}
    results = run_ranks(3, CHECKS, launcher="mpich-mpi", env=env, timeout=180)
    passed(results, 3)
    assert all(r.result["mpi_enabled"] for r in results)
    assert {r.result["transport_local"] for r in results} == {"shm" if transport == "auto" else "mpi"}
