"""Wraps one rank under ``hpcdl run --mpi``: ``python -m hpcdl.runner.mpi_rank TOKEN COMMAND...``.

mpirun runs this on every rank; it starts COMMAND (inheriting the MPI launcher's environment and
descriptors, so MPI_Init and PMI work as without it), forwards signals to it and, when it ends, writes
``TOKEN exit RETURNCODE`` on stderr. The launcher reads that line to learn which rank failed first and
how: MPICH's mpiexec does not stop the job when a rank exits non-zero, and neither MPI names the rank
in its exit status.
"""

from __future__ import annotations

import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    token, command = argv[0], argv[1:]
    try:
        child = subprocess.Popen(command, close_fds=False)
    except OSError as exc:
        sys.stderr.write(f"hpcdl run: cannot start {command[0]}: {exc.strerror}\n")
        returncode = 127
    else:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda received, _frame: child.send_signal(received))
        returncode = child.wait()
    sys.stderr.flush()
    sys.stderr.write(f"{token} exit {returncode}\n")
    sys.stderr.flush()
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
