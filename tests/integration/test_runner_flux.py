"""``hpcdl run`` inside a Flux allocation. No Flux instance runs here (not packaged for Debian 12 or
PyPI), so a stand-in ``flux`` on PATH answers ``flux resource list``; the test checks the arguments
hpcdl passes are ones flux-resource(1) accepts and that the ranks are placed from the answer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FAKE_FLUX = """#!/bin/sh
printf '%s\\n' "$@" > "$(dirname "$0")/argv"
[ "$1 $2" = "resource list" ] || { echo "flux: unknown command" >&2; exit 1; }
echo "1 3 0 localhost"
"""


def test_hosts_from_flux_resource_list(tmp_path: Path) -> None:
    flux = tmp_path / "flux"
    flux.write_text(FAKE_FLUX)
    flux.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "LSB_", "COBALT_"))}
    env.update(FLUX_JOB_ID="f2Kq9Lf5", PATH=f"{tmp_path}:{env['PATH']}")
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "run", "--verbose", "--", "sh", "-c", "echo $HPCDL_RANK $HPCDL_SIZE"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "3 ranks on localhost:3 (hosts from the Flux allocation (flux resource list))" in done.stderr
    assert sorted(done.stdout.splitlines()) == [f"[{r}]<stdout>:{r} 3" for r in range(3)]
    # flux resource list [-s STATES] [-n] [-o FORMAT]; the fields are flux-resource(1)'s
    assert (tmp_path / "argv").read_text().splitlines() == [
        "resource", "list", "-s", "up", "-no", "{nnodes} {ncores} {ngpus} {nodelist}",
    ]  # fmt: skip
