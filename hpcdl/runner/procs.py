"""One running rank: its own process group behind the rank agent, on this host, over ssh, or through a
scheduler launcher's one-task form (``srun --nodes=1 --ntasks=1 --nodelist=HOST``, ...)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Protocol

from hpcdl.diagnosis.tracebacks import RaisedError
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import RankSlot
from hpcdl.runner.output import RankOutput, pump_lines
from hpcdl.runner.stack_dumps import decode

DRAIN_SECONDS = 2.0
_AGENT_SOURCE = (Path(__file__).parent / "rank_agent.py").read_text()


@dataclass(frozen=True)
class Outcome:
    """How a rank ended: an exit code, or the signal that killed it; `note` explains odd endings, `oom` what
    the kernel said when its OOM killer ended the rank."""

    exit_code: int | None = None
    signal: int | None = None
    note: str = ""
    oom: str = ""

    @staticmethod
    def from_returncode(returncode: int) -> Outcome:
        if returncode < 0:
            return Outcome(signal=-returncode)
        return Outcome(exit_code=returncode)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.signal is None

    @property
    def launcher_exit_code(self) -> int:
        return self.exit_code if self.signal is None else 128 + self.signal

    def describe(self) -> str:
        if self.signal is not None:
            text = f"was killed by signal {signal.Signals(self.signal).name} ({self.signal})"
            return f"{text}: the kernel's OOM killer ended it ({self.oom})" if self.oom else text
        text = f"exited with code {self.exit_code}"
        return f"{text} ({self.note})" if self.note else text


@dataclass(frozen=True)
class LauncherStart:
    """A scheduler launcher's argv that starts one task on a named host (its `worker_argv`)."""

    worker_argv: Callable[[str], list[str]]
    name: str

    def agent_argv(self, host: str, python: str, source: str) -> list[str]:
        return [*self.worker_argv(host), python, "-c", source]

    def lost(self, host: str, returncode: int) -> str:
        return f"{self.name} could not start the rank on {host}; see its stderr"


@dataclass(frozen=True)
class Failure:
    """The first sign of trouble in a job: which rank (and host) or the launcher that ran every rank
    (mpirun, srun), how it ended, its last stderr."""

    where: str
    outcome: Outcome
    stderr_tail: list[str]


@dataclass(frozen=True)
class RankEnd:
    """What the launcher learned of one rank: how it ended (None: no status came, e.g. its launcher killed
    it), when (monotonic seconds), the last Python error on its stderr and when that came, its last stderr
    lines."""

    rank: int
    host: str
    outcome: Outcome | None
    ended_at: float | None
    error: RaisedError | None
    error_at: float | None
    stderr_tail: list[str]

    @property
    def where(self) -> str:
        return f"rank {self.rank} on host {self.host}"


def rank_end(slot: RankSlot, output: RankOutput, outcome: Outcome | None, ended_at: float | None) -> RankEnd:
    return RankEnd(
        slot.rank, slot.host, outcome, ended_at, output.error, output.error_at, list(output.stderr_tail)
    )


class RemoteStart(Protocol):
    """How the rank agent is started on another host."""

    def agent_argv(self, host: str, python: str, source: str) -> list[str]:
        """The argv that runs ``python -c source`` on `host` with this process's stdin and output."""
        ...

    def lost(self, host: str, returncode: int) -> str:
        """What an exit with `returncode` without the agent's report means ('' when nothing special)."""
        ...


# --ssh-host-key-policy: OpenSSH's StrictHostKeyChecking. Without one, ssh does what the user's ssh
# configuration says, and OpenSSH's default there ("ask", which BatchMode turns into "yes") refuses a host
# whose key is not in the user's known_hosts: no key is trusted on first use unless asked for.
HOST_KEY_POLICIES = ("yes", "accept-new", "no")


@dataclass(frozen=True)
class SshOptions:
    port: int | None = None
    identity_file: Path | None = None
    config_file: Path | None = None
    connect_timeout: float = 30.0
    host_key_policy: str | None = None  # one of HOST_KEY_POLICIES, None: as the ssh configuration says

    def agent_argv(self, host: str, python: str, source: str) -> list[str]:
        remote_command = (
            f'exe={shlex.quote(python)}; [ -x "$exe" ] || exe=python3; exec "$exe" -c {shlex.quote(source)}'
        )
        return [*self.argv(host), remote_command]

    def options(self) -> list[str]:
        """The options of ``ssh -T`` for every host (also what mpirun's ssh gets)."""
        argv = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(self.connect_timeout))}"]
        if self.host_key_policy is not None:
            argv += ["-o", f"StrictHostKeyChecking={self.host_key_policy}"]
        if self.config_file is not None:
            argv += ["-F", str(self.config_file)]
        if self.port is not None:
            argv += ["-p", str(self.port)]
        if self.identity_file is not None:
            argv += ["-i", str(self.identity_file)]
        return argv

    def lost(self, host: str, returncode: int) -> str:
        """What ssh's own exit status (255) says about a rank that never reported its status."""
        if returncode != 255:
            return ""
        return (
            f"ssh to {host} failed: the host is unreachable, refused the connection or the login, or its "
            "host key is not in your known_hosts (see --ssh-host-key-policy); its stderr above says which"
        )

    def argv(self, host: str) -> list[str]:
        """``ssh`` and its options up to the host (the remote command follows); ``--`` ends the options,
        so that no host name can be read as one."""
        return ["ssh", "-T", *self.options(), "--", host]


