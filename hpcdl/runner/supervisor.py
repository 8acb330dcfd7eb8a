"""Watch a job's processes: stop everything when a rank fails or the launcher is signalled, enforce the
start timeout, show every rank's Python stacks on SIGQUIT, then report the first failure. Every wait here
has a deadline."""

from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hpcdl.common.debug_dir import write_private
from hpcdl.common.output_file import OutputFileError
from hpcdl.runner.first_failure import STDERR_LINES_SHOWN, account, detail_lines, with_last_words
from hpcdl.runner.hosts import RankSlot
from hpcdl.runner.procs import Failure, Outcome, RankEnd
from hpcdl.runner.rendezvous_host import RendezvousHandle
from hpcdl.runner.stack_dumps import ANSWER_SECONDS, STACKS_FILE, forget_launcher, record_launcher, render

POLL_SECONDS = 0.05
GRACE_SECONDS = 3.0  # between the polite signal and SIGKILL
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class JobProcess(Protocol):
    """A process the launcher started: one rank (local or over ssh), or mpirun for all of them."""

    def poll(self) -> Outcome | None: ...

    def failure(self) -> Failure | None:
        """The first sign of trouble: a rank (or the launcher of all ranks) that failed; None while none."""
        ...

    def ends(self) -> list[RankEnd]:
        """What is known of each of its ranks (how it ended, its last error)."""
        ...

    def ask_stacks(self) -> bool:
        """Ask its ranks for their Python stacks; False where it cannot reach them."""
        ...

    def stacks(self) -> dict[int, str]:
        """The stacks its ranks answered since the last `ask_stacks`, by rank."""
        ...

    def send_signal(self, signum: int) -> None: ...

    def finish(self) -> None: ...


