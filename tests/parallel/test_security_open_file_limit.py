"""``hpcdl run`` under an open-file limit too low for the job's rendezvous: the ranks fail with the real
cause (the limit, and how to raise it), not with a missing job secret."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runner_helpers import clean_env

INIT = "import hpcdl.common as hc\nhc.init()\nprint('joined', hc.rank(), flush=True)\n"


def test_a_low_open_file_limit_is_what_the_ranks_report(tmp_path: Path) -> None:
    script = tmp_path / "init.py"
    script.write_text(INIT)
    done = subprocess.run(
        ["/bin/sh", "-c", 'ulimit -n 64 && exec "$@"', "sh", sys.executable, "-m", "hpcdl", "run", "-np", "2",
         sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )  # fmt: skip
    assert done.returncode != 0 and "joined" not in done.stdout
    output = done.stdout + done.stderr
    assert "HPCDL_SECRET is not set" not in output
    assert "hpcdl run: warning: no rendezvous server for the ranks (this rank needs about" in done.stderr
    assert "rank 0 cannot host the rendezvous: this rank needs about" in output
    assert "may open at most 64 (ulimit -Hn); raise the limit where the job starts" in output
