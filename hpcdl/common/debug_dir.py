"""Where a job's diagnostic files go: flight-recorder dumps, Python stacks, each rank's last words.

``HPCDL_DEBUG_DIR`` when set (``hpcdl run`` and the scripts of ``hpcdl submit`` set it for every rank),
else ``./hpcdl-debug/<job id>``, the job id being the one its launcher or scheduler gives it
(:func:`hpcdl.platforms.job_id_variables`), else the rendezvous it meets at. ``hpcdl debug analyze
DIR`` reads them there.

The files may tell others what a job does, so they are private: the directory is made 0700, files 0600,
and no file is written through a symbolic link (another user's link could point anywhere). Nothing here
creates anything until a file is written.

``python -m hpcdl.runner.print_debug_dir`` prints the directory a launcher gives its ranks (batch scripts
export it before the ranks start).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

from hpcdl import jobenv
from hpcdl.common.discovery import job_id
from hpcdl.common.output_file import private_directory, write_output_file

DEBUG_DIR_ENV = "HPCDL_DEBUG_DIR"
ROOT = "hpcdl-debug"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def job_key(environ: Mapping[str, str] | None = None) -> str:
    """A name for this job that every rank derives alike and that is safe as a directory name: the launcher's
    or scheduler's job id, else the rendezvous address and port, else this process's parent (ranks started
    by one launcher process on one host)."""
    env = os.environ if environ is None else environ
    key = job_id(env)
    for host, port in ((jobenv.RENDEZVOUS_ADDR, jobenv.RENDEZVOUS_PORT), ("MASTER_ADDR", "MASTER_PORT")):
        if not key and env.get(host) and env.get(port):
            key = f"{env[host]}-{env[port]}"
    if not key:
        key = f"parent{os.getppid()}"
    return _UNSAFE.sub("_", key).strip("._") or "job"


def run_key(now: float | None = None) -> str:
    """``hpcdl run``'s own name for a job it runs outside any scheduler's: its start time and process id."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    return f"run-{stamp}-{os.getpid()}"


def debug_dir(environ: Mapping[str, str] | None = None) -> Path:
    """This job's diagnostic directory (absolute; nothing is created)."""
    env = os.environ if environ is None else environ
    given = env.get(DEBUG_DIR_ENV, "").strip()
    if given:
        return Path(os.path.abspath(os.path.expanduser(given)))
    return Path.cwd() / ROOT / job_key(env)


def launcher_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The directory a launcher gives its ranks (``hpcdl run``, a batch script): HPCDL_DEBUG_DIR when set,
    else ``./hpcdl-debug/<the scheduler's job id>``, else ``./hpcdl-debug/run-<start time>-<pid>``."""
    env = os.environ if environ is None else environ
    if env.get(DEBUG_DIR_ENV, "").strip() or job_id(env):
        return debug_dir(env)
    return Path.cwd() / ROOT / run_key()


def write_private(path: Path, data: bytes, what: str = "diagnostic file") -> None:
    """Write `path` whole (readers never see half a file: it is made beside and renamed over the old one)
    with mode 0600, in a directory made or narrowed to 0700 that must be the user's own; never through a
    link (:mod:`hpcdl.common.output_file`). OutputFileError says why it cannot."""
    private_directory(path.parent, "debug directory (HPCDL_DEBUG_DIR)")
    write_output_file(path, what, data, replace=True)
