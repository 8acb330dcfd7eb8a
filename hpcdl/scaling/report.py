"""A study's report: the measured table, the fitted model with its errors, measured against model, the
predicted efficiency at larger worker counts and the count beyond which adding workers no longer pays;
as Markdown, CSV, JSON and plain text for a terminal."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass
from typing import Any, Optional

from hpcdl.scaling.costmodel import CostModel, fit_study
from hpcdl.scaling.results import StudyResults
from hpcdl.scaling.study import StudyError, StudySpec

DEFAULT_THRESHOLD = 0.7
COMMUNICATION_MEANING = (
    "communication is the time the training loop waited for collectives inside a step, measured around "
    "the waits (DistributedOptimizer's synchronize); what backward overlapped is not counted"
)


@dataclass
class Prediction:
    workers: int
    step_s: float
    communication_s: float
    speedup: float
    efficiency: float


@dataclass
class Report:
    results: StudyResults
    model: Optional[CostModel]
    threshold: float
    predictions: list[Prediction]
    limit: Optional[int]  # the largest W at or above the threshold (None: above it up to the model's range)
    model_error: str = ""  # why there is no model

    @property
    def spec(self) -> StudySpec:
        return self.results.spec


def default_predictions(results: StudyResults) -> list[int]:
    """Doublings of the largest measured count, up to 1024 or 16 times it."""
    largest = results.points[-1].workers
    counts, w = [], largest * 2
    while w <= max(1024, 16 * largest):
        counts.append(w)
        w *= 2
    return counts


def build(
    results: StudyResults,
    allreduce: Optional[list[dict[str, Any]]] = None,
    threshold: float = DEFAULT_THRESHOLD,
    predict: Optional[list[int]] = None,
) -> Report:
    if not 0 < threshold < 1:
        raise StudyError(f"the efficiency threshold must be between 0 and 1, got {threshold}")
    try:
        model: Optional[CostModel] = fit_study(results, allreduce)
    except StudyError as exc:
        if allreduce is not None:
            raise
        return Report(results, None, threshold, [], None, str(exc))
    counts = sorted(set(predict if predict else default_predictions(results)))
    limit = model.limit(threshold)
    predictions = [
        Prediction(
            w,
            float(model.step(w)),
            float(model.communication(w)),
            float(model.speedup(w)),
            float(model.efficiency(w)),
        )
        for w in counts
    ]
    return Report(results, model, threshold, predictions, limit)


# ---- plain values of the tables ------------------------------------------------------------------------
def _ms(seconds: Optional[float]) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.2f}"


def _num(value: Optional[float], digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def measured_rows(report: Report) -> list[dict[str, Any]]:
    """One row per point, for the CSV and the tables."""
    rows = []
    for p in report.results.points:
        model = report.model
        rows.append(
            {
                "workers": p.workers,
                **{f"param_{k}": v for k, v in p.params.items()},
                "batch_per_worker": p.batch_per_worker,
                "repeats": p.repeats,
                "step_s": p.step.mean,
                "step_std_s": p.step.std,
                "step_min_s": p.step.min,
                "step_max_s": p.step.max,
                "throughput_samples_per_s": p.throughput,
                "speedup": p.speedup,
                "speedup_err": p.speedup_err,
                "efficiency": p.efficiency,
                "efficiency_err": p.efficiency_err,
                "compute_s": p.compute_s,
                "communication_s": p.comm_s,
                "reduced_bytes": p.reduced_bytes,
                "model_step_s": None if model is None else float(model.step(p.workers)),
                "model_communication_s": None if model is None else float(model.communication(p.workers)),
                "model_efficiency": None if model is None else float(model.efficiency(p.workers)),
            }
        )
    return rows


def to_csv(report: Report) -> str:
    rows = measured_rows(report)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return out.getvalue()


def to_json(report: Report) -> dict[str, Any]:
    return {
        "study": report.spec.to_json(),
        "timing": report.results.timing,
        "base_workers": report.results.base_workers,
        "points": [
            {**row, "runs": [asdict(r) for r in point.runs]}
            for row, point in zip(measured_rows(report), report.results.points)
        ],
        "model": None if report.model is None else report.model.to_json(),
        "model_error": report.model_error or None,
        "threshold": report.threshold,
        "limit_workers": report.limit,
        "predictions": [asdict(p) for p in report.predictions],
        "notes": report.results.notes,
    }


# ---- words ------------------------------------------------------------------------------------------------
def title(report: Report) -> str:
    return f"{report.spec.mode.capitalize()} scaling: {report.spec.workload.describe()}"


def setup_line(report: Report) -> str:
    spec = report.spec
    if spec.mode == "strong":
        batch = f"global batch {spec.global_batch}" if spec.global_batch else "the script's own batch"
    else:
        batch = f"batch {spec.batch} per worker" if spec.batch else "the script's own batch"
    params = "".join(f"; {k} = {', '.join(v)}" for k, v in spec.params.items())
    what = (
        f"{spec.repeats} repeat(s) of {spec.steps} steps after {spec.warmup} warm-up steps"
        if report.results.timing == "steps"
        else f"{spec.repeats} timed whole run(s) (the script reports no steps; startup included)"
    )
    where = f"on {spec.host} ({spec.cpus} cores)" if spec.launch == "local" else "as batch jobs"
    counts = ", ".join(map(str, spec.workers))
    return f"W = {counts}; {batch}{params}; {what}; run {where}, hpcdl {spec.hpcdl_version}"


def model_lines(report: Report) -> list[str]:
    model = report.model
    if model is None:
        return [f"no model: {report.model_error}"]
    share = "G/W" if model.mode == "strong" else "G"
    lines = [f"T(W) = {share} + C(W),  C(W) = 2(W-1)/W · S/B + 2(W-1)·α"]
    lines.append(f"G = {model.compute.describe('ms', 1e3)}  (compute of one step on one worker)")
    bandwidth = model.bandwidth
    if bandwidth is not None:
        lines.append(f"B = {bandwidth.describe('GB/s', 1e-9)}")
    elif model.reduced_bytes is None:
        lines.append(f"S/B = {model.inverse_bandwidth.describe('ms', 1e3)}")
    else:
        lines.append("B: no bandwidth term (fixed at infinity)")
    lines.append(f"α = {model.latency.describe('us', 1e6)}")
    if model.reduced_bytes is not None:
        lines.append(f"S = {model.reduced_bytes / 1e6:.2f} MB reduced per step")
    fit = f"χ² = {model.chi2:.2f} for {model.dof} degree(s) of freedom" if model.chi2 is not None else ""
    lines.append(f"B and α {model.source}" + (f"; {fit}" if fit else ""))
    return lines


def limit_line(report: Report) -> str:
    if report.model is None:
        return ""
    if report.limit is None:
        return f"the model keeps efficiency at or above {report.threshold:g} for every W it covers"
    return (
        f"efficiency stays at or above {report.threshold:g} up to W = {report.limit}; "
        f"beyond, adding workers no longer pays (model)"
    )


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table with its columns padded, so that it also reads as plain text."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.rjust(width) for cell, width in zip(cells, widths)) + " |"

    rule = "|" + "|".join("-" * (width + 1) + ":" for width in widths) + "|"
    return [line(header), rule, *(line(row) for row in rows)]


def measured_table(report: Report) -> list[str]:
    rows = []
    for p in report.results.points:
        comm_share = "" if p.comm_s is None else f"{100 * p.comm_s / p.step.mean:.0f}%"
        rows.append(
            [
                str(p.workers),
                "" if p.batch_per_worker is None else str(p.batch_per_worker),
                f"{_ms(p.step.mean)} ± {_ms(p.step.std)}",
                "" if p.throughput is None else f"{p.throughput:.1f}",
                f"{p.speedup:.2f} ± {p.speedup_err:.2f}",
                f"{p.efficiency:.2f} ± {p.efficiency_err:.2f}",
                _ms(p.compute_s),
                _ms(p.comm_s),
                comm_share,
            ]
        )
    header = ["W", "batch/worker", "step (ms)", "samples/s", "speed-up", "efficiency"]
    return _table([*header, "compute (ms)", "communication (ms)", "comm share"], rows)


def model_table(report: Report) -> list[str]:
    model = report.model
    if model is None:
        return []
    rows = []
    for p in report.results.points:
        predicted = float(model.step(p.workers))
        rows.append(
            [
                str(p.workers),
                _ms(p.step.mean),
                _ms(predicted),
                f"{100 * (p.step.mean - predicted) / predicted:+.1f}%",
                _ms(p.comm_s),
                _ms(float(model.communication(p.workers))),
                f"{p.efficiency:.2f}",
                f"{float(model.efficiency(p.workers)):.2f}",
            ]
        )
    header = ["W", "measured step (ms)", "model step (ms)", "measured - model", "measured comm (ms)"]
    return _table([*header, "model C(W) (ms)", "measured efficiency", "model efficiency"], rows)


def prediction_table(report: Report) -> list[str]:
    rows = [
        [str(p.workers), _ms(p.step_s), _ms(p.communication_s), f"{p.speedup:.1f}", f"{p.efficiency:.2f}"]
        for p in report.predictions
    ]
    return _table(["W", "step (ms)", "C(W) (ms)", "speed-up", "efficiency"], rows) if rows else []


def markdown(report: Report, images: list[str]) -> str:
    spec = report.spec
    lines = [f"# {title(report)}", ""]
    if spec.command_line:
        lines += ["Made with:", "", "```console", f"$ {spec.command_line}", "```", ""]
    lines += [setup_line(report) + ".", ""]
    lines += ["## Measured", "", *measured_table(report), ""]
    if report.results.timing == "steps":
        lines += [
            "Step times are means over ranks and steps, ± the standard deviation of the repeats; "
            f"{COMMUNICATION_MEANING}.",
            "",
        ]
    lines += ["## Model", ""]
    lines += [f"- {line}" for line in model_lines(report)]
    lines.append("")
    if report.model is not None:
        lines += ["### Measured against the model", "", *model_table(report), ""]
        lines += ["### Predicted", "", *prediction_table(report), ""]
        sentence = limit_line(report)
        lines += [sentence[:1].upper() + sentence[1:] + ".", ""]
    notes = report.results.notes + (report.model.notes if report.model else [])
    if notes:
        lines += ["## Notes", "", *[f"- {note}" for note in notes], ""]
    if images:
        lines += ["## Plots", "", *[f"![{name.split('.')[0]}]({name})" for name in images], ""]
    return "\n".join(lines)


def text(report: Report) -> str:
    """The report for a terminal: tables, model, limit and notes (no plots)."""
    lines = [title(report), setup_line(report), "", *measured_table(report), ""]
    lines += model_lines(report)
    if report.model is not None:
        lines += ["", *model_table(report), "", *prediction_table(report), "", limit_line(report)]
    notes = report.results.notes + (report.model.notes if report.model else [])
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)
