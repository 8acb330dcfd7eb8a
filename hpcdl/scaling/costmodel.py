"""The scaling model T(W) = G·f(W) + C(W), fitted to a study.

T(W) is the time of a step on W workers, G the compute time of a step on one worker, f(W) = 1/W for strong
scaling (the global batch is split) and 1 for weak scaling (each worker keeps its batch). C(W) is the
communication a step adds, modelled as the ring allreduce of the S bytes a step reduces:

    C(W) = 2(W-1)/W · S/B + 2(W-1)·α

with B the bandwidth (bytes/s) and α the latency of one transfer. G comes from the one-worker step (fitted
with the rest when the study has no one-worker point). B and α come from ``hpcdl bench allreduce --json``
records taken on the same nodes, or are fitted to the study itself by weighted least squares, each point
weighted by the standard error of its repeats. Parameter errors are one standard deviation from the fit's
covariance, scaled by the reduced chi-square when the fit has degrees of freedom left and it exceeds 1.
When S is unknown (a script that reports no optimizer), the bandwidth term is fitted as S/B in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from hpcdl.scaling.results import StudyResults, standard_error
from hpcdl.scaling.study import StudyError

MAX_PREDICTED_WORKERS = 1 << 20
FITTED = (
    "fitted to the study's step times (so they absorb every cost that grows with W: waiting for "
    "collectives, and compute that does not split evenly)"
)
RELATIVE_FLOOR = 1e-3  # a point's standard error is at least this fraction of its step time


@dataclass
class Estimate:
    value: float
    error: Optional[float]  # one standard deviation; None when the data cannot tell
    fitted: bool = True  # False: fixed (e.g. a latency the data could not resolve, set to 0)

    def describe(self, unit: str, scale: float = 1.0, digits: int = 3) -> str:
        """``value ± error unit``, the value to ``digits`` significant digits and the error to as many
        decimals."""
        value = self.value * scale
        decimals = _decimals(value, digits)
        if not self.fitted:
            return f"{value:.{decimals}f} {unit} (fixed)"
        if self.error is None:
            return f"{value:.{decimals}f} {unit} (error unknown)"
        return f"{value:.{decimals}f} ± {self.error * scale:.{decimals}f} {unit}"


def _decimals(value: float, digits: int) -> int:
    if value == 0 or not math.isfinite(value):
        return digits - 1
    return max(0, digits - 1 - math.floor(math.log10(abs(value))))


@dataclass
class CostModel:
    mode: str
    base_workers: int
    compute: Estimate  # G, seconds per step on one worker
    inverse_bandwidth: Estimate  # 1/B in s/byte, or S/B in s when reduced_bytes is None
    latency: Estimate  # α, seconds
    reduced_bytes: Optional[int]  # S of the predictions
    source: str  # where B and α come from
    chi2: Optional[float] = None
    dof: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def bandwidth(self) -> Optional[Estimate]:
        """B in bytes/s (None when S is unknown or the bandwidth term is zero)."""
        inv = self.inverse_bandwidth
        if self.reduced_bytes is None or inv.value <= 0:
            return None
        error = None if inv.error is None else inv.error / inv.value**2
        return Estimate(1.0 / inv.value, error, inv.fitted)

    def compute_share(self, workers: Any) -> Any:
        """f(W); ``workers`` may be a number or a NumPy array (as in every method below)."""
        return 1.0 / workers if self.mode == "strong" else np.ones_like(workers, dtype=np.float64)

    def communication(self, workers: Any) -> Any:
        """C(W) for the study's S (with S unknown, the bandwidth term was fitted as S/B)."""
        size = 1.0 if self.reduced_bytes is None else float(self.reduced_bytes)
        ring = 2 * (workers - 1) / workers * size * self.inverse_bandwidth.value
        return ring + 2 * (workers - 1) * self.latency.value

    def step(self, workers: Any) -> Any:
        return self.compute.value * self.compute_share(workers) + self.communication(workers)

    def speedup(self, workers: Any) -> Any:
        ratio = 1.0 if self.mode == "strong" else workers / self.base_workers
        return ratio * self.step(self.base_workers) / self.step(workers)

    def efficiency(self, workers: Any) -> Any:
        return self.speedup(workers) / (workers / self.base_workers)

    def limit(self, threshold: float) -> Optional[int]:
        """The largest W whose predicted efficiency is still at least ``threshold``; None when it stays
        above it up to MAX_PREDICTED_WORKERS."""
        workers = np.arange(self.base_workers, MAX_PREDICTED_WORKERS + 1, dtype=np.float64)
        below = np.nonzero(self.efficiency(workers) < threshold)[0]
        if below.size == 0:
            return None
        return int(workers[below[0]]) - 1

    def to_json(self) -> dict[str, Any]:
        bandwidth = self.bandwidth
        return {
            "mode": self.mode,
            "base_workers": self.base_workers,
            "compute_s": vars(self.compute),
            "latency_s": vars(self.latency),
            "bandwidth_bytes_per_s": None if bandwidth is None else vars(bandwidth),
            "inverse_bandwidth": vars(self.inverse_bandwidth),
            "reduced_bytes": self.reduced_bytes,
            "source": self.source,
            "chi2": self.chi2,
            "dof": self.dof,
            "notes": self.notes,
        }


