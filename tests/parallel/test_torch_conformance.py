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


def passed_checks(stdout: str, rank: int) -> list[str]:
    return re.findall(rf"^\[{rank}\]<stdout>:PASS (\w+)$", stdout, re.MULTILINE)


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_layouts_gradients_and_errors(ranks: int) -> None:
    command = [
        sys.executable,
        "-m",
        "hpcdl",
        "run",
        "-np",
        str(ranks),
        sys.executable,
        str(CHECKS),
        *SCENARIOS,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=None)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    for rank in range(ranks):
        assert passed_checks(done.stdout, rank) == EXPECTED, output[-3000:]
