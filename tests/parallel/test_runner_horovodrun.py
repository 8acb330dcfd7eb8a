"""``horovodrun`` command lines from Horovod's documentation (docs/*.rst of Horovod 0.28), run through
``hpcdl run`` with real ranks: the program is swapped for a tiny hpcdl script, remote host names for names
of this machine (localhost, 127.0.0.1), file paths for the test's own, and the elastic examples' process
counts scaled to this machine; every flag stays as the docs write it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from runner_helpers import hpcdl_run, rank_lines

# Every rank: an allreduce at the launcher's rendezvous, then what it was given.
TINY = (
    "import json, os, numpy as np, hpcdl.common as c\n"
    "c.init()\n"
    "total = float(c.allreduce(np.array([c.rank() + 1.0]))[0])\n"
    "names = ('HPCDL_FUSION_THRESHOLD', 'HPCDL_CYCLE_TIME', 'HPCDL_CACHE_CAPACITY', 'HPCDL_AUTOTUNE',\n"
    "         'HPCDL_AUTOTUNE_LOG', 'HPCDL_AUTOTUNE_WARMUP_SAMPLES', 'HPCDL_AUTOTUNE_STEPS_PER_SAMPLE',\n"
    "         'HPCDL_HIERARCHICAL_ALLREDUCE', 'HPCDL_TIMELINE', 'HPCDL_TIMELINE_MARK_CYCLES')\n"
    "print('TINY ' + json.dumps({'rank': c.rank(), 'size': c.size(), 'sum': total,\n"
    "      'env': {n: os.environ[n] for n in names if n in os.environ}}), flush=True)\n"
    "c.shutdown()\n"
)

# (the line from Horovod's docs with "python train.py" kept as the marker of the program, the variables
# the ranks must see, the number of ranks)
DOC_LINES = [
    ("horovodrun -np 4 -H localhost:4 python train.py", {}, 4),  # running.rst
    ("horovodrun -np 4 python train.py", {}, 4),  # pytorch.rst, mpi.rst
    ("horovodrun --gloo -np 2 python train.py", {}, 2),  # summary.rst
    ("horovodrun -np 4 -H localhost:2,127.0.0.1:2 -p 12345 python train.py", {}, 4),  # docker.rst
    ("horovodrun -np 2 -hostfile myhostfile python train.py", {}, 2),  # running.rst
    ("horovodrun -np 4 --fusion-threshold-mb 32 python train.py", {"HPCDL_FUSION_THRESHOLD": "33554432"}, 4),
    ("horovodrun -np 4 --fusion-threshold-mb 0 python train.py", {"HPCDL_FUSION_THRESHOLD": "0"}, 4),
    ("horovodrun -np 4 --cycle-time-ms 3.5 python train.py", {"HPCDL_CYCLE_TIME": "3.5"}, 4),
    (
        "horovodrun -np 4 --timeline-filename /path/to/timeline.json --timeline-mark-cycles python train.py",
        {"HPCDL_TIMELINE": "/path/to/timeline.json", "HPCDL_TIMELINE_MARK_CYCLES": "1"},
        4,
    ),
    ("horovodrun -np 4 --autotune python train.py", {"HPCDL_AUTOTUNE": "1"}, 4),
    (
        "horovodrun -np 4 --autotune --autotune-log-file /tmp/autotune_log.csv python train.py",
        {"HPCDL_AUTOTUNE": "1", "HPCDL_AUTOTUNE_LOG": "/tmp/autotune_log.csv"},
        4,
    ),
    (
        "horovodrun -np 4 --autotune --cache-capacity 1024 --no-hierarchical-allgather python train.py",
        {"HPCDL_AUTOTUNE": "1", "HPCDL_CACHE_CAPACITY": "1024", "HPCDL_HIERARCHICAL_ALLREDUCE": "0"},
        4,
    ),
    (
        "horovodrun -np 4 --autotune --autotune-warmup-samples 5 --autotune-steps-per-sample 20 "
        "--autotune-bayes-opt-max-samples 40 python train.py",
        {"HPCDL_AUTOTUNE_WARMUP_SAMPLES": "5", "HPCDL_AUTOTUNE_STEPS_PER_SAMPLE": "20"},
        4,
    ),
    ("horovodrun -np 4 --autotune --autotune-gaussian-process-noise 0.75 python train.py", {}, 4),
    # elastic.rst (-np 8 / --min-np 4 / --max-np 12 scaled to 2 / 1 / 3)
    ("horovodrun -np 2 --host-discovery-script discover_hosts.sh python train.py", {}, 2),
    ("horovodrun -np 2 --host-discovery-script discover_hosts.sh --slots 2 python train.py", {}, 2),
    (
        "horovodrun -np 2 --min-np 1 --max-np 3 --host-discovery-script discover_hosts.sh python train.py",
        {},
        2,
    ),
    (
        "horovodrun -np 2 --blacklist-cooldown-range 10 100 --min-np 1 --max-np 3 "
        "--host-discovery-script discover_hosts.sh python train.py",
        {},
        2,
    ),
]


def _results(stdout: str) -> list[dict]:
    found = []
    for line in stdout.splitlines():
        _, sep, payload = line.partition("<stdout>:TINY ")
        if sep:
            found.append(json.loads(payload))
    return sorted(found, key=lambda r: r["rank"])


@pytest.mark.parametrize(("line", "expected_env", "ranks"), DOC_LINES, ids=[line for line, _, _ in DOC_LINES])
def test_horovodrun_line_from_the_docs(tmp_path: Path, line: str, expected_env: dict, ranks: int) -> None:
    (tmp_path / "train.py").write_text(TINY)
    (tmp_path / "myhostfile").write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    discover = tmp_path / "discover_hosts.sh"
    discover.write_text("#!/bin/sh\necho localhost:2\n")  # lines with ':slots' win over --slots
    discover.chmod(0o755)
    argv = shlex.split(line)
    assert argv[0] == "horovodrun" and argv[-2:] == ["python", "train.py"]
    # the docs' paths, made this test's own
    places = {
        "discover_hosts.sh": str(discover),
        "/path/to/timeline.json": str(tmp_path / "timeline.json"),
        "/tmp/autotune_log.csv": str(tmp_path / "autotune_log.csv"),
    }
    args = [places.get(arg, arg) for arg in argv[1:]]
    done, _ = hpcdl_run(*args, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    results = _results(done.stdout)
    assert [r["rank"] for r in results] == list(range(ranks)), done.stdout
    assert {r["size"] for r in results} == {ranks}
    assert {r["sum"] for r in results} == {ranks * (ranks + 1) / 2}
    for name, value in expected_env.items():
        assert {r["env"].get(name) for r in results} == {places.get(value, value)}, name


def test_flags_without_effect_are_noted_and_change_nothing(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TINY)
    args = (
        "-np 2 --disable-cache --num-nccl-streams 2 --thread-affinity 1 --mpi-threads-disable "
        "--log-without-timestamp --autotune-gaussian-process-noise 0.75 python train.py"
    )
    done, _ = hpcdl_run(*shlex.split(args), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [r["sum"] for r in _results(done.stdout)] == [3.0, 3.0]
    notes = [line for line in done.stderr.splitlines() if line.startswith("hpcdl run: note: ")]
    assert len(notes) == 5 and all("has no effect here: " in note for note in notes)
    assert "hpcdl run: note: --disable-cache has no effect here: hpcdl run keeps no cache" in done.stderr


def test_version_and_check_build(tmp_path: Path) -> None:
    done, _ = hpcdl_run("-v")
    assert done.returncode == 0 and done.stdout.startswith("hpcdl ")
    done, _ = hpcdl_run("--check-build")
    assert done.returncode == 0 and "Available Frameworks:" in done.stdout


def test_slots_per_host_fills_hosts_the_discovery_script_prints_bare(tmp_path: Path) -> None:
    """horovodrun --slots-per-host: a host printed without ':slots' gets that many."""
    (tmp_path / "train.py").write_text(TINY)
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\necho localhost\n")
    discover.chmod(0o755)
    args = [
        "--min-np",
        "3",
        "--max-np",
        "3",
        "--host-discovery-script",
        str(discover),
        "--slots-per-host",
        "3",
    ]
    done, _ = hpcdl_run(*args, "python", "train.py", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [r["rank"] for r in _results(done.stdout)] == [0, 1, 2]
    assert rank_lines(done.stdout, 2)


@pytest.mark.parametrize(
    "flags",
    [
        ["--network-interfaces", "nosuchnic0,lo"],
        ["--network-interface", "nosuchnic0", "--network-interface", "lo"],
    ],
)
def test_several_network_interfaces_each_host_takes_the_first_it_has(
    tmp_path: Path, flags: list[str]
) -> None:
    show = "echo $HPCDL_IFACE $NCCL_SOCKET_IFNAME"
    done, _ = hpcdl_run("-np", "2", *flags, "--", "sh", "-c", show)
    assert done.returncode == 0, done.stderr
    assert rank_lines(done.stdout, 0) == rank_lines(done.stdout, 1) == ["lo nosuchnic0,lo"]
    (tmp_path / "train.py").write_text(TINY)
    done, _ = hpcdl_run("-np", "2", *flags, "python", "train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [r["sum"] for r in _results(done.stdout)] == [3.0, 3.0]  # they met over lo
