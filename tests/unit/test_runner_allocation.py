"""Hosts from batch allocations: Slurm, PBS, LSF, Cobalt, Flux (their environment, no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.platforms.flux import parse_resources
from hpcdl.platforms.hostlist import expand_hostlist
from hpcdl.platforms.slurm import expand_counts
from hpcdl.runner.allocation import detect_allocation, host_slots
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import HostSlots


def test_expand_slurm_hostlist() -> None:
    assert expand_hostlist("node[01-03,07],gpu5") == ["node01", "node02", "node03", "node07", "gpu5"]
    assert expand_hostlist("r[1-2]n[08-09]") == ["r1n08", "r1n09", "r2n08", "r2n09"]
    assert expand_hostlist("a,b[9-10]") == ["a", "b9", "b10"]


@pytest.mark.parametrize("bad", ["node[01-03", "node01-03]", "node[a-b]", "node[5-3]"])
def test_bad_hostlist(bad: str) -> None:
    with pytest.raises(LaunchError, match="host list"):
        expand_hostlist(bad)


def test_expand_counts() -> None:
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(LaunchError, match="per-node count"):
        expand_counts("2(3)")


def test_no_allocation_outside_a_batch_job() -> None:
    assert detect_allocation({"PATH": "/usr/bin"}) is None


def test_slurm_tasks_per_node() -> None:
    env = {"SLURM_JOB_NODELIST": "node[01-03,07],gpu5", "SLURM_TASKS_PER_NODE": "2(x3),1,4"}
    allocation = detect_allocation(env)
    assert allocation is not None and allocation.scheduler == "Slurm"
    assert allocation.hosts == [
        HostSlots("node01", 2),
        HostSlots("node02", 2),
        HostSlots("node03", 2),
        HostSlots("node07", 1),
        HostSlots("gpu5", 4),
    ]


def test_slurm_cpus_per_node_and_override() -> None:
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_CPUS_PER_NODE": "36(x2)"}
    assert detect_allocation(env).hosts == [HostSlots("n1", 36), HostSlots("n2", 36)]
    assert detect_allocation(env, slots_per_host=4).hosts == [HostSlots("n1", 4), HostSlots("n2", 4)]


def test_slurm_count_mismatch_is_explained() -> None:
    env = {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    with pytest.raises(LaunchError, match="gives 2 counts for the 3 nodes"):
        detect_allocation(env)


def test_pbs_nodefile_lines_are_slots(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("x1001\nx1001\nx1001\nx1002\nx1002\nx1002\n")
    allocation = detect_allocation({"PBS_NODEFILE": str(nodefile)})
    assert allocation.scheduler == "PBS"
    assert allocation.hosts == [HostSlots("x1001", 3), HostSlots("x1002", 3)]


def test_pbs_unreadable_nodefile(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"PBS_NODEFILE=.* cannot be read"):
        detect_allocation({"PBS_NODEFILE": str(tmp_path / "gone")})


def test_lsf_mcpu_hosts_and_hosts() -> None:
    allocation = detect_allocation({"LSB_MCPU_HOSTS": "batch1 1 h1 42 h2 42"})
    assert allocation.hosts == [HostSlots("batch1", 1), HostSlots("h1", 42), HostSlots("h2", 42)]
    allocation = detect_allocation({"LSB_HOSTS": "h1 h1 h2"})
    assert allocation.hosts == [HostSlots("h1", 2), HostSlots("h2", 1)]
    with pytest.raises(LaunchError, match="is not 'host count"):
        detect_allocation({"LSB_MCPU_HOSTS": "h1 4 h2"})


def test_cobalt_partname_and_nodefile(tmp_path: Path) -> None:
    allocation = detect_allocation({"COBALT_PARTNAME": "3826-3828,3831"})
    assert [h.name for h in allocation.hosts] == ["nid03826", "nid03827", "nid03828", "nid03831"]
    nodefile = tmp_path / "cobalt"
    nodefile.write_text("thetagpu01\nthetagpu02\n")
    allocation = detect_allocation({"COBALT_NODEFILE": str(nodefile)}, slots_per_host=8)
    assert allocation.hosts == [HostSlots("thetagpu01", 8), HostSlots("thetagpu02", 8)]


def test_flux_resource_list_parsing() -> None:
    text = "2 64 8 tioga[1-2]\n1 32 0 cpu7\n"
    assert host_slots(parse_resources(text), None) == [
        HostSlots("tioga1", 4),
        HostSlots("tioga2", 4),
        HostSlots("cpu7", 32),
    ]
    with pytest.raises(LaunchError, match="cannot read flux resource line"):
        parse_resources("up tioga1\n")


def test_slurm_wins_over_others(tmp_path: Path) -> None:
    env = {"SLURM_JOB_NODELIST": "n1", "LSB_HOSTS": "h1"}
    assert detect_allocation(env).scheduler == "Slurm"
