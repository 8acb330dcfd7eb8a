"""The elastic launcher's checks and host discovery, without starting workers."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpcdl.cli.main import app
from hpcdl.runner.elastic import Blacklist, Round, RoundBoard, discover_hosts
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import HostSlots

runner = CliRunner()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--min-np", "3", "--max-np", "2"], "--max-np 2 is below --min-np 3"),
        (["-np", "5", "--min-np", "1", "--max-np", "4"], "-np 5 must lie between --min-np 1 and --max-np 4"),
        (["--min-np", "0", "--max-np", "2"], "--min-np must be at least 1"),
        (["--min-np", "1", "--max-np", "2", "--mpi"], "--mpi cannot start an elastic job"),
        (["--host-discovery-script", "/nonexistent/discover.sh", "--max-np", "2"], "does not exist"),
        (["--host-discovery-script", "/bin/true"], "needs --max-np"),
        (
            ["--min-np", "1", "--max-np", "2", "--blacklist-cooldown-range", "5", "2"],
            "--blacklist-cooldown-range 5 2: give MIN and MAX seconds with 0 < MIN <= MAX",
        ),
        (["--min-np", "1", "--max-np", "2", "--blacklist-cooldown-range", "0", "2"], "0 < MIN <= MAX"),
    ],
)
def test_bad_elastic_flags_are_refused_before_anything_starts(flags: list[str], message: str) -> None:
    result = runner.invoke(app, ["run", *flags, "python", "-c", "pass"])
    assert result.exit_code == 2
    assert message in result.output


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_discovery_reads_host_and_host_slots_lines(tmp_path: Path) -> None:
    found = discover_hosts(script(tmp_path, "echo node1:4\necho node2\necho '# a comment'\necho node1:2\n"))
    assert found == [HostSlots("node1", 6), HostSlots("node2", 1)]


def test_discovery_failures_say_what_the_script_did(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="exited with 3: no cluster"):
        discover_hosts(script(tmp_path, "echo no cluster >&2\nexit 3\n"))
    with pytest.raises(LaunchError, match="printed something else than host:slots lines"):
        discover_hosts(script(tmp_path, "echo 'node1:four'\n"))


def test_a_worker_gets_its_place_in_the_first_newer_round_that_includes_it() -> None:
    board = RoundBoard()
    assert board.assignment(0, after=0, timeout=0.05) == {"error": "no new round for worker 0 within 0.05 s"}
    board.publish(Round(1, [3, 0], {0: "a", 3: "b"}, "10.0.0.1", 5000))
    assert board.assignment(0, after=0, timeout=1) == {
        "round": 1, "rank": 1, "size": 2, "host": "a", "addr": "10.0.0.1", "port": 5000,
    }  # fmt: skip
    assert "error" in board.assignment(0, after=1, timeout=0.05)  # nothing newer yet
    board.remove(0)
    assert board.assignment(0, after=0, timeout=1) == {"error": "worker 0 is no longer part of the job"}


def test_blacklist_cooldown_doubles_per_failure_up_to_max() -> None:
    blacklist = Blacklist((1.0, 5.0))
    cooldowns = []
    now = 100.0
    for _ in range(4):
        cooldowns.append(blacklist.add("node1", now))
        assert blacklist.blocks("node1", now) and blacklist.cooling()
        assert blacklist.released(now + cooldowns[-1] - 0.01) == []
        now += cooldowns[-1]
        assert not blacklist.blocks("node1", now)
        assert blacklist.released(now) == ["node1"] and blacklist.released(now) == []
    assert cooldowns == [1.0, 2.0, 4.0, 5.0]
    assert not blacklist.blocks("node2", now) and not blacklist.cooling()


def test_blacklist_without_cooldown_is_for_good() -> None:
    blacklist = Blacklist()
    assert blacklist.add("node1", 0.0) is None
    assert blacklist.blocks("node1", 1e9) and not blacklist.cooling() and blacklist.released(1e9) == []
