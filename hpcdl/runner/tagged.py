"""One launcher process that runs all of a job's ranks (``mpirun``, ``srun``, ``flux run``, ...): its output
lines carry rank tags, which route every line to its rank's output, and each rank's wrapper ends with an
exit line (after an ``oom`` line when the kernel's OOM killer ended the rank), which says how and when that
rank ended."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import RankSlot
from hpcdl.runner.output import TAIL_LINES, OutputRouter, RankOutput, pump_lines
from hpcdl.runner.procs import DRAIN_SECONDS, Failure, Outcome, RankEnd, rank_end
from hpcdl.runner.stack_dumps import decode

STDIN_END_SECONDS = 5.0  # after stdin closes, how long the agents get to stop their ranks
TERM_SECONDS = 3.0


@dataclass(frozen=True)
class Tagged:
    """A line of one rank: its text for `stream`, or (`exit_code` set) the rank's exit line, or (`oom` set)
    what the kernel said when its OOM killer ended the rank, or (`stacks` set) its Python stacks."""

    rank: int
    stream: str = "stdout"
    text: bytes = b""
    exit_code: int | None = None
    oom: str = ""
    stacks: str | None = None


# Reads one line of the launcher's `stream` ('stdout' or 'stderr'); None: the launcher's own line.
TagReader = Callable[[str, bytes], "Tagged | None"]


def step_agent_reader(token: str) -> TagReader:
    """Lines of ``hpcdl.runner.step_agent``: ``TOKEN RANK out|err TEXT``, ``TOKEN RANK oom TEXT``,
    ``TOKEN RANK stacks BASE64`` and ``TOKEN RANK exit CODE``."""
    head = token.encode() + b" "

    def read(_stream: str, line: bytes) -> Tagged | None:
        if not line.startswith(head):
            return None
        parts = line[len(head) :].split(b" ", 2)
        if len(parts) < 2 or not parts[0].isdigit():
            return None
        rank, kind = int(parts[0]), parts[1].rstrip(b"\n")
        text = parts[2] if len(parts) == 3 else b""
        if kind == b"exit":
            return Tagged(rank, exit_code=int(text))
        if kind == b"oom":
            return Tagged(rank, oom=text.decode(errors="replace").strip())
        if kind == b"stacks":
            return Tagged(rank, stacks=decode(text.strip()))
        if kind in (b"out", b"err"):
            return Tagged(rank, "stdout" if kind == b"out" else "stderr", text)
        return None

    return read


class TaggedRun:
    """The launcher as the job's one process.

    With `control_stdin` (a launcher that copies its stdin to every task) signals travel to the ranks'
    agents as ``signal N`` lines and closing stdin stops them; otherwise polite signals go to the launcher,
    which forwards them, and SIGKILL takes its process group.
    """

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        slots: list[RankSlot],
        router: OutputRouter,
        reader: TagReader,
        control_stdin: bool = False,
    ):
        self._router = router
        self._reader = reader
        self._control_stdin = control_stdin
        self._slots = {slot.rank: slot for slot in slots}
        self._outputs: dict[int, RankOutput] = {slot.rank: router.for_rank(slot.rank) for slot in slots}
        self._launcher_tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._first_failure: tuple[int, Outcome] | None = None
        self._exits: dict[int, tuple[Outcome, float]] = {}  # rank -> how and when (monotonic) it ended
        self._ooms: dict[int, str] = {}
        self._stacks: dict[int, str] = {}
        self._outcome: Outcome | None = None
        self._lock = threading.Lock()
        self.name = os.path.basename(argv[0])
        try:
            self._popen = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.PIPE if control_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {argv[0]}: {exc.strerror}") from None
        assert self._popen.stdout is not None and self._popen.stderr is not None
        self.threads = [
            threading.Thread(target=pump_lines, args=(pipe, self._line_handler(stream)), daemon=True)
            for pipe, stream in ((self._popen.stdout, "stdout"), (self._popen.stderr, "stderr"))
        ]
        for thread in self.threads:
            thread.start()

    def _line_handler(self, pipe_stream: str) -> Callable[[bytes], None]:
        def handle(line: bytes) -> None:
            tagged = self._reader(pipe_stream, line)
            if tagged is None or tagged.rank not in self._outputs:
                self._launcher_tail.append(line.decode(errors="replace").rstrip("\n"))
                self._router.write_untagged(pipe_stream, line)
                return
            if tagged.oom:
                with self._lock:
                    self._ooms[tagged.rank] = tagged.oom
                return
            if tagged.stacks is not None:
                with self._lock:
                    self._stacks[tagged.rank] = tagged.stacks
                return
            if tagged.exit_code is not None:
                with self._lock:
                    outcome = replace(
                        Outcome.from_returncode(tagged.exit_code), oom=self._ooms.get(tagged.rank, "")
                    )
                    self._exits[tagged.rank] = (outcome, time.monotonic())
                    if not outcome.ok and self._first_failure is None:
                        self._first_failure = (tagged.rank, outcome)
                return
            self._outputs[tagged.rank].write_line(tagged.stream, tagged.text)

        return handle

    def poll(self) -> Outcome | None:
        returncode = self._popen.poll()
        if returncode is not None and self._outcome is None:
            for thread in self.threads:  # the ranks' exit lines may still be in the pipes
                thread.join(timeout=DRAIN_SECONDS)
            self._outcome = Outcome.from_returncode(returncode)
        return self._outcome

    def failure(self) -> Failure | None:
        with self._lock:
            first = self._first_failure
        if first is not None:
            rank, outcome = first
            where = f"rank {rank} on host {self._slots[rank].host}"
            return Failure(where, outcome, list(self._outputs[rank].stderr_tail))
        if self._outcome is not None and not self._outcome.ok:
            return Failure(self.name, self._outcome, list(self._launcher_tail))
        return None

    def ends(self) -> list[RankEnd]:
        with self._lock:
            exits = dict(self._exits)
        return [
            rank_end(slot, self._outputs[rank], *exits.get(rank, (None, None)))
            for rank, slot in self._slots.items()
        ]

    def ask_stacks(self) -> bool:
        """Ask every rank's agent for its Python stacks, where the launcher copies its stdin to every task
        (no other way reaches them: False otherwise); the answers come in `stacks()`."""
        with self._lock:
            self._stacks.clear()
        self._control("stacks")
        return self._control_stdin

    def stacks(self) -> dict[int, str]:
        with self._lock:
            return dict(self._stacks)

    def _control(self, line: str) -> None:
        stdin = self._popen.stdin
        if stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ValueError, OSError):
            stdin.write(line.encode() + b"\n")
            stdin.flush()

    def _signal_launcher(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if signum == signal.SIGKILL:
                os.killpg(self._popen.pid, signum)
            else:
                self._popen.send_signal(signum)

    def send_signal(self, signum: int) -> None:
        if not self._control_stdin:
            self._signal_launcher(signum)
            return
        self._control(f"signal {int(signum)}")  # the agents signal their ranks' process groups

    def finish(self) -> None:
        """Stop the launcher: with a control channel, closing it lets the agents stop their ranks and the
        launcher end the step; then (or otherwise at once) SIGTERM, and SIGKILL for the process group."""
        if self._control_stdin:
            with contextlib.suppress(OSError):
                assert self._popen.stdin is not None
                self._popen.stdin.close()
            self._wait(STDIN_END_SECONDS)
        if self._popen.poll() is None:
            self._signal_launcher(signal.SIGTERM)
            self._wait(TERM_SECONDS)
        self._signal_launcher(signal.SIGKILL)
        self._popen.wait()
        for thread in self.threads:
            thread.join(timeout=DRAIN_SECONDS)
        for output in self._outputs.values():
            output.close()

    def _wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self._popen.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