@dataclass
class _Fit:
    coefficients: np.ndarray
    covariance: Optional[np.ndarray]
    chi2: float
    dof: int


def _weighted_least_squares(x: np.ndarray, y: np.ndarray, sigma: np.ndarray, known_sigma: bool) -> _Fit:
    """Solve y ≈ x·c with weights 1/sigma²; covariance from the weights (``known_sigma``) scaled by the
    reduced chi-square when there are degrees of freedom and it exceeds 1."""
    xw, yw = x / sigma[:, None], y / sigma
    coefficients, *_ = np.linalg.lstsq(xw, yw, rcond=None)
    residual = yw - xw @ coefficients
    chi2 = float(residual @ residual)
    dof = len(y) - x.shape[1]
    try:
        covariance = np.linalg.inv(xw.T @ xw)
    except np.linalg.LinAlgError:
        return _Fit(coefficients, None, chi2, dof)
    if dof > 0:
        covariance = covariance * (max(1.0, chi2 / dof) if known_sigma else chi2 / dof)
    elif not known_sigma:
        return _Fit(coefficients, None, chi2, dof)
    return _Fit(coefficients, covariance, chi2, dof)


def _nonnegative_fit(
    x: np.ndarray, y: np.ndarray, sigma: np.ndarray, known_sigma: bool, names: list[str]
) -> tuple[list[Estimate], _Fit, list[str]]:
    """Fit the columns of x; a coefficient that comes out negative (a cost cannot be) is fixed at 0 and the
    others refitted. Returns one Estimate per column."""
    active = list(range(x.shape[1]))
    notes = []
    while True:
        fit = _weighted_least_squares(x[:, active], y, sigma, known_sigma)
        negative = [i for i, c in zip(active, fit.coefficients) if c < 0]
        if not negative or len(active) == 1:
            break
        worst = min(negative, key=lambda i: fit.coefficients[active.index(i)])
        notes.append(f"the fitted {names[worst]} came out negative (not resolved by the data): fixed at 0")
        active.remove(worst)
    estimates = [Estimate(0.0, None, fitted=False) for _ in names]
    for position, column in enumerate(active):
        error = None if fit.covariance is None else math.sqrt(max(fit.covariance[position, position], 0.0))
        estimates[column] = Estimate(max(float(fit.coefficients[position]), 0.0), error)
    return estimates, fit, notes


def fit_allreduce(records: list[dict[str, Any]], impl: str = "hpcdl") -> tuple[Estimate, Estimate, str]:
    """(1/B in s/byte, α in s, description) from ``hpcdl bench allreduce --json`` records of ``impl``, each
    time weighted by its own size (relative errors: the sizes span many orders of magnitude)."""
    rows = [r for r in records if r.get("impl") == impl and int(r.get("ranks", 0)) > 1 and r.get("time_s")]
    if len(rows) < 2:
        raise StudyError(
            f"the allreduce records hold {len(rows)} multi-rank {impl} measurement(s); the fit needs at "
            "least two sizes: run hpcdl bench allreduce -np N --json (N > 1) on the study's nodes"
        )
    ranks = np.array([float(r["ranks"]) for r in rows])
    sizes = np.array([float(r["bytes"]) for r in rows])
    times = np.array([float(r["time_s"]) for r in rows])
    x = np.column_stack([2 * (ranks - 1) / ranks * sizes, 2 * (ranks - 1)])
    (inverse_bandwidth, latency), _, notes = _nonnegative_fit(
        x, times, times, known_sigma=False, names=["bandwidth term", "latency"]
    )
    counts = sorted({int(r) for r in ranks})
    what = f"{len(rows)} {impl} allreduce sizes on {','.join(map(str, counts))} ranks"
    return inverse_bandwidth, latency, what + ("; " + "; ".join(notes) if notes else "")


@dataclass
class _Data:
    """A study's points as the columns of the regression."""

    workers: np.ndarray
    steps: np.ndarray
    sigma: np.ndarray
    known_sigma: bool
    share: np.ndarray  # f(W)
    bandwidth_column: np.ndarray  # 2(W-1)/W · S
    latency_column: np.ndarray  # 2(W-1)
    reduced_bytes: Optional[int]  # S of the largest point (None: unknown)

    @classmethod
    def of(cls, results: StudyResults) -> _Data:
        points = results.points
        workers = np.array([float(p.workers) for p in points])
        sizes = [p.reduced_bytes for p in points]
        known = all(s is not None for s in sizes)
        size = np.array([float(s) if known else 1.0 for s in sizes])
        return cls(
            workers=workers,
            steps=np.array([p.step.mean for p in points]),
            sigma=np.array([max(p.step_stderr, RELATIVE_FLOOR * p.step.mean) for p in points]),
            known_sigma=all(p.repeats > 1 for p in points),
            share=1.0 / workers if results.spec.mode == "strong" else np.ones_like(workers),
            bandwidth_column=2 * (workers - 1) / workers * size,
            latency_column=2 * (workers - 1),
            reduced_bytes=int(sizes[-1]) if known else None,  # type: ignore[arg-type]
        )

    def chi2(self, compute: float, inverse_bandwidth: float, latency: float) -> float:
        model = (
            compute * self.share + self.bandwidth_column * inverse_bandwidth + self.latency_column * latency
        )
        return float(np.sum(((self.steps - model) / self.sigma) ** 2))


