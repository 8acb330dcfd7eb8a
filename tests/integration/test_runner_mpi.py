"""``hpcdl run --mpi`` against the real Open MPI (mpirun.openmpi) and MPICH (mpiexec.mpich)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdl.runner.mpi import MPICH, OPENMPI, detect_flavor

LAUNCHERS = {OPENMPI: "/usr/bin/mpirun.openmpi", MPICH: "/usr/bin/mpiexec.mpich"}
RANK_OF = {OPENMPI: "OMPI_COMM_WORLD_RANK", MPICH: "PMI_RANK"}

SHOW = r"""
import os, sys
rank = os.environ[sys.argv[1]]
secret = os.environ.get("HPCDL_SECRET", "").encode()
exposed = []
for pid in os.listdir("/proc"):
    try:
        if secret and secret in open(f"/proc/{pid}/cmdline", "rb").read():
            exposed.append(pid)
    except OSError:
        pass
print(rank, os.environ.get("FOO"), os.environ.get("HPCDL_CYCLE_TIME"), os.environ.get("HPCDL_TRANSPORT"),
      "HPCDL_RANK" in os.environ, exposed, flush=True)
"""

FAIL = r"""
import os, signal, sys, time
rank = int(os.environ[sys.argv[1]])
if rank == 1:
    time.sleep(0.5)
    print("rank 1 gives up", file=sys.stderr, flush=True)
    if sys.argv[2] == "exit":
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
with open(f"{sys.argv[3]}/rank{rank}.tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(f"{sys.argv[3]}/rank{rank}.tmp", f"{sys.argv[3]}/rank{rank}.pid")
time.sleep(60)
"""


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "PBS_", "LSB_", "COBALT_", "FLUX_"))
    }
    env.update(OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo", HPCDL_RANK="99")
    return env


def _launcher(flavor: str) -> str:
    path = LAUNCHERS[flavor]
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} is not installed (apt install openmpi-bin mpich)")
    return path


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("flavor", [OPENMPI, MPICH])
def test_flavor_detected_from_version(flavor: str) -> None:
    assert detect_flavor(_launcher(flavor)) == flavor


def test_unknown_mpirun_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'SomeMPI 1.0'\n")
    fake.chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "run", "--mpi", "--mpirun", str(fake), "-np", "1", "true"],
        capture_output=True, text=True, timeout=60, env=_env(),
    )  # fmt: skip
    assert done.returncode == 2
    assert "cannot tell which MPI" in done.stderr and "'SomeMPI 1.0'" in done.stderr


@pytest.mark.parametrize("flavor", [OPENMPI, MPICH])
def test_mpi_run_environment_and_output(flavor: str, tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "run", "--mpi", "--mpirun", _launcher(flavor), "--verbose", "--tcp",
         "-np", "3", "-x", "FOO=bar", "--cycle-time-ms", "4", sys.executable, str(script), RANK_OF[flavor]],
        capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines())
    # the MPI launcher set the rank; hpcdl's own values were passed; stale HPCDL_RANK was dropped
    assert lines == [f"[{r}]<stdout>:{r} bar 4 tcp False []" for r in range(3)]
    shown = next(line for line in done.stderr.splitlines() if LAUNCHERS[flavor] in line)
    if flavor == OPENMPI:
        assert "--allow-run-as-root" in shown and "--tag-output" in shown and "-x FOO" in shown
    else:
        assert re.search(r" -l -n 3 -hosts \S+:3 ", shown) and "-genvlist" in shown


@pytest.mark.parametrize("flavor", [OPENMPI, MPICH])
@pytest.mark.parametrize(
    ("how", "code", "described"), [("exit", 3, "exited with code 3"), ("kill", 137, "SIGKILL")]
)
def test_mpi_failure_names_the_rank(flavor: str, how: str, code: int, described: str, tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(FAIL)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "run", "--mpi", "--mpirun", _launcher(flavor), "-np", "3",
         sys.executable, str(script), RANK_OF[flavor], how, str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    assert time.monotonic() - started < 30
    assert re.search(rf"hpcdl run: rank 1 on host \S+ .*{described}", done.stderr), done.stderr
    assert "rank 1 gives up" in done.stderr.split("last lines of its stderr", 1)[1]
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _running(pid)]


@pytest.mark.parametrize("flavor", [OPENMPI, MPICH])
def test_mpi_ctrl_c(flavor: str, tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(FAIL)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hpcdl", "run", "--mpi", "--mpirun", _launcher(flavor), "-np", "3",
         sys.executable, str(script), RANK_OF[flavor], "none", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("*.pid"))) < 2:
            assert time.monotonic() < deadline and launcher.poll() is None, launcher.stderr.read()
            time.sleep(0.05)
        launcher.send_signal(signal.SIGINT)
        _, stderr = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, stderr
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _running(pid)]


HELLO_C = r"""
#include <mpi.h>
#include <stdio.h>
int main(int c, char **v) { int r, n, s = 0; MPI_Init(&c, &v); MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n); MPI_Allreduce(&r, &s, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  printf("rank %d of %d sum %d\n", r, n, s); MPI_Finalize(); return 0; }
"""
COMPILERS = {OPENMPI: "/usr/bin/mpicc.openmpi", MPICH: "/usr/bin/mpicc.mpich"}


@pytest.mark.parametrize("flavor", [OPENMPI, MPICH])
def test_real_mpi_program(flavor: str, tmp_path: Path) -> None:
    launcher = _launcher(flavor)
    if not os.access(COMPILERS[flavor], os.X_OK):
        pytest.skip(f"{COMPILERS[flavor]} is not installed (apt install libopenmpi-dev mpich)")
    (tmp_path / "hello.c").write_text(HELLO_C)
    built = subprocess.run(
        [COMPILERS[flavor], "-o", str(tmp_path / "hello"), str(tmp_path / "hello.c")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if built.returncode != 0 and "mpi.h" in built.stderr:
        pytest.skip(f"{COMPILERS[flavor]} finds no mpi.h (apt install libopenmpi-dev libmpich-dev)")
    assert built.returncode == 0, built.stderr
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "run", "--mpi", "--mpirun", launcher, "-np", "3", tmp_path / "hello"],
        capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [f"[{r}]<stdout>:rank {r} of 3 sum 3" for r in range(3)]


ALLREDUCE = r"""
import numpy as np
import hpcdl.common as hc
hc.init()
total = hc.allreduce(np.array([hc.rank() + 1.0]))
print(hc.rank(), hc.size(), float(total[0]), flush=True)
hc.shutdown()
"""


@pytest.mark.parametrize("flavor", [OPENMPI, MPICH])
def test_hpcdl_ranks_under_mpi_meet_at_the_launchers_rendezvous(flavor: str, tmp_path: Path) -> None:
    pytest.importorskip("hpcdl.common.rendezvous", reason="the runtime's rendezvous module is not built yet")
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "run", "--mpi", "--mpirun", _launcher(flavor), "-np", "3",
         "--timeout", "30", sys.executable, str(script)],
        capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [f"[{r}]<stdout>:{r} 3 6.0" for r in range(3)]
