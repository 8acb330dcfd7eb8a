"""From the ranks' records to the figures of each point: step time, throughput, speed-up, efficiency and the
measured split of a step into compute and communication, each with its spread over the repeats.

A run's step time is the mean over its measured steps (warm-up discarded) of the mean over ranks; its
communication is the time the ranks waited for collectives inside those steps (measured by the
:class:`~hpcdl.common.steps.StepTimer`), and compute the rest. A point is the mean over its repeats, with
their sample standard deviation, minimum and maximum. When a script reports no steps, whole runs are timed
(the slowest rank's run) and the split is not available.

Speed-up is the ratio of work rates against the smallest worker count W0 (strong: T0/TW; weak: W/W0 x
T0/TW) and efficiency is speed-up over W/W0 (strong: W0 T0/(W TW), with W0 = 1 the textbook T1/(W TW);
weak: T0/TW).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hpcdl.common.steps import RankSteps, StepRecordError, read_run_steps, read_run_times
from hpcdl.scaling.study import StudyError, StudySpec, plan, repeat_dir


@dataclass
class RunResult:
    workers: int
    repeat: int
    timing: str  # "steps" or "run"
    step_s: float
    comm_s: Optional[float]
    samples_per_step: Optional[int]  # over all workers
    steps: int  # measured steps (warm-up discarded); 1 for a timed run
    step_std_s: float  # spread of the steps within the run
    reduced_bytes: Optional[int]
    hosts: int
    ranks_per_host: int
    cpus_per_host: int  # the smallest core count of the run's hosts (0: unknown)


@dataclass
class Spread:
    mean: float
    std: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(statistics.fmean(values), std, min(values), max(values))


@dataclass
class PointResult:
    workers: int
    params: dict[str, str]
    batch_per_worker: Optional[int]
    runs: list[RunResult]
    step: Spread
    comm_s: Optional[float]
    compute_s: Optional[float]
    throughput: Optional[float]  # samples per second over all workers
    speedup: float = 1.0
    speedup_err: float = 0.0
    efficiency: float = 1.0
    efficiency_err: float = 0.0
    reduced_bytes: Optional[int] = None
    ranks_per_host: int = 1
    cpus_per_host: int = 0

    @property
    def repeats(self) -> int:
        return len(self.runs)

    @property
    def step_stderr(self) -> float:
        return standard_error(self.step.std, self.repeats)


@dataclass
class StudyResults:
    spec: StudySpec
    points: list[PointResult]
    timing: str
    base_workers: int
    notes: list[str] = field(default_factory=list)

    def point(self, workers: int) -> PointResult:
        for p in self.points:
            if p.workers == workers:
                return p
        raise KeyError(workers)


def standard_error(std: float, count: int) -> float:
    return std / math.sqrt(count) if count > 1 else 0.0


def read_run(spec: StudySpec, directory: Path, workers: int, repeat: int) -> RunResult:
    """One run's figures from its records."""
    where = repeat_dir(directory, workers, repeat)
    label = f"W={workers} repeat {repeat}"
    if not where.is_dir():
        raise StudyError(f"{label} has no records: {where} does not exist (did the run or its job start?)")
    try:
        ranks = read_run_steps(where)
        if ranks:
            return _from_steps(spec, ranks, workers, repeat, where, label)
        timed = read_run_times(where)
    except StepRecordError as exc:
        raise StudyError(f"{label}: {exc}") from None
    if timed:
        _check_ranks(sorted(timed), workers, label, where, "run records")
        failed = {rank: r["exit"] for rank, r in timed.items() if r.get("exit") != 0}
        if failed:
            raise StudyError(f"{label}: ranks exited with {failed}; see the run's output in {where.parent}")
        hosts = {r.get("host", "") for r in timed.values()}
        batch = spec.batch_for(workers)
        return RunResult(
            workers=workers,
            repeat=repeat,
            timing="run",
            step_s=max(float(r["seconds"]) for r in timed.values()),
            comm_s=None,
            samples_per_step=None if batch is None else batch * workers,
            steps=1,
            step_std_s=0.0,
            reduced_bytes=None,
            hosts=len(hosts),
            ranks_per_host=math.ceil(workers / max(1, len(hosts))),
            cpus_per_host=min(int(r.get("cpus") or 0) for r in timed.values()),
        )
    raise StudyError(
        f"{label}: no step or run records in {where}; the ranks did not start or wrote elsewhere "
        "(see the run's output beside it)"
    )


def _check_ranks(ranks: list[int], workers: int, label: str, where: Path, what: str) -> None:
    missing = sorted(set(range(workers)) - set(ranks))
    if missing:
        raise StudyError(
            f"{label}: rank(s) {', '.join(map(str, missing))} of {workers} wrote no {what} to {where}; "
            "every rank must create its StepTimer (or the run was cut short: see its output)"
        )