def _spawn_error(argv: list[str], exc: OSError) -> LaunchError:
    if isinstance(exc, FileNotFoundError):
        return LaunchError(f"command not found: {argv[0]}; check the command or your PATH")
    return LaunchError(f"cannot start {argv[0]}: {exc.strerror}")


class AgentRank:
    """A rank behind the rank agent (``python -c <rank_agent.py>``), started here or on its host through
    ssh or a scheduler's launcher (`remote`).

    The agent gets the rank's command, environment (with the job secret) and working directory on
    stdin, and later the signals to forward; when stdin closes it stops the rank's process group.
    It reports the rank's process group and, at the end, its status on stderr, after a per-rank token.
    """

    def __init__(
        self,
        slot: RankSlot,
        argv: list[str],
        env: dict[str, str],
        output: RankOutput,
        remote: RemoteStart | None = None,
        python: str = sys.executable,
        extra_spec: dict[str, Any] | None = None,
    ):
        self.slot = slot
        self.output = output
        self._remote = remote
        self._token = "hpcdl-agent-" + secrets.token_hex(8)
        self._status: int | None = None
        self._oom = ""
        self._stacks: str | None = None  # the rank's Python stacks, as its agent last sent them
        self._ended_at: float | None = None
        self._rank_group: int | None = None  # the rank's process group, for SIGKILL on this host
        self._outcome: Outcome | None = None
        if remote is None:
            if shutil.which(argv[0], path=env.get("PATH")) is None:
                raise LaunchError(f"command not found: {argv[0]}; check the command or your PATH")
            agent_argv = [python, "-c", _AGENT_SOURCE]
        else:
            agent_argv = remote.agent_argv(slot.host, python, _AGENT_SOURCE)
        try:
            self._popen = subprocess.Popen(
                agent_argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise _spawn_error(agent_argv, exc) from None
        assert self._popen.stdin and self._popen.stdout and self._popen.stderr
        spec = {"argv": argv, "env": env, "cwd": os.getcwd(), "token": self._token, "rank": slot.rank}
        spec.update(extra_spec or {})
        self._control(json.dumps(spec))
        self.threads = [
            threading.Thread(
                target=pump_lines, args=(self._popen.stdout, _line_sink(output, "stdout")), daemon=True
            ),
            threading.Thread(target=pump_lines, args=(self._popen.stderr, self._on_stderr), daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _control(self, line: str) -> None:
        stdin = self._popen.stdin
        assert stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError, OSError):
            stdin.write(line.encode() + b"\n")
            stdin.flush()

    def _on_stderr(self, line: bytes) -> None:
        token = self._token.encode()
        at = line.find(token)
        if at < 0:
            self.output.write_line("stderr", line)
            return
        if at > 0:  # the rank's last stderr line had no newline
            self.output.write_line("stderr", line[:at])
        words = line[at:].split(maxsplit=2)
        if len(words) == 3 and words[1] == b"exit":
            self._status = int(words[2])
            self._ended_at = time.monotonic()
        elif len(words) == 3 and words[1] == b"pid":
            self._rank_group = int(words[2])
        elif len(words) == 3 and words[1] == b"oom":
            self._oom = words[2].decode(errors="replace").strip()
        elif len(words) == 3 and words[1] == b"stacks":
            self._stacks = decode(words[2].strip())

    def poll(self) -> Outcome | None:
        returncode = self._popen.poll()
        if returncode is None or self._outcome is not None:
            return self._outcome
        self.threads[1].join(timeout=DRAIN_SECONDS)  # the status line comes on stderr
        if self._status is not None:
            self._outcome = replace(Outcome.from_returncode(self._status), oom=self._oom)
        elif self._remote is not None and self._remote.lost(self.slot.host, returncode):
            self._outcome = Outcome(exit_code=returncode, note=self._remote.lost(self.slot.host, returncode))
        else:
            self._outcome = Outcome(
                exit_code=returncode, note="the rank agent did not report the rank's status"
            )
        self._ended_at = self._ended_at or time.monotonic()
        return self._outcome

    def ends(self) -> list[RankEnd]:
        return [rank_end(self.slot, self.output, self._outcome, self._ended_at)]

    def failure(self) -> Failure | None:
        if self._outcome is None or self._outcome.ok:
            return None
        where = f"rank {self.slot.rank} on host {self.slot.host}"
        return Failure(where, self._outcome, list(self.output.stderr_tail))

    def ask_stacks(self) -> bool:
        """Ask the agent for the rank's Python stacks (the answer comes in `stacks()`)."""
        self._stacks = None
        self._control("stacks")
        return True

    def stacks(self) -> dict[int, str]:
        return {} if self._stacks is None else {self.slot.rank: self._stacks}

    def send_signal(self, signum: int) -> None:
        self._control(f"signal {int(signum)}")
        if signum == signal.SIGKILL and self._remote is None and self._rank_group is not None:
            # does not depend on the agent being responsive
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._rank_group, signal.SIGKILL)

    def finish(self) -> None:
        """Close the control channel (the agent then stops the rank) and reap ssh or the launcher."""
        with contextlib.suppress(OSError):
            assert self._popen.stdin is not None
            self._popen.stdin.close()
        try:
            self._popen.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()
        _drain(self.threads, self.output)


def _drain(threads: list[threading.Thread], output: RankOutput) -> None:
    """Let the output threads reach EOF (bounded: a leftover child may hold a pipe), then close."""
    for thread in threads:
        thread.join(timeout=DRAIN_SECONDS)
    output.close()


def _line_sink(output: RankOutput, stream: str) -> Callable[[bytes], None]:
    return lambda line: output.write_line(stream, line)
