"""The study's pictures with matplotlib: speed-up against W with the ideal line and the model curve,
efficiency against W with the threshold, and a stacked compute/communication bar per W.

matplotlib is the ``plot`` extra (``pip install 'hpcdl[plot]'``); without it the report is written without
pictures and says how to get them. Figures are drawn on the Agg canvas (no display needed).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from hpcdl.common.exceptions import HpcdlError
from hpcdl.scaling.report import Report, title
from hpcdl.scaling.results import PointResult

# Line colours, fixed so that the pictures read alike (and tests can find the curves).
MEASURED = "#1f77b4"
MODEL = "#ff7f0e"
IDEAL = "#7f7f7f"
THRESHOLD = "#d62728"
COMPUTE = "#1f77b4"
COMMUNICATION = "#ff7f0e"
SIZE_INCHES = (8.0, 5.0)
DPI = 100
PLOTS = ("speedup", "efficiency", "breakdown")


class PlotError(HpcdlError):
    """matplotlib is missing, or a picture cannot be drawn."""


def _figure() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError(
            "the PNG/SVG plots need matplotlib: pip install 'hpcdl[plot]' (the report, CSV, JSON and the "
            "terminal plots were written without it)"
        ) from None
    return Figure(figsize=SIZE_INCHES, dpi=DPI)


def _curve_workers(report: Report) -> np.ndarray:
    low = report.results.points[0].workers
    high = max([p.workers for p in report.results.points] + [p.workers for p in report.predictions])
    return np.unique(np.geomspace(low, high, 200))


def _log2_axis(axes: Any, report: Report) -> None:
    axes.set_xscale("log", base=2)
    ticks = sorted({p.workers for p in report.results.points} | {p.workers for p in report.predictions})
    axes.set_xticks(ticks)
    axes.set_xticklabels([str(t) for t in ticks])
    axes.set_xlabel("workers W")
    axes.grid(True, which="major", alpha=0.3)


def _measured(axes: Any, points: list[PointResult], values: list[float], errors: list[float]) -> None:
    """The measured points, joined, with their error bars."""
    workers = [p.workers for p in points]
    axes.errorbar(
        workers, values, yerr=errors, fmt="o-", color=MEASURED, linewidth=2.5, markersize=7, capsize=4,
        label="measured",
    )  # fmt: skip


def speedup_figure(report: Report) -> Any:
    figure = _figure()
    axes = figure.add_subplot()
    points = report.results.points
    base = points[0].workers
    curve = _curve_workers(report)
    axes.plot(curve, curve / base, "--", color=IDEAL, linewidth=2, label="ideal")
    if report.model is not None:
        axes.plot(curve, report.model.speedup(curve), "-", color=MODEL, linewidth=2.5, label="model")
    _measured(axes, points, [p.speedup for p in points], [p.speedup_err for p in points])
    _log2_axis(axes, report)
    axes.set_yscale("log", base=2)
    axes.set_ylabel(f"speed-up over W={base}")
    axes.set_title(title(report), fontsize=10)
    axes.legend()
    return figure


def efficiency_figure(report: Report) -> Any:
    figure = _figure()
    axes = figure.add_subplot()
    points = report.results.points
    curve = _curve_workers(report)
    if report.model is not None:
        axes.plot(curve, report.model.efficiency(curve), "-", color=MODEL, linewidth=2.5, label="model")
    _measured(axes, points, [p.efficiency for p in points], [p.efficiency_err for p in points])
    axes.axhline(
        report.threshold,
        color=THRESHOLD,
        linestyle=":",
        linewidth=1.5,
        label=f"threshold {report.threshold:g}",
    )
    if report.limit is not None and report.limit <= curve[-1]:
        axes.axvline(report.limit, color=THRESHOLD, linestyle=":", linewidth=1, alpha=0.6)
        axes.annotate(
            f"W={report.limit}", (report.limit, report.threshold), textcoords="offset points", xytext=(4, 6)
        )
    _log2_axis(axes, report)
    axes.set_ylim(0, 1.1 * max(1.0, *(p.efficiency + p.efficiency_err for p in points)))
    axes.set_ylabel("efficiency")
    axes.set_title(title(report), fontsize=10)
    axes.legend()
    return figure


def breakdown_figure(report: Report) -> Any:
    figure = _figure()
    axes = figure.add_subplot()
    points = report.results.points
    labels = [str(p.workers) for p in points]
    positions = np.arange(len(points))
    steps_ms = np.array([p.step.mean * 1e3 for p in points])
    spread_ms = np.array([p.step.std * 1e3 for p in points])
    if all(p.comm_s is not None for p in points):
        comm_ms = np.array([p.comm_s * 1e3 for p in points])  # type: ignore[operator]
        axes.bar(positions, steps_ms - comm_ms, color=COMPUTE, label="compute")
        axes.bar(
            positions, comm_ms, bottom=steps_ms - comm_ms, color=COMMUNICATION, label="communication (waits)"
        )
    else:
        axes.bar(positions, steps_ms, color=COMPUTE, label="whole step (not split: no step records)")
    axes.errorbar(positions, steps_ms, yerr=spread_ms, fmt="none", ecolor="black", capsize=4)
    if report.model is not None:
        ideal_ms = [report.model.compute.value * report.model.compute_share(p.workers) * 1e3 for p in points]
        axes.hlines(
            ideal_ms, positions - 0.4, positions + 0.4, colors=IDEAL, linestyles="--", linewidth=2,
            zorder=3, label=_compute_label(report),
        )  # fmt: skip
    axes.set_xticks(positions)
    axes.set_xticklabels(labels)
    axes.set_xlabel("workers W")
    axes.set_ylabel("time per step (ms)")
    axes.set_title(title(report), fontsize=10)
    axes.legend()
    return figure


def _compute_label(report: Report) -> str:
    return "model compute G/W" if report.spec.mode == "strong" else "model compute G"


_FIGURES = {"speedup": speedup_figure, "efficiency": efficiency_figure, "breakdown": breakdown_figure}


def render(report: Report, formats: tuple[str, ...] = ("png", "svg")) -> dict[str, bytes]:
    """``{file name: bytes}`` of every picture in every format."""
    _figure()  # the clear error when matplotlib is missing, before any work
    import matplotlib

    files = {}
    with matplotlib.rc_context({"svg.hashsalt": "hpcdl"}):
        for name, make in _FIGURES.items():
            figure = make(report)
            figure.tight_layout()
            for fmt in formats:
                buffer = io.BytesIO()
                figure.savefig(buffer, format=fmt, dpi=DPI, metadata=_metadata(fmt))
                files[f"{name}.{fmt}"] = buffer.getvalue()
    return files


def _metadata(fmt: str) -> dict[str, Any]:
    """No creation dates or versions in the files, so the same study draws the same bytes."""
    if fmt == "svg":
        return {"Date": None, "Creator": None}
    if fmt == "png":
        return {"Software": None}
    return {}
