"""``hpcdl run`` inside Flux, PBS (Cray PALS), Cobalt (ALPS) and LSF allocations, which start ranks with
``flux run``, PALS ``mpiexec``, ``aprun``, ``jsrun`` or ``blaunch``. None of these exists here (no Flux
package for Debian 12, the others are vendor software): stand-ins take their place (``launcher_stand_ins``),
starting each task on its own host (virtual hosts: network namespaces with their own hostname, address and
/etc/hosts, see ``virtual_hosts``). ``hpcdl run`` runs where it runs in such a job (the first node, or a
service node: Cobalt's MOM node, LSF's launch node), so the ranks meet at its rendezvous across hosts. The
srun case runs against real Slurm in test_runner_srun.py."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from launcher_stand_ins import allocation_env, install, recorded
from virtual_hosts import VirtualHosts, missing_requirements

_MISSING = missing_requirements()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no virtual hosts: {_MISSING}")


REPORT = 'echo "$HPCDL_RANK $(hostname) $HPCDL_LOCAL_RANK $RANK $LOCAL_RANK $WORLD_SIZE"'

# The hosts of every allocation below: compute nodes, and the service nodes hpcdl run starts on where it
# does not run on the first compute node (Cobalt's MOM node, LSF's launch node).
FLUX_NODES = ["node1", "node2"]
PALS_NODES = ["x3001c0s1b0n0", "x3001c0s1b1n0"]
COBALT_NODES, COBALT_MOM = ["nid00012", "nid00013"], "thetamom1"
CSM_NODES, CSM_LAUNCH = ["a01n01", "a01n02"], "batch3"
LSF_NODES = ["lsf1", "lsf2"]
HOSTS = [*FLUX_NODES, *PALS_NODES, *COBALT_NODES, COBALT_MOM, *CSM_NODES, CSM_LAUNCH, *LSF_NODES]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VirtualHosts]:
    with VirtualHosts(tmp_path_factory.mktemp("hosts"), HOSTS, ssh=False) as made:
        yield made


@pytest.fixture
def stand_ins(tmp_path: Path):
    """install(*names): stand-ins named so on a PATH directory of their own."""
    return lambda *names: install(tmp_path / "bin", *names)


def run_in_allocation(
    hosts: VirtualHosts, bin_dir: Path, on: str, allocation: dict[str, str], args: list[str]
) -> subprocess.CompletedProcess:
    """``hpcdl run ARGS`` on host `on`, inside the allocation described by `allocation`."""
    argv = [sys.executable, "-m", "hpcdl", "run", *args]
    return hosts.run(on, argv, env=allocation_env(hosts, bin_dir, allocation), timeout=120)


def launcher_part(argv: list[str]) -> list[str]:
    """The launcher's own options: everything before the task command (python -m hpcdl.runner...)."""
    return argv[: argv.index(sys.executable)]


def reports(stdout: str) -> list[str]:
    return sorted(line.split(":", 1)[1] for line in stdout.splitlines() if line.startswith("["))


def two_by_two(nodes: list[str]) -> list[str]:
    return sorted(f"{r} {nodes[r // 2]} {r % 2} {r} {r % 2} 4" for r in range(4))


def test_flux_allocation_runs_one_flux_run_step(hosts: VirtualHosts, stand_ins) -> None:
    bin_dir = stand_ins("flux")
    allocation = {"FLUX_JOB_ID": "f2Kq9Lf5", "STANDIN_FLUX_RESOURCES": "2 4 0 node[1-2]"}
    done = run_in_allocation(hosts, bin_dir, "node1", allocation, ["--verbose", "--", "sh", "-c", REPORT])
    assert done.returncode == 0, done.stderr
    assert (
        "4 ranks on node1:2, node2:2 (hosts from the Flux allocation (flux resource list); launcher flux)"
        in (done.stderr)
    )
    assert f"rendezvous at {hosts['node1'].address}:" in done.stderr  # where node2's ranks reach node1
    assert reports(done.stdout) == two_by_two(FLUX_NODES)
    calls = recorded(bin_dir, "flux")
    assert calls[0] == ["resource", "list", "-s", "up", "-no", "{nnodes} {ncores} {ngpus} {nodelist}"]
    assert launcher_part(calls[1]) == [
        "run", "--nodes=2", "--tasks-per-node=2", "--requires=hosts:node1,node2", "--input=0-3",
    ]  # fmt: skip


ALLREDUCE = (
    "import socket, numpy as np, hpcdl.common as c; c.init(); y = c.allreduce(np.array([c.rank() + 1.0])); "
    "print(c.rank(), socket.gethostname(), float(y[0]), flush=True); c.shutdown()"
)


def test_pbs_with_pals_runs_one_mpiexec_step_and_ranks_meet(
    hosts: VirtualHosts, stand_ins, tmp_path: Path
) -> None:
    bin_dir = stand_ins("mpiexec")
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("".join(f"{node}\n{node}\n" for node in PALS_NODES))  # one line per mpiprocs slot
    allocation = {"PBS_NODEFILE": str(nodefile)}
    done = run_in_allocation(hosts, bin_dir, PALS_NODES[0], allocation, ["python3", "-c", ALLREDUCE])
    assert done.returncode == 0, done.stderr
    assert reports(done.stdout) == [f"{r} {PALS_NODES[r // 2]} 10.0" for r in range(4)]
    calls = recorded(bin_dir, "mpiexec")
    assert calls[0] == ["--version"]  # auto: is this mpiexec PALS'?
    assert launcher_part(calls[1]) == ["-n", "4", "--ppn", "2", "--hosts", ",".join(PALS_NODES)]


