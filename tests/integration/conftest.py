"""Fixtures shared by the integration modules: one Slurm test cluster of each shape per test run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Callable

import pytest
from slurm_cluster import SlurmCluster

IDLE_TIMEOUT_S = 60.0


def _quiet(cluster: SlurmCluster) -> None:
    """Cancel whatever jobs an earlier module left and wait until Slurm holds none and every node is idle,
    so that the next module gets the cluster as a fresh one would be (job ids go on counting)."""
    cluster.run(["scancel", "--user", "root"], timeout=30)
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    jobs = nodes = ""
    while time.monotonic() < deadline:
        jobs = cluster.run(["squeue", "-h", "-o", "%i %T"], timeout=30).stdout.strip()
        nodes = cluster.run(["sinfo", "-h", "-N", "-o", "%T"], timeout=30).stdout.split()
        if not jobs and all(state == "idle" for state in nodes):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the Slurm test cluster did not quiet down within {IDLE_TIMEOUT_S:.0f} s: "
                       f"jobs {jobs!r}, nodes {nodes}")  # fmt: skip


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., SlurmCluster]]:
    """``slurm_cluster(**settings)``: the run's Slurm cluster of those settings (see ``SlurmCluster``),
    started when first asked for and stopped when the run ends; a module asking for one that another
    module used gets it with no job left in it. Starting and stopping a cluster takes seconds, so modules
    of the same shape share one."""
    clusters: dict[tuple[tuple[str, Any], ...], SlurmCluster] = {}

    def get(**settings: Any) -> SlurmCluster:
        key = tuple(sorted(settings.items()))
        if key in clusters:
            _quiet(clusters[key])
        else:
            clusters[key] = SlurmCluster(tmp_path_factory.mktemp("slurm"), **settings).start()
        return clusters[key]

    try:
        yield get
    finally:
        for cluster in clusters.values():
            cluster.stop()
