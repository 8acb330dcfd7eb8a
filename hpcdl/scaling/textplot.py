"""The study's curves as text, for a login node without a display (and for logs): the same speed-up,
efficiency and compute/communication pictures as the PNGs, in plain ASCII so any terminal shows them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from hpcdl.scaling.plots import PLOTS
from hpcdl.scaling.report import Report

WIDTH = 64
HEIGHT = 16


@dataclass
class Series:
    name: str
    marker: str
    xs: list[float]
    ys: list[float]


def _scale(value: float, low: float, high: float, cells: int, log: bool) -> int:
    if log:
        value, low, high = math.log2(value), math.log2(low), math.log2(high)
    if high <= low:
        return 0
    return round((value - low) / (high - low) * (cells - 1))


def chart(
    series: list[Series],
    y_label: str,
    x_ticks: list[int],
    y_log: bool = False,
    hline: Optional[tuple[float, str]] = None,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """A character chart of ``series`` on a log2 x axis; later series draw over earlier ones."""
    xs = [x for s in series for x in s.xs] + list(x_ticks)
    ys = [y for s in series for y in s.ys if y > 0 or not y_log]
    if hline is not None:
        ys.append(hline[0])
    x_low, x_high = min(xs), max(xs)
    y_low = min(ys) if y_log else min(0.0, min(ys))
    y_high = max(ys)
    grid = [[" "] * width for _ in range(height)]
    if hline is not None:
        row = height - 1 - _scale(hline[0], y_low, y_high, height, y_log)
        for column in range(width):
            grid[row][column] = hline[1]
    for s in series:
        for x, y in zip(s.xs, s.ys):
            if y_log and y <= 0:
                continue
            column = _scale(x, x_low, x_high, width, True)
            row = height - 1 - _scale(min(max(y, y_low), y_high), y_low, y_high, height, y_log)
            grid[row][column] = s.marker
    label_width = 8
    lines = [f"{y_label}"]
    for index, row in enumerate(grid):
        if index in (0, height // 2, height - 1):
            value = y_high if index == 0 else y_low if index == height - 1 else _middle(y_low, y_high, y_log)
            axis = f"{value:>{label_width - 1}.3g} |"
        else:
            axis = " " * (label_width - 1) + " |"
        lines.append(axis + "".join(row).rstrip())
    lines.append(" " * label_width + "+" + "-" * width)
    ticks = [" "] * (width + 8)
    for tick in x_ticks:
        text = str(tick)
        column = _scale(tick, x_low, x_high, width, True)
        start = min(column, width + 8 - len(text))
        if all(c == " " for c in ticks[max(0, start - 1) : start + len(text) + 1]):
            ticks[start : start + len(text)] = list(text)
    lines.append(" " * (label_width + 1) + "".join(ticks).rstrip() + "   workers W (log2)")
    legend = "   ".join(f"{s.marker} {s.name}" for s in series)
    if hline is not None:
        legend += f"   {hline[1] * 3} threshold {hline[0]:g}"
    lines.append(" " * (label_width + 1) + legend)
    return "\n".join(lines)


def _middle(low: float, high: float, log: bool) -> float:
    return 2 ** ((math.log2(low) + math.log2(high)) / 2) if log else (low + high) / 2


def _curve(report: Report) -> np.ndarray:
    low = report.results.points[0].workers
    high = max([p.workers for p in report.results.points] + [p.workers for p in report.predictions])
    return np.unique(np.geomspace(low, high, WIDTH * 3))


def _ticks(report: Report) -> list[int]:
    return sorted({p.workers for p in report.results.points} | {p.workers for p in report.predictions})


def speedup_chart(report: Report) -> str:
    points = report.results.points
    base = points[0].workers
    curve = _curve(report)
    series = [Series("ideal", ".", list(curve), list(curve / base))]
    if report.model is not None:
        series.append(Series("model", "*", list(curve), list(report.model.speedup(curve))))
    series.append(Series("measured", "o", [p.workers for p in points], [p.speedup for p in points]))
    return chart(series, f"speed-up over W={base} (log2)", _ticks(report), y_log=True)


def efficiency_chart(report: Report) -> str:
    points = report.results.points
    curve = _curve(report)
    series = []
    if report.model is not None:
        series.append(Series("model", "*", list(curve), list(report.model.efficiency(curve))))
    series.append(Series("measured", "o", [p.workers for p in points], [p.efficiency for p in points]))
    return chart(series, "efficiency", _ticks(report), hline=(report.threshold, "-"))


def breakdown_chart(report: Report, width: int = WIDTH) -> str:
    """One bar per W: ``#`` compute, ``=`` communication, scaled to the slowest step."""
    points = report.results.points
    longest = max(p.step.mean for p in points)
    lines = ["time per step: # compute, = communication (waits)"]
    for p in points:
        cells = round(p.step.mean / longest * width)
        comm = 0 if p.comm_s is None else round(p.comm_s / longest * width)
        bar = "#" * max(cells - comm, 0) + "=" * comm
        split = "" if p.comm_s is None else f", communication {100 * p.comm_s / p.step.mean:.0f}%"
        lines.append(f"W={p.workers:<5} |{bar:<{width}}| {p.step.mean * 1e3:.2f} ms{split}")
    return "\n".join(lines)


def render(report: Report) -> str:
    charts = {"speedup": speedup_chart, "efficiency": efficiency_chart, "breakdown": breakdown_chart}
    return "\n\n".join(charts[name](report) for name in PLOTS)
