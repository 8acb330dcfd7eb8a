"""Write a study's report into its directory: ``report.md`` (with the pictures), ``report.txt`` (the same
for a terminal, with the text plots), ``results.csv``, ``results.json`` and the PNG/SVG plots."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hpcdl.scaling import report as report_module
from hpcdl.scaling import textplot
from hpcdl.scaling.outputs import OutputDirectory
from hpcdl.scaling.plots import PLOTS, PlotError, render

FORMATS = ("png", "svg")
TEXT_FILES = ("report.md", "report.txt", "results.csv", "results.json")


@dataclass
class Published:
    files: list[Path]
    plot_error: Optional[str]  # why there are no pictures (matplotlib missing)


def publish(
    report: report_module.Report, directory: Path, force: bool = False, formats: tuple[str, ...] = FORMATS
) -> Published:
    """Write every file; refuses (before writing any) to replace files hpcdl did not write, unless forced."""
    out = OutputDirectory(directory, force)
    pictures = [f"{name}.{fmt}" for name in PLOTS for fmt in formats]
    out.check([*TEXT_FILES, *pictures])
    plot_error = None
    try:
        images = render(report, formats)
    except PlotError as exc:
        images, plot_error = {}, str(exc)
    files = [out.write(name, data) for name, data in images.items()]
    shown = [name for name in images if name.endswith(".png")]
    body = report_module.markdown(report, shown)
    if plot_error:
        body += f"\n(no pictures: {plot_error})\n"
    files.append(out.write("report.md", body))
    files.append(
        out.write("report.txt", report_module.text(report) + "\n\n" + textplot.render(report) + "\n")
    )
    files.append(out.write("results.csv", report_module.to_csv(report)))
    files.append(out.write("results.json", json.dumps(report_module.to_json(report), indent=2) + "\n"))
    return Published(files, plot_error)
