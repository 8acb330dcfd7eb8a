"""Host lists, hostfiles and rank placement of ``hpcdl run``."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import HostSlots, assign_ranks, parse_hostfile, parse_hosts_arg


def test_hosts_arg_with_and_without_slots() -> None:
    assert parse_hosts_arg("node1:2,node2:4,node3") == [
        HostSlots("node1", 2),
        HostSlots("node2", 4),
        HostSlots("node3", 1),
    ]


def test_hosts_arg_repeated_host_adds_slots() -> None:
    assert parse_hosts_arg("a:1,b:1,a:2") == [HostSlots("a", 3), HostSlots("b", 1)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node1:x", "slots 'x' is not a whole number"),
        ("node1:0", "slots must be at least 1"),
        ("node1:2,,node2:2", "has an empty entry"),
        ("no de:2", "is not a host name"),
        ("node;rm:2", "is not a host name"),
    ],
)
def test_hosts_arg_errors(text: str, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        parse_hosts_arg(text)


def test_hostfile_openmpi_form(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnode01 slots=4\n\nnode02 slots=2 max_slots=8  # comment\nnode03\n")
    assert parse_hostfile(hostfile) == [
        HostSlots("node01", 4),
        HostSlots("node02", 2),
        HostSlots("node03", 1),
    ]


def test_hostfile_mpich_form(tmp_path: Path) -> None:
    hostfile = tmp_path / "machines"
    hostfile.write_text("node01:2\nnode02:3\n")
    assert parse_hostfile(hostfile) == [HostSlots("node01", 2), HostSlots("node02", 3)]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("node01 slots=4\nnode02 slots=four\n", r"hosts:2: slots 'four' is not a whole number"),
        ("node01 slots=4\nnode02 cpus=2\n", r"hosts:2: cannot read 'cpus=2' in 'node02 cpus=2'"),
        ("node01 slots=0\n", r"hosts:1: slots must be at least 1"),
        ("node01:four\n", r"hosts:1: slots 'four' is not a whole number"),
        ("node01 slots=2 slots\n", r"hosts:1: cannot read 'slots'"),
        ("# nothing\n\n", "names no hosts"),
    ],
)
def test_hostfile_errors_name_the_line(tmp_path: Path, content: str, message: str) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text(content)
    with pytest.raises(LaunchError, match=message):
        parse_hostfile(hostfile)


def test_missing_hostfile(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"cannot read hostfile .*missing"):
        parse_hostfile(tmp_path / "missing")


def test_more_ranks_than_slots_refused() -> None:
    with pytest.raises(LaunchError, match=r"-np 5 asks for more ranks than the 4 slots of a:2,b:2"):
        assign_ranks([HostSlots("a", 2), HostSlots("b", 2)], 5)


def test_placement_fills_hosts_in_order_with_horovod_topology() -> None:
    slots = assign_ranks([HostSlots("a", 2), HostSlots("b", 2), HostSlots("c", 1)], 5)
    assert [(s.rank, s.host, s.local_rank, s.local_size) for s in slots] == [
        (0, "a", 0, 2),
        (1, "a", 1, 2),
        (2, "b", 0, 2),
        (3, "b", 1, 2),
        (4, "c", 0, 1),
    ]
    # cross rank: index of the host among hosts that have this local rank
    assert [(s.cross_rank, s.cross_size) for s in slots] == [(0, 3), (0, 2), (1, 3), (1, 2), (2, 3)]
    assert {s.size for s in slots} == {5}


def test_placement_uses_only_needed_hosts() -> None:
    slots = assign_ranks([HostSlots("a", 4), HostSlots("b", 4)], 3)
    assert {s.host for s in slots} == {"a"}
    assert [s.local_size for s in slots] == [3, 3, 3]
    assert [(s.cross_rank, s.cross_size) for s in slots] == [(0, 1)] * 3
