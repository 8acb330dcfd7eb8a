"""The launcher's start timeout counts from the first arrival of each rendezvous round: ranks that shut down
and initialise again (a new round) were stopped at once because the clock still ran from the first round."""

from __future__ import annotations

from hpcdl.runner import supervisor as supervision
from hpcdl.runner.hosts import RankSlot
from hpcdl.runner.supervisor import Supervisor


class Rounds:
    """A rendezvous whose arrivals are set by the test."""

    def __init__(self) -> None:
        self.now: list[int] = []

    def arrived(self) -> list[int]:
        return self.now


def test_a_second_round_gets_its_own_start_timeout(monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(supervision.time, "monotonic", lambda: clock[0])
    rounds = Rounds()
    slots = [RankSlot(r, 2, "node", r, 2, 0, 1) for r in range(2)]
    watch = Supervisor([], slots, rounds, start_timeout=30.0)  # type: ignore[arg-type]
    rounds.now = [0]
    watch._check_start_timeout()
    rounds.now = [0, 1]  # the first round met
    clock[0] += 5
    watch._check_start_timeout()
    clock[0] += 600  # the job runs for ten minutes, then every rank initialises again
    rounds.now = [1]
    watch._check_start_timeout()
    assert watch._stop_started is None, watch._stop_reason
    clock[0] += 31  # rank 0 never comes back
    watch._check_start_timeout()
    assert watch._stop_started is not None and "rank(s) 0 (on node) did not reach" in watch._stop_reason
