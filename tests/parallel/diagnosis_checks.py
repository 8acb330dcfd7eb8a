"""Rank programs of tests/parallel/test_engine_diagnosis.py: a rank that is stuck or diverges while its peers
wait, and what the waiting ranks are told. ``python diagnosis_checks.py SCENARIO [API]`` (API: ``common``,
the engine's NumPy helpers, or ``torch``, ``hpcdl.torch`` on whatever path HPCDL_GPU_OPERATIONS selects);
each rank prints ``RESULT {json}`` lines with what it saw. A stuck rank stays stuck until a waiting rank has
its answer and writes a byte into the FIFO named by HPCDL_TEST_FIFO (or 30 s pass).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import sys
import time

import numpy as np

import hpcdl.common as hc
from hpcdl.common import engine as E
from hpcdl.common.debug_dir import debug_dir
from hpcdl.common.exceptions import HpcdlError

GIVE_UP_SECONDS = 30.0


def result(**fields: object) -> None:
    print("RESULT " + json.dumps(fields), flush=True)


def error_of(call) -> dict:  # type: ignore[no-untyped-def]
    try:
        call()
    except HpcdlError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None, "message": ""}


class Api:
    """One allreduce through the API the scenario names."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "torch":
            import hpcdl.torch as hvd

            self.hvd = hvd
            hvd.init()
        else:
            hc.init()

    def allreduce(self, name: str, n: int = 2, process_set: object = None) -> None:
        if self.name == "torch":
            import torch

            kwargs = {"process_set": process_set} if process_set is not None else {}
            self.hvd.allreduce(torch.ones(n), name=name, **kwargs)
        else:
            ps = process_set.process_set_id if process_set is not None else 0  # type: ignore[attr-defined]
            E.synchronize(E.allreduce_async(np.ones(n, np.float32), name=name, process_set=ps))

    def shutdown(self) -> None:
        (self.hvd.shutdown if self.name == "torch" else hc.shutdown)()


def _fifo(flags: int) -> int:
    return os.open(os.environ["HPCDL_TEST_FIFO"], flags)


def release_the_stuck_rank() -> None:
    fd = _fifo(os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, b"x")
    os.close(fd)


def stuck_in_dataloader(fd: int) -> None:
    deadline = time.monotonic() + GIVE_UP_SECONDS
    while time.monotonic() < deadline and not select.select([fd], [], [], 0.02)[0]:
        pass


def stuck_in_c_call(fd: int) -> None:
    # read() through PyDLL holds the GIL until a byte arrives: no Python code of this process runs meanwhile.
    ctypes.PyDLL(None).read(fd, ctypes.create_string_buffer(1), 1)


def stuck(api: Api, where) -> None:  # type: ignore[no-untyped-def]
    """The last rank is stuck in `where` while the others wait for it in allreduce 'grad.2'."""
    fd = _fifo(os.O_RDWR)
    api.allreduce("grad.1")
    if hc.rank() == hc.size() - 1:
        where(fd)
    else:
        result(**error_of(lambda: api.allreduce("grad.2")))
        release_the_stuck_rank()
    api.shutdown()


def submit_in_order(api: Api, first: str, second: str) -> None:
    api.allreduce(first)
    api.allreduce(second)


def other_order(api: Api) -> None:
    """Rank 0 runs 'order.a' then 'order.b', the others 'order.b' then 'order.a': each waits for the other.
    The others submit 1.5 s after rank 0, so that 'order.a' reaches the stall shutdown time well before
    'order.b' does. The shutdown cancels 'order.b' with it when 'order.b' is past the stall check time by
    then, which holds at any phase of rank 0's once-a-second check for a check time of 1 s and a shutdown
    time of 2.5 s or more; else 'order.b' fails when rank 0 leaves."""
    api.allreduce("order.warm")
    names = ("order.a", "order.b") if hc.rank() == 0 else ("order.b", "order.a")
    if hc.rank() != 0:
        time.sleep(1.5)
    result(**error_of(lambda: submit_in_order(api, *names)))
    api.shutdown()


def other_shape(api: Api) -> None:
    """Rank 0 reduces 4 elements under 'grad.w', the others 5."""
    api.allreduce("grad.w", 4)
    result(**error_of(lambda: api.allreduce("grad.w2", 4 if hc.rank() == 0 else 5)))
    api.shutdown()


def other_process_set(api: Api) -> None:
    """Rank 0 reduces 'ps.x' over the set of ranks 0 and 1, the others over the global set."""
    if api.name == "torch":
        pair = api.hvd.add_process_set([0, 1])
    else:
        from hpcdl.common.process_sets import add_process_set

        pair = add_process_set([0, 1])
    api.allreduce("ps.warm")
    result(**error_of(lambda: api.allreduce("ps.x", process_set=pair if hc.rank() == 0 else None)))
    api.shutdown()


def timeout(api: Api) -> None:
    """Rank 0 waits 2 s for 'late', which rank 1 (stuck in user code) never submits."""
    fd = _fifo(os.O_RDWR)
    api.allreduce("warm")
    if hc.rank() == 1:
        stuck_in_dataloader(fd)
    else:
        handle = E.allreduce_async(np.ones(2, np.float32), name="late")
        result(**error_of(lambda: handle.wait(timeout=2.0)))
        release_the_stuck_rank()
    api.shutdown()


def recorded() -> list[dict]:
    """This rank's flight recorder as a dump shows it now."""
    E.dump_flight_recorder("ring check")
    return json.loads((debug_dir() / f"flight.rank{hc.rank()}.json").read_text())["ops"]


def ring(api: Api) -> None:
    """20 finished allreduces 'step.<i>' of i + 1 elements, then 'pending', which rank 0 submits first and
    dumps while it waits for rank 1; then 'go' and 'pending' finish. Run with a ring of 8."""
    for i in range(20):
        E.synchronize(E.allreduce_async(np.ones(i + 1, np.float32), name=f"step.{i}"))
    if hc.rank() == 0:
        pending = E.allreduce_async(np.ones(3, np.float32), name="pending")
        result(while_pending=recorded())
        E.synchronize(E.allreduce_async(np.ones(1, np.float32), name="go"))
    else:
        E.synchronize(E.allreduce_async(np.ones(1, np.float32), name="go"))
        pending = E.allreduce_async(np.ones(3, np.float32), name="pending")
    E.synchronize(pending)
    result(after=recorded())
    api.shutdown()


SCENARIOS = {
    "user_code": lambda api: stuck(api, stuck_in_dataloader),
    "c_call": lambda api: stuck(api, stuck_in_c_call),
    "order": other_order,
    "shape": other_shape,
    "process_set": other_process_set,
    "timeout": timeout,
    "ring": ring,
}


if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](Api(sys.argv[2] if len(sys.argv) > 2 else "common"))
