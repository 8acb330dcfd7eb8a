"""Every collective and dtype across separate hosts (network namespaces with their own names and addresses):
one rank per host on two and on three hosts (flat TCP rings), two ranks on each of two hosts as the runtime
chooses, forced hierarchical (shared memory within a host, TCP between them) and forced flat, and two ranks on
one host with one on another (the leaders' path, forced); the engine's
fused batches reduced where their tensors are, on both paths; and how a job learns which path its allreduce
takes (``hpcdl run --verbose``, the timeline)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from virtual_hosts import VirtualHosts, missing_requirements

_MISSING = missing_requirements()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no virtual hosts: {_MISSING}")

CHECKS = Path(__file__).parents[1] / "parallel" / "_collective_checks.py"
SEGMENTS = Path(__file__).parents[1] / "parallel" / "test_engine_segments.py"
FAILURES = Path(__file__).parents[1] / "parallel" / "_failure_checks.py"
SECRET = "7c" * 32
_FOREIGN = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "HPCDL_", "HOROVOD_", "MASTER_", "TORCHELASTIC_")
_ports = itertools.count(29600)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VirtualHosts]:
    with VirtualHosts(tmp_path_factory.mktemp("hosts"), ["host1", "host2", "host3"]) as cluster:
        yield cluster


def run_job(
    hosts: VirtualHosts,
    placement: Sequence[str],
    argv: Sequence[str],
    env: Mapping[str, str],
    timeout: float = 240,
) -> list[tuple[int, str, str]]:
    """Rank r of the job on host placement[r], meeting at a rendezvous rank 0 serves on its host; (exit code,
    stdout, stderr) of each rank."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN)}
    common = {"HPCDL_SIZE": str(len(placement)), "HPCDL_RENDEZVOUS_ADDR": placement[0], "HPCDL_TIMEOUT": "60",
              "HPCDL_RENDEZVOUS_PORT": str(next(_ports)), "HPCDL_SECRET": SECRET, "OMP_NUM_THREADS": "1",
              "OPENBLAS_NUM_THREADS": "1", **env}  # fmt: skip
    processes = []
    for rank, host in enumerate(placement):
        own = {"HPCDL_RANK": str(rank), "HPCDL_RENDEZVOUS_SERVE": str(int(rank == 0))}
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        processes.append(
            hosts.popen(host, argv, cwd=Path(__file__).parent, env={**base, **common, **own}, **pipes)
        )
    results = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=timeout)
        finally:
            process.kill()
        results.append((process.returncode, out, err))
    return results


def result_of(out: str) -> dict:
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


JOBS = {
    "2 hosts x 1": (["host1", "host2"], {}),
    "3 hosts x 1": (["host1", "host2", "host3"], {}),
    "2 hosts x 2": (["host1", "host1", "host2", "host2"], {}),
    # forced, with a tiny small-message size: everything but scalars takes the sliced path and the rings
    "2 hosts x 2, sliced": (
        ["host1", "host1", "host2", "host2"],
        {"HPCDL_SMALL_MESSAGE_BYTES": "64", "HPCDL_HIERARCHICAL_ALLREDUCE": "1"},
    ),
    "2 hosts x 2, flat": (["host1", "host1", "host2", "host2"], {"HPCDL_HIERARCHICAL_ALLREDUCE": "0"}),
    # hosts of unequal sizes, forced as above: the leaders' path (sum within host, leaders' ring, broadcast)
    "2 + 1, leaders": (
        ["host1", "host1", "host2"],
        {"HPCDL_SMALL_MESSAGE_BYTES": "64", "HPCDL_HIERARCHICAL_ALLREDUCE": "1"},
    ),
}


@pytest.mark.parametrize("job", list(JOBS))
def test_every_collective_and_dtype_across_hosts(hosts: VirtualHosts, job: str) -> None:
    placement, env = JOBS[job]
    results = run_job(hosts, placement, [sys.executable, str(CHECKS), "quick"], env)
    for rank, (code, out, err) in enumerate(results):
        assert code == 0, f"rank {rank}: {err[-3000:]}"
        found = result_of(out)
        assert found["failures"] == [], found["failures"]
        assert found["checks"] > 800 and (found["rank"], found["size"]) == (rank, len(placement))
        per_host = placement.count(placement[rank])
        shared = per_host > 1 and env.get("HPCDL_HIERARCHICAL_ALLREDUCE") != "0"
        local_rank = placement[:rank].count(placement[rank])
        # Horovod's cross size: the hosts that have a rank with this local rank
        cross_size = sum(placement.count(host) > local_rank for host in set(placement))
        assert (found["local_size"], found["cross_size"]) == (per_host, cross_size)
        assert found["transport_cross"] == "tcp"
        assert found["transport_local"] == ("shm" if shared else "tcp" if per_host > 1 else "self")


def segment_digests(
    hosts: VirtualHosts, placement: list[str], timeline: str, threshold: int
) -> dict[int, dict]:
    """test_engine_segments.py's rank program on `placement`: every rank's PASS lines, and its digests."""
    env = {"HPCDL_FUSION_THRESHOLD": str(threshold)}
    digests = {}
    for rank, (code, out, err) in enumerate(
        run_job(hosts, placement, [sys.executable, str(SEGMENTS), timeline], env)
    ):
        assert code == 0, f"rank {rank}: {err[-3000:]}"
        lines = out.splitlines()
        assert [line.split()[1] for line in lines if line.startswith("PASS ")] == ["dtypes", "join"], out
        digests[rank] = dict(line.split()[1:3] for line in lines if line.startswith("DIGEST "))
    return digests


