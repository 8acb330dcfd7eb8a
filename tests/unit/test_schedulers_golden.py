"""Rendered batch scripts for every scheduler compared with reviewed golden files.

Regenerate after an intended change with ``HPCDL_UPDATE_GOLDEN=1 pytest tests/unit/test_schedulers_golden.py``
and review the diff: these files are what users' jobs will run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hpcdl._version import __version__
from hpcdl.schedulers import (
    SCHEDULERS,
    ArraySpec,
    SignalSpec,
    SiteConfig,
    Sweep,
    get_scheduler,
)

GOLDEN = Path(__file__).parent / "golden" / "batch"
SITE = SiteConfig.from_mapping(
    {"modules": ["cuda/12.4"], "setup": ["source $HOME/venv/bin/activate"], "env": {"NCCL_DEBUG": "WARN"}},
    "test site",
)
CASES = {
    "gpu-train": dict(
        command=["train.py", "--epochs", "3"],
        nodes=2,
        gpus_per_node=4,
        cpus_per_rank=8,
        walltime="2h",
        job_name="train",
        account="proj",
        partition="gpu",
    ),
    "cpu-checkpoint": dict(
        command=["python3", "-m", "mypkg.train"],
        nodes=4,
        ranks_per_node=2,
        cpus_per_rank=4,
        walltime="90",
        signal=SignalSpec.parse("USR2@120"),
    ),
    "sweep": dict(
        command=["train.py"],
        nodes=1,
        gpus_per_node=2,
        ranks_per_node=4,
        walltime="00:30:00",
        sweep=Sweep.parse(["LR=0.1,0.01", "BS=32,64"]),
    ),
    "array": dict(command=["bash", "run.sh"], array=ArraySpec.parse("1-8"), walltime="15m", output="out.txt"),
}
# Cobalt has no job arrays: asking for one is an error (test_schedulers_cli.py, test_schedulers_lint.py).
UNSUPPORTED = {("cobalt", "sweep"), ("cobalt", "array")}


def _render(scheduler: str, case: str) -> str:
    settings = dict(CASES[case])
    command = settings.pop("command")
    if case == "array" and scheduler == "pbs":
        settings.pop("output")
    job = SITE.make_job(command, **settings)
    script = get_scheduler(scheduler).render(job, SITE).replace(f"hpcdl {__version__}", "hpcdl VERSION")
    return script.replace(sys.executable, "/venv/bin/python")  # the default: the interpreter hpcdl runs in


GOLDEN_CASES = [(s, c) for s in SCHEDULERS for c in CASES if (s, c) not in UNSUPPORTED]


@pytest.mark.parametrize(("scheduler", "case"), GOLDEN_CASES)
def test_rendered_script_matches_golden(scheduler: str, case: str) -> None:
    path = GOLDEN / f"{scheduler}-{case}.sh"
    script = _render(scheduler, case)
    if os.environ.get("HPCDL_UPDATE_GOLDEN"):
        path.write_text(script)
    assert path.exists(), f"no golden file {path}; run with HPCDL_UPDATE_GOLDEN=1 and review it"
    assert script == path.read_text()


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.sh")), ids=lambda p: p.name)
def test_golden_files_pass_their_schedulers_checker(path: Path) -> None:
    scheduler = get_scheduler(path.name.split("-")[0])
    assert scheduler.validate(path.read_text(), SITE) == []
