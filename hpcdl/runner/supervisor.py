"""Watch a job's ranks: stop all when one fails or the launcher is signalled, enforce the start
timeout, then report the root cause. Every wait here has a deadline."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Protocol

from hpcdl.runner.hosts import RankSlot
from hpcdl.runner.output import RankOutput
from hpcdl.runner.procs import Outcome
from hpcdl.runner.rendezvous_host import RendezvousHandle

POLL_SECONDS = 0.05
GRACE_SECONDS = 3.0  # between the polite signal and SIGKILL
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STDERR_LINES_SHOWN = 10


class RankProcess(Protocol):
    slot: RankSlot
    output: RankOutput
    remote: bool
    threads: list

    def poll(self) -> Outcome | None: ...

    def send_signal(self, signum: int) -> None: ...

    def finish(self) -> None: ...


@dataclass
class Supervisor:
    """Runs the watch loop over `ranks` (all already started)."""

    ranks: list[RankProcess]
    rendezvous: RendezvousHandle | None = None
    start_timeout: float = 30.0
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    _root_cause: RankProcess | None = None
    _stop_reason: str = ""
    _stop_started: float | None = None
    _killed: bool = False
    _signal_received: int | None = None
    _pending_signals: list[int] = field(default_factory=list)
    _first_arrival: float | None = None

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._pending_signals.append(signum)

    def run(self) -> int:
        """Watch until every rank has ended; return the launcher's exit code."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in FORWARDED_SIGNALS}
        try:
            while len(self.outcomes) < len(self.ranks):
                self._step()
                time.sleep(POLL_SECONDS)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._teardown()
        return self._report()

    def abort(self) -> None:
        """Stop the ranks started so far (starting the job failed part way); no report."""
        self._begin_stop(signal.SIGTERM, "starting the job failed")
        self._teardown()

    def _step(self) -> None:
        for rank in self.ranks:
            if rank.slot.rank in self.outcomes:
                continue
            outcome = rank.poll()
            if outcome is None:
                continue
            self.outcomes[rank.slot.rank] = outcome
            if not outcome.ok and self._stop_started is None:
                self._root_cause = rank
                self._begin_stop(signal.SIGTERM, f"rank {rank.slot.rank} {outcome.describe()}")
        while self._pending_signals:
            signum = self._pending_signals.pop(0)
            if self._signal_received is not None:  # a second Ctrl-C: no more patience
                self._kill_remaining()
            self._signal_received = self._signal_received or signum
            if self._stop_started is None:
                self._begin_stop(signum, f"hpcdl run received {signal.Signals(signum).name}")
        self._check_start_timeout()
        stopping = self._stop_started is not None and not self._killed
        if stopping and time.monotonic() - self._stop_started > GRACE_SECONDS:
            self._kill_remaining()

    def _running(self) -> list[RankProcess]:
        return [rank for rank in self.ranks if rank.slot.rank not in self.outcomes]

    def _begin_stop(self, signum: int, reason: str) -> None:
        self._stop_reason = reason
        self._stop_started = time.monotonic()
        for rank in self._running():
            rank.send_signal(signum)

    def _kill_remaining(self) -> None:
        self._killed = True
        for rank in self._running():
            rank.send_signal(signal.SIGKILL)

    def _check_start_timeout(self) -> None:
        if self.rendezvous is None or self._stop_started is not None:
            return
        arrived = set(self.rendezvous.arrived())
        if not arrived or len(arrived) == len(self.ranks):
            return  # nobody uses the rendezvous (a plain program) or everybody met
        now = time.monotonic()
        self._first_arrival = self._first_arrival or now
        if now - self._first_arrival < self.start_timeout:
            return
        missing = [
            r.slot for r in self.ranks if r.slot.rank not in arrived and r.slot.rank not in self.outcomes
        ]
        if not missing:
            return
        names = ", ".join(f"{slot.rank} (on {slot.host})" for slot in missing)
        self._begin_stop(
            signal.SIGTERM,
            f"ranks {names} did not reach the rendezvous within --start-timeout {self.start_timeout:g} s "
            f"of the first rank that did ({len(arrived)} of {len(self.ranks)} arrived); check that they "
            "started (stderr above), that their hosts can reach this one, or raise --start-timeout",
        )

    def _teardown(self) -> None:
        if self._running():
            self._kill_remaining()
        deadline = time.monotonic() + GRACE_SECONDS
        while self._running() and time.monotonic() < deadline:
            self._step()
            time.sleep(POLL_SECONDS)
        for rank in self.ranks:
            rank.finish()
            for thread in rank.threads:
                thread.join(timeout=max(0.0, deadline - time.monotonic()) + 0.5)
            rank.output.close()
        if self.rendezvous is not None:
            self.rendezvous.stop()

    def _report(self) -> int:
        if self._root_cause is not None:
            rank = self._root_cause
            outcome = self.outcomes[rank.slot.rank]
            others = len(self.ranks) - 1
            print(
                f"hpcdl run: rank {rank.slot.rank} on host {rank.slot.host} {outcome.describe()}"
                + (f"; stopped the other {others} rank(s)" if others else ""),
                file=sys.stderr,
            )
            tail = list(rank.output.stderr_tail)[-STDERR_LINES_SHOWN:]
            if tail:
                print(f"hpcdl run: last lines of rank {rank.slot.rank}'s stderr:", file=sys.stderr)
                for line in tail:
                    print(f"    {line}", file=sys.stderr)
            return outcome.launcher_exit_code or 1
        if self._signal_received is not None:
            print(f"hpcdl run: {self._stop_reason}; stopped all ranks", file=sys.stderr)
            return 128 + self._signal_received
        if self._stop_reason:
            print(f"hpcdl run: {self._stop_reason}", file=sys.stderr)
            return 1
        return 0
