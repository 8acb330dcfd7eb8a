"""hpcdl.torch against Horovod's contract, on 2, 3 and 4 real ranks started by ``hpcdl run``: every
tensor layout (contiguous, offset, transposed, sliced, narrowed, expanded, channels_last, 0-d, empty)
through every collective in every form (sync, async, in place, grouped, on a process set), the gradient
of every differentiable op, and the errors users meet, with the runtime usable after each.

The checks run inside the ranks (``torch_conformance_checks.py``); one job per rank count runs them all,
since starting ranks (importing torch) is the slow part.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CHECKS = HERE / "torch_conformance_checks.py"
SCENARIOS = ("layouts", "autograd", "errors")
EXPECTED = [
    "check_layouts_out_of_place",
    "check_layouts_in_place",
    "check_special_shapes",
    "check_gradients",
    "check_error_classes",
    "check_mismatches_raise_on_every_rank",
    "check_duplicate_names",
    "check_join_misuse_and_recovery",
    "check_asynchronous_submission",
    "check_bad_arguments",
]


def run_checks(ranks: int, scenarios: tuple[str, ...], expected: list[str], env: dict | None = None) -> str:
    """Run the scenarios on ``ranks`` ranks under ``hpcdl run``; assert that every rank passed exactly the
    ``expected`` checks; return the output."""
    command = [
        sys.executable,
        "-m",
        "hpcdl",
        "run",
        "-np",
        str(ranks),
        sys.executable,
        str(CHECKS),
        *scenarios,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    for rank in range(ranks):
        passed = re.findall(rf"^\[{rank}\]<stdout>:PASS (\w+)$", done.stdout, re.MULTILINE)
        assert passed == expected, output[-3000:]
    return output


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_layouts_gradients_and_errors(ranks: int) -> None:
    run_checks(ranks, SCENARIOS, EXPECTED)
