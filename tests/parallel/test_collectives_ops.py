"""Every collective x dtype x shape on real ranks, launched the way users launch (``hpcdl run``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _ranks import RankResult, run_ranks

CHECKS = str(Path(__file__).with_name("_collective_checks.py"))


def assert_all_passed(results: list[RankResult], np: int) -> None:
    assert len(results) == np
    for r in results:
        assert r.result is not None, f"rank {r.rank} printed no result:\n{r.stdout}\n{r.stderr}"
        assert r.result["failures"] == [], r.result["failures"]
        assert r.result["checks"] > 1000  # the whole matrix ran
        assert r.result["rank"] == r.rank and r.result["size"] == np


@pytest.mark.parametrize(("np", "mode"), [(1, "full"), (2, "full"), (3, "full"), (5, "full"), (8, "quick")])
def test_every_op_and_dtype_over_shared_memory(np: int, mode: str) -> None:
    results = run_ranks(np, CHECKS, args=(mode,), timeout=180)
    assert_all_passed(results, np)
    for r in results:
        assert r.result["local_size"] == np and r.result["local_rank"] == r.rank
        assert r.result["cross_size"] == 1
        assert r.result["transport_local"] == ("self" if np == 1 else "shm")


def test_every_op_over_tcp_rings() -> None:
    # a tiny small-message threshold sends everything but scalars through the ring algorithms
    env = {"HPCDL_TRANSPORT": "tcp", "HPCDL_SMALL_MESSAGE_BYTES": "16"}
    results = run_ranks(3, CHECKS, env=env, timeout=180)
    assert_all_passed(results, 3)
    assert {r.result["transport_local"] for r in results} == {"tcp"}


def test_shared_memory_chunking_with_tiny_staging_buffers() -> None:
    # 4 KiB staging buffers: every op above a few hundred elements runs in many pipelined steps
    env = {"HPCDL_SHM_CHUNK_BYTES": "4096", "HPCDL_SMALL_MESSAGE_BYTES": "64"}
    assert_all_passed(run_ranks(4, CHECKS, env=env, timeout=180), 4)


def test_hierarchical_allreduce_across_simulated_hosts() -> None:
    hosts = ["node-a", "node-a", "node-b", "node-b", "node-b"]
    results = run_ranks(
        5,
        CHECKS,
        # forced: the runtime's own choice keeps allreduces below 4 MiB on the flat mesh
        env={"HPCDL_HIERARCHICAL_ALLREDUCE": "1"},
        launcher="manual",
        rank_env=lambda r: {"HPCDL_HOSTNAME": hosts[r]},
        timeout=180,
    )
    assert_all_passed(results, 5)
    topology = [(r.result["local_rank"], r.result["local_size"], r.result["cross_rank"]) for r in results]
    assert topology == [(0, 2, 0), (1, 2, 0), (0, 3, 1), (1, 3, 1), (2, 3, 0)]
    assert {(r.result["transport_local"], r.result["transport_cross"]) for r in results} == {("shm", "tcp")}


def test_flat_tcp_ring_across_simulated_hosts() -> None:
    hosts = ["node-a", "node-b", "node-a"]
    results = run_ranks(
        3,
        CHECKS,
        env={"HPCDL_HIERARCHICAL_ALLREDUCE": "0"},
        launcher="manual",
        rank_env=lambda r: {"HPCDL_HOSTNAME": hosts[r]},
        timeout=180,
    )
    assert_all_passed(results, 3)
    assert [r.result["transport_local"] for r in results] == ["tcp", "self", "tcp"]


@pytest.mark.parametrize("stores", ["cached", "streaming", "auto"])
def test_staging_store_kinds_give_exact_results(stores: str) -> None:
    # 64 KiB chunks: pieces of 21 KiB on 3 ranks, large enough for streaming stores, from ragged offsets
    env = {"HPCDL_SHM_STORES": stores, "HPCDL_SHM_CHUNK_BYTES": "65536"}
    results = run_ranks(3, str(Path(__file__).with_name("_staging_checks.py")), env=env, timeout=180)
    assert len(results) == 3
    for r in results:
        assert r.result is not None, f"rank {r.rank} printed no result:\n{r.stdout}\n{r.stderr}"
        assert r.result["failures"] == [] and r.result["checks"] == 32, r.result
