"""``hpcdl run --launcher``: the command lines of each scheduler's own launcher, checked against the
syntax its documentation gives (srun(1) of Slurm 22.05, flux-run(1), HPE PALS mpiexec, aprun(1), jsrun(1),
blaunch(1)), which launcher ``auto`` picks, and how a step's task finds its rank. The srun lines also run for
real in tests/integration/test_runner_srun.py, the others through stand-ins in test_runner_native.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.platforms.cobalt import Aprun
from hpcdl.platforms.flux import FluxRun
from hpcdl.platforms.lsf import Blaunch, Jsrun
from hpcdl.platforms.pbs import PalsMpiexec
from hpcdl.platforms.slurm import Srun
from hpcdl.runner.allocation import Allocation
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import HostSlots, assign_ranks
from hpcdl.runner.launchers import choose_launcher, placement
from hpcdl.runner.step_agent import find_slot
from hpcdl.runner.tagged import Tagged, step_agent_reader

TWO_BY_TWO = [HostSlots("node1", 2), HostSlots("node2", 2)]


def test_placement_lists_hosts_in_rank_order() -> None:
    slots = assign_ranks([HostSlots("b", 2), HostSlots("a", 3)], 4)
    assert placement(slots) == [HostSlots("b", 2), HostSlots("a", 2)]


def test_srun_step_places_every_rank_exactly() -> None:
    argv = Srun({}).step_argv([HostSlots("node2", 2), HostSlots("node1", 1)])
    # --distribution=arbitrary lays tasks out in the order of --nodelist, so SLURM_PROCID is the rank even
    # where Slurm would sort node2 after node1
    assert argv == [
        "srun", "--nodes=2", "--ntasks=3", "--distribution=arbitrary", "--nodelist=node2,node2,node1",
        "--kill-on-bad-exit=1", "--input=all", "--export=ALL",
    ]  # fmt: skip


def test_srun_inside_a_step_overlaps_and_keeps_the_jobs_cpus_per_task() -> None:
    launcher = Srun({"SLURM_STEP_ID": "0", "SLURM_CPUS_PER_TASK": "4"}, ("--cpu-bind=cores",))
    argv = launcher.step_argv(TWO_BY_TWO)
    assert argv[-3:] == ["--cpus-per-task=4", "--overlap", "--cpu-bind=cores"]
    assert launcher.worker_argv("node2") == [
        "srun", "--nodes=1", "--ntasks=1", "--nodelist=node2", "--kill-on-bad-exit=1", "--input=all",
        "--export=ALL", "--cpus-per-task=4", "--overlap", "--cpu-bind=cores",
    ]  # fmt: skip


def test_srun_workers_overlap_even_outside_a_step() -> None:
    assert "--overlap" in Srun({}).worker_argv("node1")
    assert "--overlap" not in Srun({}).step_argv(TWO_BY_TWO)


def test_flux_run_lines() -> None:
    flux = FluxRun({})
    assert flux.step_argv(TWO_BY_TWO) == [
        "flux", "run", "--nodes=2", "--tasks-per-node=2", "--requires=hosts:node1,node2", "--input=0-3",
    ]  # fmt: skip
    uneven = [HostSlots("n1", 2), HostSlots("n2", 1)]
    flux.check_placement(uneven)  # the job shell spreads 3 tasks on 2 nodes as 2 + 1
    assert flux.step_argv(uneven)[2:4] == ["--nodes=2", "--ntasks=3"]
    with pytest.raises(LaunchError, match="cannot place the ranks as n1:1,n2:2"):
        flux.check_placement([HostSlots("n1", 1), HostSlots("n2", 2)])
    assert flux.worker_argv("n2") == [
        "flux", "run", "--nodes=1", "--ntasks=1", "--requires=hosts:n2", "--input=0",
    ]  # fmt: skip


def test_pals_mpiexec_lines() -> None:
    mpiexec = PalsMpiexec({}, ("--cpu-bind", "depth"))
    assert mpiexec.step_argv(TWO_BY_TWO) == [
        "mpiexec", "-n", "4", "--ppn", "2", "--hosts", "node1,node2", "--cpu-bind", "depth",
    ]  # fmt: skip
    assert mpiexec.worker_argv("x3") == [
        "mpiexec",
        "-n",
        "1",
        "--ppn",
        "1",
        "--hosts",
        "x3",
        "--cpu-bind",
        "depth",
    ]


def test_aprun_takes_cray_node_ids_and_has_no_one_task_form() -> None:
    aprun = Aprun({})
    placed = [HostSlots("nid03826", 4), HostSlots("nid03827", 4), HostSlots("nid03900", 1)]
    assert aprun.step_argv(placed) == ["aprun", "-n", "9", "-N", "4", "-L", "3826,3827,3900"]
    assert aprun.worker_argv("nid03826") is None
    with pytest.raises(LaunchError, match="'login1' is not a Cray node id"):
        aprun.step_argv([HostSlots("login1", 1)])


def test_jsrun_line() -> None:
    assert Jsrun({}).step_argv(TWO_BY_TWO) == [
        "jsrun", "--nrs", "4", "--rs_per_host", "2", "--tasks_per_rs", "1", "--launch_distribution", "packed",
    ]  # fmt: skip


def test_blaunch_starts_one_task_per_rank() -> None:
    blaunch = Blaunch({})
    assert blaunch.step_argv(TWO_BY_TWO) is None
    blaunch.check_placement([HostSlots("a", 3), HostSlots("b", 1), HostSlots("c", 2)])
    assert blaunch.worker_argv("b") == ["blaunch", "-no-shell", "b"]


@pytest.mark.parametrize("launcher", [PalsMpiexec({}), Aprun({}), Jsrun({})])
def test_block_launchers_refuse_placements_they_cannot_express(launcher) -> None:
    launcher.check_placement([HostSlots("nid1", 4), HostSlots("nid2", 4), HostSlots("nid3", 2)])
    with pytest.raises(LaunchError, match=r"cannot place the ranks as nid1:2,nid2:4 .*--launcher ssh"):
        launcher.check_placement([HostSlots("nid1", 2), HostSlots("nid2", 4)])


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Put stand-in executables (that exit 0) named as given on a PATH of their own."""

    def install(*names: str) -> None:
        for name in names:
            program = tmp_path / name
            program.write_text("#!/bin/sh\nexit 0\n")
            program.chmod(0o755)
        monkeypatch.setenv("PATH", str(tmp_path))

    return install


