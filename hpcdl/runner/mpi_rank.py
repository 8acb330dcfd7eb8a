"""Wraps one rank under ``hpcdl run --mpi``: ``python -m hpcdl.runner.mpi_rank TOKEN COMMAND...``.

mpirun runs this on every rank. It starts COMMAND (inheriting the MPI launcher's environment and
descriptors, so MPI_Init and PMI work as without it), forwards signals to it, and passes its output
on one whole line per write: MPI launchers tag each chunk they read, so a program writing a line in
pieces (unbuffered Python) would otherwise come out split. When COMMAND ends it writes
``TOKEN exit RETURNCODE`` on stderr (after ``TOKEN oom TEXT`` when the kernel's OOM killer ended it); the
launcher reads that line to learn how and when each rank ended (MPICH's mpiexec does not stop the job when
a rank exits non-zero, and neither MPI names the rank in its own exit status). With HPCDL_MASTER_BOARD set
(rank 0 runs on another host than ``hpcdl run``), rank 0 holds a MASTER_PORT on its host and posts it there,
and the other ranks learn it before they start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from typing import BinaryIO

from hpcdl import jobenv
from hpcdl.platforms import mpi
from hpcdl.runner.rank_agent import learn_master_port, oom_kill_count, oom_report, socket_interface_env

# The variables naming an MPI rank's world rank, by MPI (Open MPI, then MPICH/Hydra and Intel MPI).
_RANK_VARIABLES = tuple(task.rank for task in mpi.PLATFORM.tasks if task.mpi_family)


def _relay_lines(pipe: BinaryIO, fd: int) -> None:
    with pipe:
        for line in iter(pipe.readline, b""):
            os.write(fd, line if line.endswith(b"\n") else line + b"\n")


def _master_port(env: dict[str, str]) -> tuple[socket.socket | None, str]:
    """(the holder to keep, MASTER_PORT) from the launcher's board; OSError when that fails."""
    rank = int(next((env[name] for name in _RANK_VARIABLES if env.get(name)), "0"))
    timeout = float(env.get(jobenv.START_TIMEOUT, "30"))
    holder, port = learn_master_port(env.pop(jobenv.MASTER_BOARD), env.get(jobenv.SECRET, ""), rank, timeout)
    return holder, str(port)


def main(argv: list[str]) -> int:
    token, command = argv[0], argv[1:]
    env = dict(os.environ)
    env.update(socket_interface_env(env))
    holder = None  # rank 0's reservation of MASTER_PORT, held while the rank runs
    if env.get(jobenv.MASTER_BOARD):
        try:
            holder, env["MASTER_PORT"] = _master_port(env)
        except OSError as exc:
            os.write(2, f"hpcdl run: {exc}\n{token} exit 1\n".encode())
            return 1
    oom_before = oom_kill_count()
    try:
        child = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=False
        )
    except OSError as exc:
        os.write(2, f"hpcdl run: cannot start {command[0]}: {exc.strerror}\n".encode())
        returncode = 127
    else:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda received, _frame: child.send_signal(received))
        relays = [
            threading.Thread(target=_relay_lines, args=(pipe, fd), daemon=True)
            for pipe, fd in ((child.stdout, 1), (child.stderr, 2))
        ]
        for relay in relays:
            relay.start()
        returncode = child.wait()
        for relay in relays:
            relay.join(timeout=2.0)  # bounded: a grandchild may still hold the pipe
        oom = oom_report(oom_before, child.pid) if returncode == -signal.SIGKILL else ""
        if oom:
            os.write(2, f"{token} oom {oom}\n".encode())
    if holder is not None:
        holder.close()
    os.write(2, f"{token} exit {returncode}\n".encode())
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    # os._exit: a relay thread may still block in a read that interpreter shutdown would wait for.
    os._exit(main(sys.argv[1:]))