def _one_worker_compute(results: StudyResults, data: _Data) -> Optional[Estimate]:
    """G from the one-worker point, with the standard error of its repeats (None without such a point)."""
    first = results.points[0]
    if first.workers != 1:
        return None
    error = standard_error(first.step.std, first.repeats) if data.known_sigma else None
    return Estimate(first.step.mean, error)


def _fit_everything(
    results: StudyResults, data: _Data
) -> tuple[Estimate, Estimate, Estimate, _Fit, list[str]]:
    """G (unless a one-worker point gives it), 1/B and α from the study's step times."""
    compute = _one_worker_compute(results, data)
    notes: list[str] = []
    if compute is not None:
        rows = data.workers > 1
        target = data.steps[rows] - compute.value * data.share[rows]
        sigma = np.sqrt(data.sigma[rows] ** 2 + (data.share[rows] * (compute.error or 0.0)) ** 2)
        columns = {"bandwidth term": data.bandwidth_column[rows], "latency": data.latency_column[rows]}
    else:
        rows = np.ones_like(data.workers, dtype=bool)
        target, sigma = data.steps, data.sigma
        columns = {"G": data.share, "bandwidth term": data.bandwidth_column, "latency": data.latency_column}
        notes.append(
            f"no one-worker point: G fitted with the communication terms from W={results.base_workers} up"
        )
    distinct = len(set(data.workers[rows]))
    if distinct < len(columns):
        columns.pop("latency")
        notes.append(
            "too few worker counts to separate bandwidth from latency: α fixed at 0 (measure more worker "
            "counts, or pass --allreduce with hpcdl bench allreduce records)"
        )
    if distinct < len(columns):
        raise StudyError(
            "a model needs more worker counts: measure at least one count above 1 with a one-worker point, "
            "or three counts without one"
        )
    names = list(columns)
    estimates, fit, fit_notes = _nonnegative_fit(
        np.column_stack(list(columns.values())), target, sigma, data.known_sigma, names
    )
    by_name = dict(zip(names, estimates))
    fixed = Estimate(0.0, None, fitted=False)
    return (
        compute if compute is not None else by_name["G"],
        by_name.get("bandwidth term", fixed),
        by_name.get("latency", fixed),
        fit,
        notes + fit_notes,
    )


def fit_study(results: StudyResults, allreduce: Optional[list[dict[str, Any]]] = None) -> CostModel:
    """Fit the model to a study's points; B and α from ``allreduce`` records when given."""
    data = _Data.of(results)
    notes: list[str] = []
    if data.reduced_bytes is None:
        notes.append(
            "the bytes a step reduces are unknown (no optimizer given to StepTimer.watch): the bandwidth "
            "term is fitted as S/B in seconds"
        )
    if allreduce is None:
        compute, inverse_bandwidth, latency, fit, fit_notes = _fit_everything(results, data)
        notes += fit_notes
        if fit.covariance is None:
            notes.append(
                "parameter errors unknown: repeat each point (--repeats 2 or more) or measure more points"
            )
        chi2, dof, source = fit.chi2, fit.dof, FITTED
    else:
        if data.reduced_bytes is None:
            raise StudyError(
                "the allreduce benchmark gives B in bytes/s, but the study does not know the bytes a step "
                "reduces; give the optimizer to StepTimer.watch in your script"
            )
        inverse_bandwidth, latency, what = fit_allreduce(allreduce)
        source = f"measured by hpcdl bench allreduce ({what})"
        one = _one_worker_compute(results, data)
        if one is None:
            comm = data.bandwidth_column * inverse_bandwidth.value + data.latency_column * latency.value
            (one,), _, _ = _nonnegative_fit(
                data.share[:, None], data.steps - comm, data.sigma, data.known_sigma, ["G"]
            )
        compute = one
        chi2 = data.chi2(compute.value, inverse_bandwidth.value, latency.value)
        dof = len(data.steps) - 1  # G, from the one-worker point or fitted
    return CostModel(
        mode=results.spec.mode,
        base_workers=results.base_workers,
        compute=compute,
        inverse_bandwidth=inverse_bandwidth,
        latency=latency,
        reduced_bytes=data.reduced_bytes,
        source=source,
        chi2=chi2,
        dof=dof,
        notes=notes,
    )