def test_cobalt_allocation_runs_aprun_from_the_mom_node_and_a_failing_rank_is_named(
    hosts: VirtualHosts, stand_ins, tmp_path: Path
) -> None:
    bin_dir = stand_ins("aprun")
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("\n".join(COBALT_NODES) + "\n")
    allocation = {"COBALT_NODEFILE": str(nodefile), "COBALT_JOBID": "4321"}
    args = ["--slots-per-host", "2", "--", "python3", "-c", ALLREDUCE]
    done = run_in_allocation(hosts, bin_dir, COBALT_MOM, allocation, args)
    assert done.returncode == 0, done.stderr
    assert reports(done.stdout) == [f"{r} {COBALT_NODES[r // 2]} 10.0" for r in range(4)]  # none on the MOM
    assert launcher_part(recorded(bin_dir, "aprun")[0]) == ["-n", "4", "-N", "2", "-L", "12,13"]

    fail = 'if [ "$HPCDL_RANK" = 2 ]; then echo "rank 2 gives up" >&2; exit 3; fi; sleep 30'
    started = time.monotonic()
    args = ["--slots-per-host", "2", "--", "sh", "-c", fail]
    done = run_in_allocation(hosts, bin_dir, COBALT_MOM, allocation, args)
    assert done.returncode == 3, done.stderr
    assert "hpcdl run: rank 2 on host nid00013 exited with code 3" in done.stderr
    assert "    rank 2 gives up" in done.stderr
    assert time.monotonic() - started < 20


def test_lsf_with_csm_runs_jsrun_on_the_compute_nodes(hosts: VirtualHosts, stand_ins) -> None:
    bin_dir = stand_ins("jsrun", "blaunch")
    allocation = {"LSB_JOBID": "77", "LSB_MCPU_HOSTS": f"{CSM_LAUNCH} 1 a01n01 2 a01n02 2"}
    done = run_in_allocation(hosts, bin_dir, CSM_LAUNCH, allocation, ["--", "python3", "-c", ALLREDUCE])
    assert done.returncode == 0, done.stderr
    # none on the launch node, where hpcdl run runs
    assert reports(done.stdout) == [f"{r} {CSM_NODES[r // 2]} 10.0" for r in range(4)]
    assert launcher_part(recorded(bin_dir, "jsrun")[0]) == [
        "--nrs", "4", "--rs_per_host", "2", "--tasks_per_rs", "1", "--launch_distribution", "packed",
    ]  # fmt: skip


def test_lsf_without_csm_starts_each_rank_with_blaunch(hosts: VirtualHosts, stand_ins) -> None:
    bin_dir = stand_ins("blaunch")
    allocation = {"LSB_JOBID": "78", "LSB_MCPU_HOSTS": "lsf1 2 lsf2 2"}
    done = run_in_allocation(hosts, bin_dir, "lsf1", allocation, ["--", "python3", "-c", ALLREDUCE])
    assert done.returncode == 0, done.stderr
    assert reports(done.stdout) == [f"{r} {LSF_NODES[r // 2]} 10.0" for r in range(4)]
    calls = sorted(launcher_part(call) for call in recorded(bin_dir, "blaunch"))
    assert calls == [["-no-shell", "lsf1"]] * 2 + [["-no-shell", "lsf2"]] * 2


def test_ctrl_c_reaches_the_ranks_of_a_step(hosts: VirtualHosts, stand_ins, tmp_path: Path) -> None:
    """Flux copies stdin to every task: the launcher's Ctrl-C travels as a control line to each agent."""
    bin_dir = stand_ins("flux")
    waiter = tmp_path / "wait.py"
    waiter.write_text(
        "import os, time\n"
        "open(os.path.join(os.environ['OUT'], os.environ['HPCDL_RANK']), 'w').close()\n"
        "try:\n    time.sleep(60)\n"
        "except KeyboardInterrupt:\n    print('rank', os.environ['HPCDL_RANK'], 'got SIGINT', flush=True)\n"
    )
    out = tmp_path / "started"
    out.mkdir()
    allocation = {"FLUX_JOB_ID": "f3x", "STANDIN_FLUX_RESOURCES": "2 4 0 node[1-2]", "OUT": str(out)}
    launcher = hosts.popen(
        "node1", [sys.executable, "-m", "hpcdl", "run", "python3", str(waiter)],
        env=allocation_env(hosts, bin_dir, allocation), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(list(out.iterdir())) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(list(out.iterdir())) == 4, "the ranks did not start"
        launcher.send_signal(signal.SIGINT)  # nsenter execs: this is hpcdl run
        stdout, stderr = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 130, stderr
    assert sorted(re.findall(r"rank \d got SIGINT", stdout)) == [f"rank {r} got SIGINT" for r in range(4)]
    assert "hpcdl run received SIGINT; stopped all ranks" in stderr


def test_placement_a_block_launcher_cannot_express_is_refused(
    hosts: VirtualHosts, stand_ins, tmp_path: Path
) -> None:
    bin_dir = stand_ins("aprun")
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("\n".join(COBALT_NODES) + "\n")
    done = run_in_allocation(
        hosts, bin_dir, COBALT_MOM, {"COBALT_NODEFILE": str(nodefile)},
        ["-H", "nid00012:1,nid00013:2", "true"],
    )  # fmt: skip
    assert done.returncode == 2
    assert "--launcher aprun cannot place the ranks as nid00012:1,nid00013:2" in done.stderr
    assert not (bin_dir / "aprun.argv").exists()