SLURM = Allocation("Slurm", "SLURM_JOB_NODELIST=node[1-2]", TWO_BY_TWO)


def test_auto_uses_the_allocations_own_launcher(on_path) -> None:
    on_path("srun", "jsrun", "blaunch", "aprun")
    assert choose_launcher("auto", SLURM, None, all_local=False) == "srun"
    assert choose_launcher("auto", SLURM, None, all_local=True) == "srun"  # one node: still a job step
    assert choose_launcher("auto", SLURM, [HostSlots("node2", 1)], all_local=False) == "srun"
    lsf = Allocation("LSF", "LSB_MCPU_HOSTS", TWO_BY_TWO)
    assert choose_launcher("auto", lsf, None, all_local=False) == "jsrun"
    assert (
        choose_launcher("auto", Allocation("Cobalt", "COBALT_PARTNAME", TWO_BY_TWO), None, False) == "aprun"
    )


def test_auto_outside_an_allocation_or_its_hosts(on_path) -> None:
    on_path("srun")
    assert choose_launcher("auto", None, None, all_local=True) == "local"
    assert choose_launcher("auto", None, TWO_BY_TWO, all_local=False) == "ssh"
    # -H naming hosts outside the allocation: those are reached over ssh
    assert choose_launcher("auto", SLURM, [HostSlots("gpu7", 2)], all_local=False) == "ssh"


def test_lsf_without_csm_uses_blaunch_and_pbs_without_pals_ssh(on_path) -> None:
    on_path("blaunch")
    assert choose_launcher("auto", Allocation("LSF", "LSB_HOSTS", TWO_BY_TWO), None, False) == "blaunch"
    assert choose_launcher("auto", Allocation("PBS", "PBS_NODEFILE", TWO_BY_TWO), None, False) == "ssh"


def test_missing_launcher_is_a_clear_error(on_path) -> None:
    on_path("true")
    with pytest.raises(LaunchError, match="inside the Slurm allocation, but 'srun' is not on PATH"):
        choose_launcher("auto", SLURM, None, all_local=False)
    with pytest.raises(LaunchError, match="--launcher flux: 'flux' is not on PATH here"):
        choose_launcher("flux", None, None, all_local=True)
    with pytest.raises(LaunchError, match="--launcher pdsh: choose one of auto, local, ssh, srun"):
        choose_launcher("pdsh", None, None, all_local=True)
    assert choose_launcher("ssh", SLURM, None, all_local=False) == "ssh"


def test_a_task_finds_its_rank_by_host_and_local_index() -> None:
    slots = assign_ranks([HostSlots("node1.cluster", 2), HostSlots("node2.cluster", 2)], 4)
    assert find_slot(slots, "node2.cluster", 1).rank == 3
    assert find_slot(slots, "node2", 0).rank == 2  # a short host name matches the placed long one
    assert find_slot(slots, "node3", 0) is None
    assert find_slot(slots, "node1.cluster", 2) is None


def test_step_agent_tags_are_read_back() -> None:
    read = step_agent_reader("hpcdl-rank-1f")
    assert read("stdout", b"hpcdl-rank-1f 3 out hello world\n") == Tagged(3, "stdout", b"hello world\n")
    assert read("stdout", b"hpcdl-rank-1f 0 err oops\n") == Tagged(0, "stderr", b"oops\n")
    assert read("stdout", b"hpcdl-rank-1f 2 exit -9\n") == Tagged(2, exit_code=-9)
    assert read("stderr", b"srun: error: node2: task 1: Exited with exit code 3\n") is None
    assert read("stdout", b"hpcdl-rank-00 1 out forged by another job\n") is None
