"""The allreduce benchmark runs end to end and prints the records tools read."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def bench(*args: str) -> str:
    """``hpcdl bench ARGS``'s standard output, outside any job this test may itself run in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_COMM", "PMI_"))}
    command = [sys.executable, "-m", "hpcdl", "bench", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_allreduce_benchmark_json_records() -> None:
    out = bench("allreduce", "-np", "2", "--sizes", "4,65536", "--repeats", "1", "--json")
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    impls = {r["impl"] for r in records}
    assert {"memcpy", "hpcdl", "gloo"} <= impls
    for r in records:
        assert set(r) >= {"impl", "ranks", "bytes", "time_s", "busbw_gbs"} and r["time_s"] > 0
    hpcdl = {r["bytes"]: r for r in records if r["impl"] == "hpcdl"}
    assert set(hpcdl) == {4, 65536} and all(r["ranks"] == 2 for r in hpcdl.values())
    assert hpcdl[65536]["busbw_gbs"] == 65536 / hpcdl[65536]["time_s"] / 1e9  # 2 ranks: busbw = algbw


def test_allreduce_benchmark_takes_sizes_with_units_and_says_why_mpi4py_is_missing() -> None:
    out = bench("allreduce", "-np", "2", "--sizes", "1KiB", "--repeats", "1", "--no-mpi", "--no-progress")
    assert "    1 KiB |" in out and "mpi4py" not in out.splitlines()[1]  # no mpi4py column
    assert out.rstrip().endswith("(mpi4py not measured: --no-mpi)")


def test_fusion_benchmark_report() -> None:
    options = ["--iterations", "2", "--warmup", "1", "--latency-repeats", "20", "--skip", "torch,gloo"]
    report = json.loads(bench("fusion", "-np", "2", "--no-mpi", "--json", *options))
    assert (report["ranks"], report["tensors"], report["parameters"]) == (2, 161, 25_557_032)
    steps = report["median_step_ms"]
    assert set(steps) == {"engine", "packed", "flat"} and all(ms > 0 for ms in steps.values())
    assert report["engine_vs_flat"] > 0 and report["packed_vs_flat"] > 0
    assert report["torch_vs_flat"] is None and report["gloo_vs_engine"] is None
    assert set(report["lone_4_byte_allreduce_us"]) == {"engine_us", "direct_us"}


def test_latency_benchmark_report_and_a_missing_horovod() -> None:
    options = ["--sizes", "4", "--rounds", "1", "--block-seconds", "0.005", "--no-mpi", "--no-progress"]
    report = json.loads(bench("latency", "-np", "2", "--json", *options))
    row = report["sizes"]["4"]
    assert {"runtime", "engine", "hvd.allreduce", "hvd.allreduce_", "hvd unnamed"} == set(row["median_s"])
    assert all(seconds > 0 for seconds in row["median_s"].values()) and row["hvd.allreduce / runtime"] > 0
    assert row["hvd unnamed / named"] > 0
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "bench", "latency", "--horovod", *options],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode != 0 and "--horovod: horovod is not importable here" in done.stderr, done.stderr


def test_staging_stores_benchmark_times_every_collective_under_each_kind() -> None:
    out = bench(
        "staging_stores", "-np", "2", "--jobs", "1", "--calls", "12", "--sizes", "1048576", "--no-progress"
    )
    rows = [line.split() for line in out.splitlines()[1:]]
    collectives = [row[1] for row in rows]
    assert collectives == ["allgather", "broadcast", "alltoall", "reducescatter", "allreduce"], out
    for row in rows:
        assert row[0] == "1" and row[2:4] == ["1024", "KiB"], row
        kinds = [row[i] for i in (4, 7, 10)]
        assert kinds == ["cached", "streaming", "auto"], row
        times = [int(t) for i in (5, 6, 8, 9, 11, 12) for t in row[i].split("/")]
        assert all(t > 0 for t in times) and float(row[-1]) > 0, row
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_COMM", "PMI_"))}
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "bench", "staging_stores", "--ops", "allgather,gather"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode != 0 and "unknown collectives ['gather']" in done.stderr
