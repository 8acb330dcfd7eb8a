"""The rows of the GPU check's verdict table: what each step's program prints, and the table they make.

A step's program prints one line ``GPU-CHECK-ROW {json}`` per check (``emit``); the driver reads them back
(``parse``) and renders all steps' rows as one Markdown table (``table``) that can be pasted into
benchmarks/README.md. Standard library only: the driver must print its table even when hpcdl did not
install.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

PREFIX = "GPU-CHECK-ROW "

PASS = "pass"
FAIL = "FAIL"
SKIP = "skipped"
MEASURED = "measured"
RESULTS = (PASS, FAIL, SKIP, MEASURED)


@dataclass(frozen=True)
class Row:
    check: str
    result: str  # one of RESULTS
    figure: str

    def __post_init__(self) -> None:
        if self.result not in RESULTS:
            raise ValueError(f"result {self.result!r} is none of {RESULTS}")


def emit(check: str, result: str, figure: str) -> None:
    """Print one row for the driver (from a step's program)."""
    print(PREFIX + json.dumps(asdict(Row(check, result, figure))), flush=True)


def parse(text: str) -> list[Row]:
    """The rows a step's program printed, in order (lines that are not rows are ignored)."""
    rows = []
    for line in text.splitlines():
        at = line.find(PREFIX)
        if at >= 0:
            fields = json.loads(line[at + len(PREFIX) :])
            rows.append(Row(fields["check"], fields["result"], fields["figure"]))
    return rows


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(rows: list[Row]) -> str:
    lines = ["| check | result | figure |", "|---|---|---|"]
    lines += [f"| {_cell(r.check)} | {_cell(r.result)} | {_cell(r.figure)} |" for r in rows]
    return "\n".join(lines)


def passed(rows: list[Row], allow_skips: bool) -> bool:
    """Whether the check passed: no row failed, and (on a device) none was skipped."""
    bad = {FAIL} if allow_skips else {FAIL, SKIP}
    return bool(rows) and not any(r.result in bad for r in rows)