FUSED_JOBS = {
    **{job: JOBS[job][0] for job in ("2 hosts x 1", "2 hosts x 2")},
    "2 + 1": ["host1", "host1", "host2"],
}


@pytest.mark.parametrize("job", list(FUSED_JOBS))
def test_fused_batches_across_hosts_reduce_tensors_where_they_are(
    hosts: VirtualHosts, tmp_path: Path, job: str
) -> None:
    """The engine fuses tensors of every size across hosts: over the flat TCP ring (one rank per host) and
    through the hierarchical stages (shared memory within a host, TCP between: one ring per member slot on
    hosts of equal sizes, the leaders' ring on unequal ones) it reduces them where they are. In every float
    dtype, in place and out of place, with joined ranks, bit for bit as unfused."""
    placement = FUSED_JOBS[job]
    trace = tmp_path / "fused.json"
    fused = segment_digests(hosts, placement, str(trace), 64 << 20)
    assert segment_digests(hosts, placement, "-", 0) == fused
    assert len({d["dtypes"] for d in fused.values()}) == 1
    events = json.loads(trace.read_text())
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = {(tracks[e["tid"]], e["name"]): e for e in events if e["ph"] == "X"}
    large = spans[("tl.large", "ALLREDUCE")]  # 2.8 MB: fused with a tiny and a medium tensor, never copied
    assert large["args"]["path"] == ("flat" if job == "2 hosts x 1" else "hierarchical")
    assert ("tl.large", "MEMCPY_IN_FUSION_BUFFER") not in spans
    assert large["args"]["fused_tensors"] == 3 and large["args"]["in_place"] is True
    assert ("tl.tiny", "MEMCPY_IN_FUSION_BUFFER") in spans


def test_a_rank_killed_mid_allreduce_is_named_on_every_host(hosts: VirtualHosts) -> None:
    """Two ranks on host1, one on host2, which dies 0.3 s into a loop of 16 MiB allreduces (the leaders'
    path): host1's leader loses its connection, and the other rank of host1, which waits for its leader's
    result, is told what the leader saw. Every survivor names the dead rank within seconds, in each of three
    jobs (which stage the rank dies in varies)."""
    for _ in range(3):
        results = run_job(hosts, ["host1", "host1", "host2"], [sys.executable, str(FAILURES), "kill-during"],
                          {"CHECK_TIMEOUT": "20"}, timeout=90)  # fmt: skip
        assert results[2][0] == -9
        for code, out, err in results[:2]:
            assert code == 0, err[-3000:]
            found = result_of(out)
            assert found["error"] == "HpcdlInternalError", found
            assert "rank 2 (host host2)" in found["message"] and "allreduce" in found["message"], found
            assert found["seconds"] < 5, found


CHOICE = r"""
import json, os, sys
import numpy as np
import hpcdl.common as hc
from hpcdl.common import engine
hc.init()
x = np.ones(1 << 21, dtype=np.float32)  # 8 MiB: the hierarchical path unless forced flat
engine.allreduce_async(x, name="grad", op=hc.ReduceOp.SUM, out=x).wait()
y = np.ones(1024, dtype=np.float32)  # above what travels in control messages
engine.allreduce_async(y, name="tiny", op=hc.ReduceOp.SUM, out=y).wait()
hc.shutdown()
print("RESULT " + json.dumps({"sum": float(x[0] + y[0])}), flush=True)
"""


@pytest.mark.parametrize(("setting", "path"), [(None, "hierarchical"), ("0", "flat")])
def test_the_path_across_hosts_is_chosen_and_shown(
    hosts: VirtualHosts, tmp_path: Path, setting: str | None, path: str
) -> None:
    """Two ranks on each of two hosts: large allreduces hierarchical unless HPCDL_HIERARCHICAL_ALLREDUCE=0;
    hpcdl run --verbose says which, and the timeline marks each allreduce."""
    script = tmp_path / "choice.py"
    script.write_text(CHOICE)
    timeline = tmp_path / f"timeline-{path}.json"
    env = {"HPCDL_TIMELINE": str(timeline), **({"HPCDL_HIERARCHICAL_ALLREDUCE": setting} if setting else {})}
    command = [sys.executable, "-m", "hpcdl", "run", "--verbose", "-H", "host1:2,host2:2", sys.executable]
    command.append(str(script))
    base = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN)}
    done = hosts.run("host1", command, env={**base, **env}, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count('RESULT {"sum": 8.0}') == 4
    shown = {
        "hierarchical": "hierarchical from 1048576 bytes (shared memory within a host, TCP",
        "flat": "flat",
    }
    assert f"hpcdl: 4 ranks on 2 hosts (2 per host); allreduce across hosts: {shown[path]}" in done.stderr
    events = json.loads(timeline.read_text())
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    paths = {tracks[e["tid"]]: e["args"]["path"] for e in events if e.get("name") == "ALLREDUCE"}
    assert paths == {"grad": path, "tiny": "flat"}
