"""``hpcdl bench allreduce --hosts``: the cross-host comparison runs end to end on namespace hosts and records
the TCP ceiling it is measured against (one stream, several, both ways at once, a round trip)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from virtual_hosts import VirtualHosts, missing_requirements

_MISSING = missing_requirements()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no virtual hosts: {_MISSING}")
_FOREIGN = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "HPCDL_", "HOROVOD_", "MASTER_")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VirtualHosts]:
    with VirtualHosts(tmp_path_factory.mktemp("hosts"), ["host1", "host2"]) as cluster:
        yield cluster


@pytest.mark.parametrize(
    "placement", ["host1:1,host2:1", pytest.param("host1:2,host2:2", marks=pytest.mark.slow)]
)
def test_allreduce_benchmark_across_hosts_records_the_tcp_ceiling(
    hosts: VirtualHosts, placement: str
) -> None:
    """One rank per host: hpcdl, its engine path, gloo and Open MPI; two per host: also both hpcdl paths."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN)}
    command = [
        sys.executable,
        "-m",
        "hpcdl",
        "bench",
        "allreduce",
        "--hosts",
        placement,
        "--sizes",
        "4,65536",
    ]
    command += ["--repeats", "1", "--json", "--no-progress"]
    done = hosts.run("host1", command, env=env, cwd=Path(tempfile.gettempdir()), timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by_impl = {(r["impl"], r["bytes"]): r for r in records}
    ranks = 2 if placement.endswith(":1") else 4
    impls = ["hpcdl", "gloo", "hpcdl.torch", *(["hpcdl-flat", "hpcdl-hier"] if ranks == 4 else [])]
    impls += ["mpi4py"] if ("mpi4py", 4) in by_impl else []
    for impl in impls:
        assert {(impl, 4), (impl, 65536)} <= set(by_impl), impl
        assert by_impl[(impl, 65536)]["ranks"] == ranks and by_impl[(impl, 65536)]["time_s"] > 0
    for probe in ("tcp-1-stream", "tcp-2-streams", "tcp-4-streams", "tcp-both-ways"):
        assert by_impl[(probe, 64 << 20)]["algbw_gbs"] > 0 and by_impl[(probe, 64 << 20)]["ranks"] == 2, probe
    assert 0 < by_impl[("tcp-round-trip", 1)]["time_s"] < 0.1


def test_fusion_benchmark_across_hosts_compares_the_engine_with_the_runtime(hosts: VirtualHosts) -> None:
    """``benchmarks/fusion.py --hosts``: engine, hpcdl.torch, the direct call and gloo, a rank per host."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN)}
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "fusion.py"
    command = [sys.executable, str(script), "--hosts", "host1:1,host2:1", "--iterations", "1"]
    command += ["--warmup", "1", "--latency-repeats", "10", "--skip", "packed,mpi4py"]
    command += ["--json", "--no-progress"]
    done = hosts.run("host1", command, env=env, cwd=Path(tempfile.gettempdir()), timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("{") :])
    assert report["ranks"] == 2
    assert set(report["median_step_ms"]) == {"engine", "flat", "hpcdl.torch", "gloo"}
    assert all(ms > 0 for ms in report["median_step_ms"].values())
    assert report["torch_vs_flat"] > 0 and report["gloo_vs_engine"] > 0
