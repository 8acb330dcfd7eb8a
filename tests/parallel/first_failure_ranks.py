"""Rank program of the first-failure tests: one rank (CULPRIT, default the last) fails as argv[1] says while
the others call a collective every 5 ms (the pace at which a launcher most often saw a consequence first).

- ``raise``: ValueError right after init; with SLOW_EXIT=S the rank then takes S seconds to exit after the
  runtime's shutdown told the others (a data loader's workers, a logger flushing), so every other rank's
  failure reaches the launcher before this rank's exit does. ``raise-unseen``: the same ValueError, its
  stderr sent to /dev/null first (its traceback never reaches the launcher, as when mpirun dies first).
- ``kill``: SIGKILL; ``exit0``: exits 0 while the others wait for it; ``oom``: allocates until the kernel's
  OOM killer ends it; ``stuck``: sleeps in ``stuck_in_dataloader()`` while the others wait in
  ``allreduce('grad.2')`` (the stall shutdown cancels it); ``stuck-in-c``: sleeps in a C call that holds the
  GIL, in ``stuck_in_c_call()``; ``shape``: reduces a tensor of another shape than the others'.

SECOND=R:HOW makes rank R fail too, as HOW says. FIRST_SUBMIT_AFTER=S makes the other ranks wait S seconds
after init before their first collective (a data loader's first batch).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
import time

import numpy as np

import hpcdl.common as hc
from hpcdl.common import engine, stacks


def stuck_in_dataloader() -> None:
    time.sleep(120)


def stuck_in_c_call() -> None:
    # PyDLL: the call keeps the GIL. A signal (a stack request's) ends a C sleep early, as it ends any
    # nanosleep; robust C code sleeps again for what is left, and so does this.
    left = 120
    while left > 0:
        left = ctypes.PyDLL(None).sleep(left)


def fail(how: str) -> None:
    if how == "raise-unseen":
        sys.stderr.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    if how in ("raise", "raise-unseen"):
        raise ValueError(f"boom on rank {hc.rank()}")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "exit0":
        sys.exit(0)
    if how == "oom":
        hog = []
        while True:
            hog.append(np.ones(1 << 24, np.uint8))  # 16 MiB, touched
    if how == "stuck":
        stuck_in_dataloader()
    if how == "stuck-in-c":
        stuck_in_c_call()
    if how == "shape":
        engine.synchronize(engine.allreduce_async(np.ones(5, np.float32), name="grad.0"))


def main() -> None:
    how = sys.argv[1]
    slow_exit = float(os.environ.get("SLOW_EXIT", "0"))
    if slow_exit:
        atexit.register(time.sleep, slow_exit)  # registered before init: runs after the runtime's shutdown
    hc.init()
    if stacks.descriptor() < 0:  # an init() that does not install the stack dumps itself
        stacks.install(hc.rank())
    culprit = int(os.environ.get("CULPRIT", hc.size() - 1))
    second, _, second_how = os.environ.get("SECOND", "-1:").partition(":")
    if hc.rank() == culprit:
        fail(how)
    if hc.rank() == int(second):
        fail(second_how)
    time.sleep(float(os.environ.get("FIRST_SUBMIT_AFTER", "0")))
    x = np.ones(4, np.float32)
    step = 0
    while True:
        name = "grad.2" if how.startswith("stuck") else f"grad.{step % 4}"
        engine.synchronize(engine.allreduce_async(x, name=name))
        step += 1
        time.sleep(0.005)


if __name__ == "__main__":
    main()