@dataclass
class Supervisor:
    """Runs the watch loop over `processes` (all started) of a job placed on `slots`."""

    processes: list[JobProcess]
    slots: list[RankSlot]
    rendezvous: RendezvousHandle | None = None
    start_timeout: float = 30.0
    debug_dir: Path | None = None  # where SIGQUIT's stacks are written too
    _ended: dict[int, Outcome] = field(default_factory=dict)
    _root_cause: Failure | None = None
    _stop_reason: str = ""
    _stop_started: float | None = None
    _killed: bool = False
    _signal_received: int | None = None
    _pending_signals: list[int] = field(default_factory=list)
    _first_arrival: float | None = None
    _stacks_asked: bool = False
    _stacks_thread: threading.Thread | None = None
    _started: float = field(default_factory=time.time)  # wall clock: last words older than this are stale

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGQUIT:
            self._stacks_asked = True
        else:
            self._pending_signals.append(signum)

    def run(self) -> int:
        """Watch until every process has ended; return the launcher's exit code."""
        handled = (*FORWARDED_SIGNALS, signal.SIGQUIT)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        self._record_launcher()  # once SIGQUIT is handled: 'hpcdl debug stacks' may send it at once
        try:  # the handlers stay until teardown is over: a Ctrl-C then only hastens the end
            try:
                while len(self._ended) < len(self.processes):
                    self._step()
                    time.sleep(POLL_SECONDS)
            finally:
                self._teardown()
        finally:
            if self.debug_dir is not None:
                forget_launcher(self.debug_dir)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._report()

    def abort(self) -> None:
        """Stop the processes started so far (starting the job failed part way); no report."""
        self._begin_stop(signal.SIGTERM, "starting the job failed")
        self._teardown()

    def _step(self) -> None:
        for index, process in enumerate(self.processes):
            if index not in self._ended:
                outcome = process.poll()
                if outcome is not None:
                    self._ended[index] = outcome
            failure = process.failure()
            if failure is not None and self._stop_started is None:
                self._root_cause = failure
                self._begin_stop(signal.SIGTERM, f"{failure.where} {failure.outcome.describe()}")
        if self._stacks_asked and not (self._stacks_thread and self._stacks_thread.is_alive()):
            self._stacks_asked = False
            self._stacks_thread = threading.Thread(target=self._show_stacks, daemon=True)
            self._stacks_thread.start()
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

    def _record_launcher(self) -> None:
        if self.debug_dir is None:
            return
        try:
            record_launcher(self.debug_dir, len(self.slots))
        except (OSError, OutputFileError) as exc:
            print(f"hpcdl run: warning: 'hpcdl debug stacks' will not find this job: {exc}", file=sys.stderr)

    def _show_stacks(self) -> None:
        """Every rank's Python stacks, on stderr and in the debug directory (thread target: the watch goes
        on while the ranks answer)."""
        asked = [process for process in self._running() if process.ask_stacks()]
        deadline = time.monotonic() + ANSWER_SECONDS
        answers: dict[int, str] = {}
        while asked and time.monotonic() < deadline and len(answers) < len(self.slots):
            time.sleep(POLL_SECONDS)
            answers = {rank: text for process in asked for rank, text in process.stacks().items()}
        if not asked:  # mpirun, aprun, jsrun: they pass no stdin to every task
            answers = {slot.rank: "(hpcdl run cannot reach it through its launcher)" for slot in self.slots}
        text = render([(f"rank {s.rank} on host {s.host}", answers.get(s.rank)) for s in self.slots])
        where = ""
        if self.debug_dir is not None:
            try:
                write_private(self.debug_dir / STACKS_FILE, text.encode(), "ranks' stacks")
                where = f" (also in {self.debug_dir / STACKS_FILE})"
            except (OSError, OutputFileError) as exc:
                where = f" (not written to {self.debug_dir}: {exc})"
        print(f"hpcdl run: Python stacks of every rank, on SIGQUIT{where}:\n{text}", end="", file=sys.stderr)

    def _running(self) -> list[JobProcess]:
        return [p for index, p in enumerate(self.processes) if index not in self._ended]

    def _begin_stop(self, signum: int, reason: str) -> None:
        self._stop_reason = reason
        self._stop_started = time.monotonic()
        for process in self._running():
            process.send_signal(signum)

    def _kill_remaining(self) -> None:
        self._killed = True
        for process in self._running():
            process.send_signal(signal.SIGKILL)

    def _check_start_timeout(self) -> None:
        if self.rendezvous is None or self._stop_started is not None:
            return
        arrived = set(self.rendezvous.arrived())
        if not arrived or len(arrived) == len(self.slots):
            # Nobody uses the rendezvous (a plain program) or everybody met: a later round (ranks that shut
            # down and initialise again) starts its own clock.
            self._first_arrival = None
            return
        now = time.monotonic()
        self._first_arrival = self._first_arrival or now
        if now - self._first_arrival < self.start_timeout:
            return
        missing = [slot for slot in self.slots if slot.rank not in arrived]
        names = ", ".join(f"{slot.rank} (on {slot.host})" for slot in missing)
        self._begin_stop(
            signal.SIGTERM,
            f"rank(s) {names} did not reach the rendezvous within --start-timeout {self.start_timeout:g} s "
            f"of the first rank that did ({len(arrived)} of {len(self.slots)} arrived); check that they "
            "started (stderr above), that their hosts can reach this one, or raise --start-timeout",
        )

    def _teardown(self) -> None:
        if self._running():
            self._kill_remaining()
        deadline = time.monotonic() + GRACE_SECONDS
        while self._running() and time.monotonic() < deadline:
            self._step()
            time.sleep(POLL_SECONDS)
        for process in self.processes:
            process.finish()
        if self.rendezvous is not None:
            self.rendezvous.stop()

    def _report(self) -> int:
        if self._root_cause is not None:
            ends = [end for process in self.processes for end in process.ends()]
            if self.debug_dir is not None:
                ends = with_last_words(ends, self.debug_dir, self._started)
            found = account(ends)
            if found is None:  # the launcher of all ranks failed (mpirun, srun), no rank did
                return self._report_launcher(self._root_cause)
            others = len(self.slots) - 1
            stopped = f"; stopped the other {others} rank(s)" if others else ""
            print(f"hpcdl run: {found.first.where} {found.what}{stopped}", file=sys.stderr)
            for line in detail_lines(found, lambda end: end.where):
                print(line if line.startswith(" ") else f"hpcdl run: {line}", file=sys.stderr)
            return found.exit_code
        if self._signal_received is not None:
            print(f"hpcdl run: {self._stop_reason}; stopped all ranks", file=sys.stderr)
            return 128 + self._signal_received
        if self._stop_reason:
            print(f"hpcdl run: {self._stop_reason}", file=sys.stderr)
            return 1
        failed = [outcome for outcome in self._ended.values() if not outcome.ok]
        return failed[0].launcher_exit_code if failed else 0

    def _report_launcher(self, failure: Failure) -> int:
        print(
            f"hpcdl run: {failure.where} {failure.outcome.describe()}; stopped all {len(self.slots)} rank(s)",
            file=sys.stderr,
        )
        tail = failure.stderr_tail[-STDERR_LINES_SHOWN:]
        if tail:
            print(f"hpcdl run: last lines of its stderr ({failure.where}):", file=sys.stderr)
            for line in tail:
                print(f"    {line}", file=sys.stderr)
        return failure.outcome.launcher_exit_code or 1
