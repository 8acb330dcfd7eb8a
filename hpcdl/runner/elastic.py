"""Elastic jobs: ``hpcdl run --min-np A --max-np B [--host-discovery-script S]``.

The launcher starts one worker per slot and groups the live workers into rounds. A worker learns its rank,
the round's size and the round's rendezvous from the driver here each time hpcdl initializes
(``hpcdl.common.elastic``). When a worker fails, its host is not used again (or, with
--blacklist-cooldown-range MIN MAX, not for MIN seconds, doubling with each failure there up to MAX) and
the others form a new round (their collectives fail with ``HorovodInternalError``; ``hvd.elastic.run``
restores the last commit and re-initializes); when the discovery script, run every second, lists new
slots, new workers start and the running ones move to the new round at their next ``state.commit()``
(``HostsUpdatedInterrupt``). Survivors keep their order, so rank 0 of a new round holds the committed
state that it broadcasts.

The job succeeds when a worker exits 0 and every other worker of its round has ended with 0; it fails when
fewer than --min-np workers are left for --elastic-timeout seconds (at once when neither a discovery
script nor a cooldown can bring more), after --reset-limit new rounds, or on a signal. When the discovery
script lists fewer slots on a host (or drops it), the newest workers beyond its slots are stopped and the
others regroup.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hpcdl.diagnosis.consequences import judge
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.first_failure import account, detail_lines
from hpcdl.runner.hosts import HostSlots, RankSlot, merge_duplicates, parse_hosts_arg
from hpcdl.runner.procs import Outcome, RankEnd
from hpcdl.runner.supervisor import FORWARDED_SIGNALS, GRACE_SECONDS, POLL_SECONDS, JobProcess

DISCOVERY_INTERVAL = 1.0  # seconds between runs of the discovery script
DISCOVERY_TIMEOUT = 30.0


@dataclass(frozen=True)
class ElasticOptions:
    min_np: int
    max_np: int
    discovery_script: Path | None = None
    timeout: float = 600.0  # --elastic-timeout: how long the job may have fewer than min_np workers
    reset_limit: int | None = None  # most new rounds after the first
    # --blacklist-cooldown-range: a failed host is usable again after MIN s, doubling per failure up to
    # MAX s; None blacklists it for good (Horovod's default).
    cooldown_range: tuple[float, float] | None = None
    default_slots: int = 1  # --slots-per-host: slots of a host the discovery script prints without ':slots'


def check_options(options: ElasticOptions, num_proc: int | None) -> None:
    if options.min_np < 1:
        raise LaunchError(f"--min-np must be at least 1, got {options.min_np}")
    if options.max_np < options.min_np:
        raise LaunchError(f"--max-np {options.max_np} is below --min-np {options.min_np}")
    if num_proc is not None and not options.min_np <= num_proc <= options.max_np:
        raise LaunchError(
            f"-np {num_proc} must lie between --min-np {options.min_np} and --max-np {options.max_np}"
        )
    if options.discovery_script is not None and not options.discovery_script.is_file():
        raise LaunchError(f"--host-discovery-script {options.discovery_script} does not exist")
    if options.timeout <= 0:
        raise LaunchError(f"--elastic-timeout must be positive, got {options.timeout:g}")
    if options.cooldown_range is not None:
        low, high = options.cooldown_range
        if not 0 < low <= high:
            raise LaunchError(
                f"--blacklist-cooldown-range {low:g} {high:g}: give MIN and MAX seconds with 0 < MIN <= MAX"
            )


def discover_hosts(script: Path, default_slots: int = 1) -> list[HostSlots]:
    """Run the discovery script: one ``host`` or ``host:slots`` per line (Horovod's format); a host without
    slots gets `default_slots` (``--slots-per-host``)."""
    try:
        done = subprocess.run(
            [str(script.absolute())], capture_output=True, text=True, timeout=DISCOVERY_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"host discovery script {script} failed to run: {exc}") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise LaunchError(f"host discovery script {script} exited with {done.returncode}: {' | '.join(tail)}")
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip() and not line.startswith("#")]
    if not lines:
        return []
    try:
        return parse_hosts_arg(",".join(line if ":" in line else f"{line}:{default_slots}" for line in lines))
    except LaunchError as exc:
        raise LaunchError(
            f"host discovery script {script} printed something else than host:slots lines ({exc})"
        ) from None


@dataclass
class Worker:
    """One started worker process and where it runs; `members`: the workers of its round, in rank order,
    when it ended (whom its errors mean by ``rank N``)."""

    number: int
    host: str
    process: JobProcess
    outcome: Outcome | None = None
    members: tuple[int, ...] = ()


@dataclass
class Round:
    """A set of workers that meet at one rendezvous: worker numbers in rank order."""

    number: int
    members: list[int]
    hosts: dict[int, str]
    addr: str
    port: int

    def placement(self, worker: int) -> dict[str, Any]:
        return {
            "round": self.number,
            "rank": self.members.index(worker),
            "size": len(self.members),
            "host": self.hosts[worker],
            "addr": self.addr,
            "port": self.port,
        }


class RoundBoard:
    """The rounds as the workers see them: what the driver's request handler reads (thread-safe)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._round: Round | None = None
        self._removed: set[int] = set()
        self._closed = False

    def publish(self, new: Round) -> None:
        with self._changed:
            self._round = new
            self._changed.notify_all()

    def remove(self, worker: int) -> None:
        with self._changed:
            self._removed.add(worker)
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def current(self) -> int:
        with self._changed:
            return self._round.number if self._round else 0

    def assignment(self, worker: int, after: int, timeout: float) -> dict[str, Any]:
        """This worker's place in the first round newer than `after` that includes it."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if worker in self._removed:
                    return {"error": f"worker {worker} is no longer part of the job"}
                if self._closed:
                    return {"error": "the job is ending"}
                current = self._round
                if current is not None and current.number > after and worker in current.members:
                    return current.placement(worker)
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"error": f"no new round for worker {worker} within {timeout:g} s"}
                self._changed.wait(min(left, 1.0))


def driver_requests(board: RoundBoard, wait: float) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The driver's answers to workers (served by ``hpcdl.runner.service.ServiceServer``, which hears only
    clients that prove the secret): ``round`` (the newest round's number) and ``assign`` (a worker's place
    in its next round, waiting up to `wait` s for it)."""

    def respond(request: dict[str, Any]) -> dict[str, Any]:
        if request.get("op") == "round":
            return {"round": board.current()}
        if request.get("op") == "assign":
            return board.assignment(int(request["worker"]), int(request["after"]), wait)
        return {"error": f"unknown request {request.get('op')!r}"}

    return respond


@dataclass
class Blacklist:
    """Hosts where a worker failed. Without a cooldown range a host stays out for good; with (MIN, MAX)
    it is out for MIN seconds after its first failure, twice as long after each further one, at most MAX."""

    cooldown_range: tuple[float, float] | None = None
    _failures: dict[str, int] = field(default_factory=dict)
    _until: dict[str, float] = field(default_factory=dict)  # host -> when it is usable again

    def add(self, host: str, now: float) -> float | None:
        """Blacklist `host` after a failure at `now`; returns its cooldown in seconds (None: for good)."""
        self._failures[host] = self._failures.get(host, 0) + 1
        if self.cooldown_range is None:
            return None
        low, high = self.cooldown_range
        cooldown = min(high, low * 2 ** (self._failures[host] - 1))
        self._until[host] = now + cooldown
        return cooldown

    def blocks(self, host: str, now: float) -> bool:
        if host not in self._failures:
            return False
        return self.cooldown_range is None or now < self._until.get(host, now)

    def released(self, now: float) -> list[str]:
        """Hosts whose cooldown has ended since the last call (each reported once per failure)."""
        done = sorted(host for host, until in self._until.items() if now >= until)
        for host in done:
            del self._until[host]
        return done

    def cooling(self) -> bool:
        """Whether some host will become usable again."""
        return bool(self._until)


# A worker process: started by the caller (number, host) -> process.
StartWorker = Callable[[int, str], JobProcess]
# A rendezvous server for `size` ranks: returns (port, stop).
StartRendezvous = Callable[[int], tuple[int, Callable[[], None]]]


@dataclass
class ElasticJob:
    """The driver's watch loop over the workers of one elastic job."""

    options: ElasticOptions
    initial_hosts: list[HostSlots]
    num_proc: int | None
    start_worker: StartWorker
    start_rendezvous: StartRendezvous
    board: RoundBoard
    rendezvous_addr: str
    workers: dict[int, Worker] = field(default_factory=dict)
    _blacklist: Blacklist = field(init=False)
    _hosts: list[HostSlots] = field(default_factory=list)
    _round: Round | None = None
    _stop_rendezvous: Callable[[], None] | None = None
    _resets: int = 0
    _short_since: float | None = None
    _succeeded: Worker | None = None
    _failure: str = ""
    _exit_code: int = 0
    _signals: list[int] = field(default_factory=list)
    _next_discovery: float = 0.0
    _retiring: dict[int, float] = field(default_factory=dict)  # worker -> when it was told to stop

    def __post_init__(self) -> None:
        self._blacklist = Blacklist(self.options.cooldown_range)

    def run(self) -> int:
        previous = {
            sig: signal.signal(sig, lambda s, _f: self._signals.append(s)) for sig in FORWARDED_SIGNALS
        }
        try:
            script = self.options.discovery_script
            self._hosts = (
                discover_hosts(script, self.options.default_slots)
                if script is not None
                else list(self.initial_hosts)
            )
            self._start_workers(self.num_proc if self.num_proc is not None else self.options.max_np)
            while not self._done():
                self._step()
                time.sleep(POLL_SECONDS)
        finally:
            self._teardown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._report()

    # ---- the watch loop -------------------------------------------------------------------------
    def _step(self) -> None:
        for worker in self._live():
            outcome = worker.process.poll()
            if outcome is None:
                continue
            worker.outcome = outcome
            if self._round is not None:
                worker.members = tuple(self._round.members)
            if worker.number in self._retiring:
                self.board.remove(worker.number)
            elif outcome.ok:
                self._succeeded = self._succeeded or worker
            elif self._succeeded is None:
                cooldown = self._blacklist.add(worker.host, time.monotonic())
                until = "" if cooldown is None else f" for {cooldown:g} s (--blacklist-cooldown-range)"
                print(
                    f"hpcdl run: worker {worker.number} on {worker.host} {outcome.describe()}"
                    f"{self._error_words(worker)}; no new worker will start on {worker.host}{until}",
                    file=sys.stderr,
                )
                self.board.remove(worker.number)
        if self._signals and not self._failure:
            signum = self._signals[0]
            self._fail(f"received {signal.Signals(signum).name}", 128 + signum)
            return
        if self._succeeded is not None:
            return
        released = self._blacklist.released(time.monotonic())
        if released:
            print(f"hpcdl run: {', '.join(released)} usable again after the cooldown", file=sys.stderr)
            self._start_workers(self.options.max_np)
        if self.options.discovery_script and time.monotonic() >= self._next_discovery:
            self._next_discovery = time.monotonic() + DISCOVERY_INTERVAL
            hosts = self._discover()
            if hosts != self._hosts:
                self._hosts = hosts
                self._retire_workers()
                self._start_workers(self.options.max_np)
        for number, since in self._retiring.items():
            worker = self.workers[number]
            if worker.outcome is None and time.monotonic() - since > GRACE_SECONDS:
                worker.process.send_signal(signal.SIGKILL)
        if len(self._live()) < self.options.min_np:
            self._short_since = self._short_since or time.monotonic()
            if self.options.discovery_script is None and not self._blacklist.cooling():  # no host can come
                self._fail(
                    f"only {len(self._live())} worker(s) left, fewer than --min-np {self.options.min_np}", 1
                )
            elif time.monotonic() - self._short_since > self.options.timeout:
                self._fail(
                    f"only {len(self._live())} worker(s) left, fewer than --min-np {self.options.min_np}, "
                    f"for --elastic-timeout {self.options.timeout:g} s",
                    1,
                )
            return
        self._short_since = None
        if self._round is None:
            self._form_round()
        elif set(self._round.members) != {w.number for w in self._live()}:
            if self.options.reset_limit is not None and self._resets >= self.options.reset_limit:
                self._fail(
                    f"the job would need more than --reset-limit {self.options.reset_limit} new rounds", 1
                )
                return
            self._resets += 1
            self._form_round()

    def _error_words(self, worker: Worker) -> str:
        """The worker's last error, and whether it failed by it or because of another worker."""
        (end,) = worker.process.ends()
        if end.error is None:
            return ""
        verdict = judge(end.error)
        if not verdict.consequence:
            return f" after its own error, {end.error.headline()}"
        blamed = [self._blamed_worker(end, rank) for rank in verdict.blamed]
        whose = ", ".join(f"worker {number}" for number in blamed if number is not None) or "another worker"
        return f", a consequence of {whose} ({end.error.headline()})"

    def _blamed_worker(self, end: RankEnd, rank: int) -> int | None:
        """The worker that was ``rank N`` in the round of the worker `end` describes."""
        members = self.workers[end.rank].members
        return members[rank] if 0 <= rank < len(members) else None

    def _done(self) -> bool:
        if self._failure:
            return True
        if self._succeeded is None:
            return False
        assert self._round is not None
        return all(self.workers[n].outcome is not None for n in self._round.members)

    def _live(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.outcome is None]

    def _discover(self) -> list[HostSlots]:
        assert self.options.discovery_script is not None
        try:
            return discover_hosts(self.options.discovery_script, self.options.default_slots)
        except LaunchError as exc:
            print(f"hpcdl run: warning: {exc}; keeping the previous host list", file=sys.stderr)
            return self._hosts

    def _retire_workers(self) -> None:
        """Stop the workers beyond the slots the discovery script now lists for their host (the newest
        first); the others regroup without them once they have ended."""
        slots = {host.name: host.slots for host in merge_duplicates(self._hosts)}
        by_host: dict[str, list[Worker]] = {}
        for worker in self._live():
            if worker.number not in self._retiring:
                by_host.setdefault(worker.host, []).append(worker)
        for host, workers in by_host.items():
            for worker in workers[slots.get(host, 0) :]:
                print(
                    f"hpcdl run: stopping worker {worker.number}: {host} no longer offers its slot",
                    file=sys.stderr,
                )
                self._retiring[worker.number] = time.monotonic()
                worker.process.send_signal(signal.SIGTERM)

    def _start_workers(self, target: int) -> None:
        """Start workers on free slots of usable hosts until `target` (at most --max-np) are live."""
        busy: dict[str, int] = {}
        for worker in self._live():
            busy[worker.host] = busy.get(worker.host, 0) + 1
        for host in merge_duplicates(self._hosts):
            if self._blacklist.blocks(host.name, time.monotonic()):
                continue
            for _ in range(host.slots - busy.get(host.name, 0)):
                if len(self._live()) >= min(target, self.options.max_np):
                    return
                number = len(self.workers)
                self.workers[number] = Worker(number, host.name, self.start_worker(number, host.name))

    def _form_round(self) -> None:
        """A new round of the live workers: survivors in their old rank order, then the new ones."""
        live = {w.number for w in self._live()}
        old = [n for n in (self._round.members if self._round else []) if n in live]
        members = old + sorted(live - set(old))
        port, stop = self.start_rendezvous(len(members))
        number = self._round.number + 1 if self._round else 1
        self._round = Round(
            number, members, {n: self.workers[n].host for n in members}, self.rendezvous_addr, port
        )
        self.board.publish(self._round)
        if self._stop_rendezvous is not None:
            self._stop_rendezvous()  # workers still meeting at the old round's give up and ask again
        self._stop_rendezvous = stop
        placement = ", ".join(f"{n}@{self.workers[n].host}" for n in members)
        print(f"hpcdl run: elastic round {number}: {len(members)} worker(s) ({placement})", file=sys.stderr)

    # ---- the end ----------------------------------------------------------------------------------
    def _fail(self, reason: str, code: int) -> None:
        self._failure, self._exit_code = reason, code

    def _teardown(self) -> None:
        self.board.close()
        for worker in self._live():
            worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        while self._poll_live() and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        for worker in self._live():
            worker.process.send_signal(signal.SIGKILL)
        for worker in self.workers.values():
            worker.process.finish()
        if self._stop_rendezvous is not None:
            self._stop_rendezvous()

    def _poll_live(self) -> bool:
        for worker in self._live():
            worker.outcome = worker.process.poll()
        return bool(self._live())

    def _report(self) -> int:
        if self._failure:
            print(f"hpcdl run: elastic job stopped: {self._failure}", file=sys.stderr)
            ends = [  # workers told to stop (their host left) did not fail
                end
                for worker in self.workers.values()
                if worker.number not in self._retiring
                for end in worker.process.ends()
            ]
            found = account(ends, blamed_key=self._blamed_worker)
            if found is not None:
                label = f"worker {found.first.rank} on {found.first.host}"
                print(f"hpcdl run: the first failure: {label} {found.what}", file=sys.stderr)
                for line in detail_lines(found, lambda end: f"worker {end.rank} on {end.host}"):
                    print(line if line.startswith(" ") else f"hpcdl run: {line}", file=sys.stderr)
            return self._exit_code
        assert self._round is not None
        for number in self._round.members:
            outcome = self.workers[number].outcome
            if outcome is not None and not outcome.ok:
                host = self.workers[number].host
                print(f"hpcdl run: worker {number} on {host} {outcome.describe()}", file=sys.stderr)
                return outcome.launcher_exit_code
        return 0


def worker_slot(number: int, host: str) -> RankSlot:
    """The label of a worker's output: its worker number (ranks change from round to round)."""
    return RankSlot(number, number + 1, host, 0, 1, 0, 1)