def _from_steps(
    spec: StudySpec, ranks: dict[int, RankSteps], workers: int, repeat: int, where: Path, label: str
) -> RunResult:
    _check_ranks(sorted(ranks), workers, label, where, "step records")
    sizes = {r.size for r in ranks.values()}
    if sizes != {workers}:
        raise StudyError(
            f"{label}: the ranks ran in a job of {sorted(sizes)} ranks, not {workers}; "
            "a study point must run exactly its own worker count"
        )
    counts = {rank: len(r.steps) for rank, r in ranks.items()}
    measured = min(counts.values()) - spec.warmup
    if measured < 1:
        rank, count = min(counts.items(), key=lambda kv: kv[1])
        raise StudyError(
            f"{label}: rank {rank} recorded {count} step(s), no more than the {spec.warmup} warm-up steps; "
            "run more steps or lower --warmup"
        )
    per_step, per_comm, samples = [], [], []
    for index in range(spec.warmup, spec.warmup + measured):
        records = [r.steps[index] for r in ranks.values()]
        per_step.append(statistics.fmean(float(s["seconds"]) for s in records))
        per_comm.append(statistics.fmean(float(s.get("comm", 0.0)) for s in records))
        counted = [s.get("samples") for s in records]
        samples.append(None if any(c is None for c in counted) else sum(int(c) for c in counted))
    sizes_reduced = {r.reduced_bytes for r in ranks.values()} - {None}
    hosts = {r.host for r in ranks.values()}
    return RunResult(
        workers=workers,
        repeat=repeat,
        timing="steps",
        step_s=statistics.fmean(per_step),
        comm_s=statistics.fmean(per_comm),
        samples_per_step=samples[0] if samples and len(set(samples)) == 1 else None,
        steps=measured,
        step_std_s=statistics.stdev(per_step) if measured > 1 else 0.0,
        reduced_bytes=max(sizes_reduced) if sizes_reduced else None,
        hosts=len(hosts),
        ranks_per_host=math.ceil(workers / len(hosts)),
        cpus_per_host=min(r.cpus for r in ranks.values()),
    )


def _relative_error(*pairs: tuple[float, float]) -> float:
    """First-order relative error of a product/quotient of independent values (value, error)."""
    return math.sqrt(sum((err / value) ** 2 for value, err in pairs if value))


def summarize(spec: StudySpec, runs: list[RunResult]) -> StudyResults:
    """Points from runs, with speed-up and efficiency against the smallest worker count."""
    timings = {r.timing for r in runs}
    if len(timings) > 1:
        raise StudyError(
            "some runs reported steps and others only whole-run times; a study needs one kind: "
            "create the StepTimer on every run, or none"
        )
    points = []
    for workers in spec.workers:
        mine = [r for r in runs if r.workers == workers]
        if not mine:
            continue
        step = Spread.of([r.step_s for r in mine])
        comm = [r.comm_s for r in mine if r.comm_s is not None]
        comm_s = statistics.fmean(comm) if len(comm) == len(mine) else None
        samples = {r.samples_per_step for r in mine}
        per_step = samples.pop() if len(samples) == 1 else None
        reduced = {r.reduced_bytes for r in mine} - {None}
        points.append(
            PointResult(
                workers=workers,
                params=spec.params_for(workers),
                batch_per_worker=spec.batch_for(workers),
                runs=mine,
                step=step,
                comm_s=comm_s,
                compute_s=None if comm_s is None else step.mean - comm_s,
                throughput=None if per_step is None else per_step / step.mean,
                reduced_bytes=max(reduced) if reduced else None,
                ranks_per_host=max(r.ranks_per_host for r in mine),
                cpus_per_host=min(r.cpus_per_host for r in mine),
            )
        )
    if not points:
        raise StudyError("the study has no finished runs to report")
    base = points[0]
    notes = []
    if base.workers != 1:
        notes.append(f"speed-up and efficiency are relative to W={base.workers}, the smallest worker count")
    crowded = [p for p in points if p.cpus_per_host and p.ranks_per_host > p.cpus_per_host]
    if crowded:
        first = crowded[0]
        notes.append(
            f"from W={first.workers} on, {first.ranks_per_host} ranks share a host of {first.cpus_per_host} "
            "cores: their compute cannot scale there, and the model's G/W does not hold"
        )
    for p in points:
        ratio = spec.work_ratio(p.workers, base.workers)
        p.speedup = ratio * base.step.mean / p.step.mean
        scale = p.workers / base.workers
        p.efficiency = p.speedup / scale
        rel = _relative_error((base.step.mean, base.step_stderr), (p.step.mean, p.step_stderr))
        p.speedup_err = p.speedup * rel if p is not base else 0.0
        p.efficiency_err = p.efficiency * rel if p is not base else 0.0
    return StudyResults(spec, points, timings.pop(), base.workers, notes)


def collect(spec: StudySpec, directory: Path) -> StudyResults:
    """Read every run of the study from its directory."""
    return summarize(spec, [read_run(spec, directory, r.workers, r.repeat) for r in plan(spec)])
