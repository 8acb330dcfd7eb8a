"""Rank program of the failure tests. argv: scenario. Prints RESULT {...} with what happened."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np

import hpcdl.common as hc


def main() -> None:
    scenario = sys.argv[1]
    hc.init(timeout=float(os.environ.get("CHECK_TIMEOUT", "30")))
    r = hc.rank()
    victim = hc.size() - 1
    out: dict = {"rank": r}
    # "kill-during": the victim dies 0.3 s into a loop of 16 MiB allreduces, mostly in their data phase
    data = np.ones(1 << (22 if scenario == "kill-during" else 18), dtype=np.float32)
    hc.allreduce(data)  # everybody is up and connected
    if scenario == "kill-during" and r == victim:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    if scenario in ("kill", "hang") and r == victim:
        if scenario == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(8)  # hung: alive, but not calling the collective for longer than the deadline
    started = time.monotonic()
    try:
        for _ in range(1000):
            hc.allreduce(data)
        out["error"] = None
    except hc.HpcdlError as exc:
        out["error"] = type(exc).__name__
        out["message"] = str(exc)
    out["seconds"] = time.monotonic() - started
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)  # the job is broken; do not wait for the dead rank in shutdown


if __name__ == "__main__":
    main()
