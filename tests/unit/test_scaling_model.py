"""The T = G·f(W) + C(W) fit recovers known parameters from synthetic studies and allreduce records.

Tolerances: with 0.3% noise per run and 3 repeats per point, G is recovered within 1%, B and α within
10%, and each within three of its own reported standard deviations.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from hpcdl.scaling.costmodel import fit_allreduce, fit_study
from hpcdl.scaling.results import RunResult, summarize
from hpcdl.scaling.study import StudyError, StudySpec, Workload

G, B, ALPHA, S = 0.200, 2.5e9, 200e-6, 25_000_000


def true_step(mode: str, workers: int) -> float:
    share = 1 / workers if mode == "strong" else 1.0
    return G * share + 2 * (workers - 1) / workers * S / B + 2 * (workers - 1) * ALPHA


def synthetic_study(mode: str, workers: list[int], noise: float = 0.003, repeats: int = 3, seed: int = 7):
    rng = random.Random(seed)
    spec = StudySpec(mode, workers, Workload(model="small"), repeats=repeats, **_batch(mode))
    runs = []
    for w in workers:
        for r in range(1, repeats + 1):
            step = true_step(mode, w) * (1 + rng.gauss(0, noise))
            runs.append(RunResult(w, r, "steps", step, 0.0, 64, 10, 0.0, S, 1, w, 0))
    return summarize(spec.validate(), runs)


def _batch(mode: str) -> dict:
    return {"global_batch": 64} if mode == "strong" else {"batch": 32}


def assert_recovered(estimate, true: float, tolerance: float) -> None:
    assert estimate.fitted and estimate.error is not None
    assert abs(estimate.value - true) <= tolerance * true, (estimate, true)
    assert abs(estimate.value - true) <= 3 * estimate.error, (estimate, true)


@pytest.mark.parametrize("mode", ["strong", "weak"])
def test_fit_recovers_compute_bandwidth_and_latency(mode: str) -> None:
    results = synthetic_study(mode, [1, 2, 4, 8, 16, 32])
    model = fit_study(results)
    assert_recovered(model.compute, G, 0.01)
    assert model.bandwidth is not None
    assert_recovered(model.bandwidth, B, 0.10)
    assert_recovered(model.latency, ALPHA, 0.10)
    assert model.reduced_bytes == S and model.source.startswith("fitted to the study's step times")
    for w in (2, 8, 32, 64):
        assert model.step(w) == pytest.approx(true_step(mode, w), rel=0.02)


def test_fit_without_a_one_worker_point_fits_compute_too() -> None:
    model = fit_study(synthetic_study("strong", [2, 4, 8, 16, 32]))
    assert_recovered(model.compute, G, 0.05)
    assert_recovered(model.bandwidth, B, 0.15)
    assert any("no one-worker point" in note for note in model.notes)


def test_two_worker_counts_fix_the_latency_and_say_so() -> None:
    model = fit_study(synthetic_study("strong", [1, 2], noise=0.0))
    assert not model.latency.fitted and model.latency.value == 0.0
    assert any("α fixed at 0" in note for note in model.notes)
    assert model.step(2) == pytest.approx(true_step("strong", 2), rel=1e-9)  # one point, one parameter


def test_single_runs_give_values_but_no_errors_without_spare_points() -> None:
    model = fit_study(synthetic_study("strong", [1, 2, 4], repeats=1))
    assert model.compute.error is None and model.dof == 0
    assert any("errors unknown" in note for note in model.notes)


def test_efficiency_limit_matches_a_brute_force_scan() -> None:
    model = fit_study(synthetic_study("strong", [1, 2, 4, 8, 16, 32]))
    limit = model.limit(0.7)
    assert limit is not None and model.efficiency(limit) >= 0.7 > model.efficiency(limit + 1)

    # strong scaling: E(W) = G / (G + W C(W)), from the true parameters
    def true_efficiency(w: int) -> float:
        return G / (G + w * (true_step("strong", w) - G / w))

    true_limit = next(w for w in range(1, 10_000) if true_efficiency(w + 1) < 0.7)
    assert abs(limit - true_limit) <= max(1, 0.1 * true_limit)


def test_weak_scaling_without_latency_never_drops_below_its_asymptote() -> None:
    results = synthetic_study("weak", [1, 2], noise=0.0)
    model = fit_study(results)
    asymptote = G / (G + 2 * S / B)  # α fixed at 0: C(W) -> 2S/B
    assert model.limit(asymptote - 0.01) is None
    assert model.limit(asymptote + 0.01) is not None


def allreduce_records(ranks: int, noise: float = 0.01, seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    records = [{"impl": "memcpy", "ranks": 1, "bytes": 1 << 28, "time_s": 0.02}]
    for size in (4 * 4**k for k in range(14)):
        t = 2 * (ranks - 1) / ranks * size / B + 2 * (ranks - 1) * ALPHA
        measured = t * (1 + rng.gauss(0, noise))
        records.append({"impl": "hpcdl", "ranks": ranks, "bytes": size, "time_s": measured})
        records.append({"impl": "gloo", "ranks": ranks, "bytes": size, "time_s": 10 * t})
    return records


def test_allreduce_records_give_bandwidth_and_latency() -> None:
    inverse_bandwidth, latency, what = fit_allreduce(allreduce_records(4))
    assert_recovered(latency, ALPHA, 0.05)
    bandwidth = 1 / inverse_bandwidth.value
    assert abs(bandwidth - B) < 0.05 * B
    assert "14 hpcdl allreduce sizes on 4 ranks" in what


def test_study_model_with_benchmark_parameters() -> None:
    results = synthetic_study("strong", [1, 2, 4])
    model = fit_study(results, allreduce=allreduce_records(4))
    assert model.source.startswith("measured by hpcdl bench allreduce")
    assert model.bandwidth is not None and abs(model.bandwidth.value - B) < 0.05 * B
    assert model.step(8) == pytest.approx(true_step("strong", 8), rel=0.03)
    assert model.chi2 is not None and math.isfinite(model.chi2)


def test_allreduce_records_without_multi_rank_sizes_are_refused() -> None:
    with pytest.raises(StudyError, match="the fit needs at least two sizes"):
        fit_allreduce([{"impl": "hpcdl", "ranks": 1, "bytes": 4, "time_s": 1e-6}])


def test_speedup_and_efficiency_follow_their_definitions() -> None:
    strong = synthetic_study("strong", [1, 4], noise=0.0)
    t1, t4 = true_step("strong", 1), true_step("strong", 4)
    assert strong.point(4).speedup == pytest.approx(t1 / t4)
    assert strong.point(4).efficiency == pytest.approx(t1 / (4 * t4))
    weak = synthetic_study("weak", [1, 4], noise=0.0)
    t1, t4 = true_step("weak", 1), true_step("weak", 4)
    assert weak.point(4).efficiency == pytest.approx(t1 / t4)
    assert weak.point(4).speedup == pytest.approx(4 * t1 / t4)
    assert np.isclose(weak.point(1).efficiency, 1.0)
