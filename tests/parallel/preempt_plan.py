"""What the preemption tests' rank programs do to themselves at chosen commits (imported by
``preemptible_train.py`` and ``preemptible_numpy.py``, which run as scripts from this directory).

``PREEMPT_PLAN`` (JSON list): ``{"name": N, "rank": R, "step": S, "action": A, "where": W}``, or
``"after": S`` instead of ``"step"`` for the first chance after commit S. A = ``signal`` (SIGUSR2 to this
rank; ``"signal": "TERM"`` for another), ``kill`` (SIGKILL) or ``hold`` (wait before step S until a signal
from outside has landed). W = ``step`` (before step S),
``collective`` (rank R signals itself 0.1 s into step S while it waits in the step's allreduce: the other
ranks enter it 0.3 s late, see :func:`collective`) or ``write`` (while rank R pickles its part of the
checkpoint written at commit S: put a :class:`Trap` in the rank's part). Each action happens once per
checkpoint path: a file in ``<path>.fired/`` records it, so a run that resumes does not repeat it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hpcdl.common.elastic_state import stop_requested


class Plan:
    def __init__(self, rank: int, path: str, step_now: Callable[[], int]) -> None:
        self.rank = rank
        self.actions: list[dict[str, Any]] = json.loads(os.environ.get("PREEMPT_PLAN", "[]"))
        self.fired = Path(path + ".fired")
        self.step_now = step_now
        print(f"PID rank={rank} pid={os.getpid()}", file=sys.stderr, flush=True)

    def due(self, step: int, where: str) -> list[dict[str, Any]]:
        """This rank's actions at (step, where) not yet carried out; marks them done."""
        found = []
        for action in self.actions:
            if (action["rank"], action.get("where", "step")) != (self.rank, where):
                continue
            if step != action["step"] if "step" in action else step <= action["after"]:
                continue
            marker = self.fired / action["name"]
            if marker.exists():
                continue
            self.fired.mkdir(exist_ok=True)
            marker.write_text(str(os.getpid()))
            found.append(action)
        return found

    def hold(self, action: dict[str, Any]) -> None:
        """Wait (up to 60 s) until a signal from outside has asked this rank to stop: the test sends it
        when it sees this step reached, and the training must not end before it lands."""
        print(
            f"PLAN {action['name']}: rank {self.rank} holds at step {action['step']}",
            file=sys.stderr,
            flush=True,
        )
        deadline = time.monotonic() + 60
        while not stop_requested() and time.monotonic() < deadline:
            time.sleep(0.01)

    def carry_out(self, action: dict[str, Any]) -> None:
        name = "KILL" if action["action"] == "kill" else action.get("signal", "USR2")
        where = f"{action.get('step', 'after ' + str(action.get('after')))} ({action.get('where', 'step')})"
        print(f"PLAN {action['name']}: SIG{name} to rank {self.rank} at {where}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.Signals["SIG" + name])

    def before_step(self, step: int) -> None:
        """Carry out the ``step`` actions; arrange the ``collective`` ones (call before the step's
        collectives)."""
        for action in self.due(step, "step"):
            if action["action"] == "hold":
                self.hold(action)
            else:
                self.carry_out(action)
        if not any(a.get("step") == step and a.get("where") == "collective" for a in self.actions):
            return
        mine = self.due(step, "collective")
        if mine:
            threading.Timer(0.1, self.carry_out, (mine[0],)).start()
        elif not any(a["rank"] == self.rank for a in self.actions if a.get("step") == step):
            time.sleep(0.3)  # the signalled rank is then waiting for this one in the allreduce

    def part(self, values: dict[str, Any]) -> dict[str, Any]:
        """A rank's part of a checkpoint: ``values``, a megabyte of ballast, then the trap."""
        return {**values, "ballast": np.ones(1 << 17), "trap": Trap(self)}


class Trap:
    """Pickled last in a rank's part of a checkpoint (:meth:`Plan.part`), after a megabyte of ballast that
    is on the disk by then: carries out the plan's ``write`` actions in the middle of the write."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def __reduce__(self) -> tuple[Any, ...]:
        for action in self.plan.due(self.plan.step_now(), "write"):
            self.plan.carry_out(action)
        return (int, (0,))
