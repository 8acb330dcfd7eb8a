"""``hpcdl run --mpi``: the mpirun (Open MPI) or mpiexec (MPICH/Hydra, Intel MPI) line for a job, and
the one process that runs it, its tagged output split back into ranks."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import secrets
import shlex
import signal
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import HostSlots, RankSlot
from hpcdl.runner.output import TAIL_LINES, OutputRouter, RankOutput, pump_lines
from hpcdl.runner.procs import DRAIN_SECONDS, Failure, Outcome, SshOptions
from hpcdl.runner.rank_env import FORWARDED_NAMES, FORWARDED_PREFIXES

VERSION_TIMEOUT_SECONDS = 20.0
OPENMPI, MPICH = "Open MPI", "MPICH/Hydra"
# Per-rank identity comes from the MPI launcher; inherited values would be wrong.
_RANK_VARIABLES = tuple(
    prefix + name
    for prefix in ("HPCDL_", "HOROVOD_")
    for name in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")
)
_OPENMPI_TAG = re.compile(rb"^\[\d+,(\d+)\]<(stdout|stderr)>:(.*)$", re.DOTALL)
_MPICH_TAG = re.compile(rb"^\[(\d+)\] (.*)$", re.DOTALL)


def detect_flavor(mpirun: str) -> str:
    """Open MPI or MPICH/Hydra, from ``mpirun --version``."""
    try:
        done = subprocess.run(
            [mpirun, "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_SECONDS,
            check=False,
        )
    except FileNotFoundError:
        raise LaunchError(
            f"--mpi: '{mpirun}' is not installed or not on PATH; load an MPI or pass --mpirun PATH"
        ) from None
    except subprocess.TimeoutExpired:
        raise LaunchError(
            f"--mpi: '{mpirun} --version' did not answer within {VERSION_TIMEOUT_SECONDS:g} s"
        ) from None
    text = done.stdout + done.stderr
    if any(mark in text for mark in ("Open MPI", "OpenRTE", "Spectrum MPI")):
        return OPENMPI
    if any(mark in text for mark in ("HYDRA", "Intel(R) MPI", "MPICH")):
        return MPICH
    first = text.strip().splitlines()[0] if text.strip() else "(no output)"
    raise LaunchError(
        f"--mpi: cannot tell which MPI '{mpirun}' is from its --version output ('{first}'); "
        "hpcdl run supports Open MPI and MPICH/Hydra (incl. Intel MPI); pass --mpirun PATH to one of them"
    )


@dataclass(frozen=True)
class MpiCommand:
    argv: list[str]
    env: dict[str, str]  # the launcher's environment, plus what the ranks get by name (-x / -genvlist)
    shown: str  # what --verbose prints (no values of variables, so no secret)


def build_mpi_command(
    flavor: str,
    mpirun: str,
    hosts: list[HostSlots],
    num_proc: int,
    rank_env: dict[str, str],
    environ: Mapping[str, str],
    wrapped_command: list[str],
    *,
    ssh: SshOptions,
    network_interface: str | None,
    tcp: bool,
    extra_args: str,
    is_root: bool,
) -> MpiCommand:
    """The mpirun/mpiexec line running `wrapped_command` on `num_proc` ranks over `hosts`.

    Variables reach the ranks by name only (values travel in mpirun's own environment), so the job
    secret never appears on a command line.
    """
    env = {k: v for k, v in environ.items() if k not in _RANK_VARIABLES}
    env.update(rank_env)
    names = sorted(
        name
        for name in env
        if name in FORWARDED_NAMES or name.startswith(FORWARDED_PREFIXES) or name in rank_env
    )
    host_list = ",".join(f"{h.name}:{h.slots}" for h in hosts)
    ssh_args = shlex.join(ssh.options())
    shown_env = ""
    if flavor == OPENMPI:
        argv = [mpirun, *(["--allow-run-as-root"] if is_root else []), "--tag-output"]
        argv += ["-np", str(num_proc), "-H", host_list, "-bind-to", "none", "-map-by", "slot"]
        argv += ["-mca", "pml", "ob1", "-mca", "btl", "self,tcp" if tcp else "^openib"]
        if network_interface:
            argv += ["-mca", "btl_tcp_if_include", network_interface]
            argv += ["-mca", "oob_tcp_if_include", network_interface]
        argv += ["-mca", "plm_rsh_args", ssh_args]
        for name in names:
            argv += ["-x", name]
    else:
        argv = [mpirun, "-l", "-n", str(num_proc), "-hosts", host_list, "-bind-to", "none"]
        if network_interface:
            argv += ["-iface", network_interface]
        argv += ["-launcher", "ssh", "-genvlist", ",".join(names)]
        env["HYDRA_LAUNCHER_EXTRA_ARGS"] = ssh_args
        shown_env = f"HYDRA_LAUNCHER_EXTRA_ARGS={shlex.quote(ssh_args)} "
    argv += shlex.split(extra_args)
    argv += wrapped_command
    return MpiCommand(argv, env, shown_env + shlex.join(argv))


class MpiRun:
    """mpirun as the job's one process; its tagged lines go to the ranks' outputs."""

    def __init__(
        self, command: MpiCommand, flavor: str, slots: list[RankSlot], router: OutputRouter, token: str
    ):
        self._flavor = flavor
        self._router = router
        self._slots = {slot.rank: slot for slot in slots}
        self._outputs: dict[int, RankOutput] = {slot.rank: router.for_rank(slot.rank) for slot in slots}
        self._token = token.encode()
        self._launcher_tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._first_failure: tuple[int, Outcome] | None = None
        self._outcome: Outcome | None = None
        self._lock = threading.Lock()
        try:
            self._popen = subprocess.Popen(
                command.argv,
                env=command.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {command.argv[0]}: {exc.strerror}") from None
        assert self._popen.stdout is not None and self._popen.stderr is not None
        self.threads = [
            threading.Thread(target=pump_lines, args=(pipe, self._line_handler(stream)), daemon=True)
            for pipe, stream in ((self._popen.stdout, "stdout"), (self._popen.stderr, "stderr"))
        ]
        for thread in self.threads:
            thread.start()

    def _parse(self, stream: str, line: bytes) -> tuple[int | None, str, bytes]:
        if self._flavor == OPENMPI:
            match = _OPENMPI_TAG.match(line)
            if match:
                return int(match.group(1)), match.group(2).decode(), match.group(3)
        else:
            match = _MPICH_TAG.match(line)
            if match:
                return int(match.group(1)), stream, match.group(2)
        return None, stream, line

    def _line_handler(self, pipe_stream: str) -> Callable[[bytes], None]:
        def handle(line: bytes) -> None:
            rank, stream, text = self._parse(pipe_stream, line)
            if rank is None or rank not in self._outputs:
                self._launcher_tail.append(line.decode(errors="replace").rstrip("\n"))
                self._router.write_untagged(pipe_stream, line)
                return
            words = text.split()
            if len(words) == 3 and words[0] == self._token and words[1] == b"exit":
                outcome = Outcome.from_returncode(int(words[2]))
                with self._lock:
                    if not outcome.ok and self._first_failure is None:
                        self._first_failure = (rank, outcome)
                return
            self._outputs[rank].write_line(stream, text)

        return handle

    def poll(self) -> Outcome | None:
        returncode = self._popen.poll()
        if returncode is not None and self._outcome is None:
            for thread in self.threads:  # the ranks' status lines may still be in the pipes
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
            return Failure(os.path.basename(self._popen.args[0]), self._outcome, list(self._launcher_tail))
        return None

    def send_signal(self, signum: int) -> None:
        """mpirun forwards polite signals to the ranks; SIGKILL takes its whole process group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if signum == signal.SIGKILL:
                os.killpg(self._popen.pid, signum)
            else:
                self._popen.send_signal(signum)

    def finish(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signal.SIGKILL)
        self._popen.wait()
        for thread in self.threads:
            thread.join(timeout=DRAIN_SECONDS)
        for output in self._outputs.values():
            output.close()


def new_token() -> str:
    return "hpcdl-rank-" + secrets.token_hex(8)
