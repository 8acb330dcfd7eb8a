"""Where a job's diagnostic files go: flight-recorder dumps, Python stacks, each rank's last words.

``HPCDL_DEBUG_DIR`` when set (``hpcdl run`` and the scripts of ``hpcdl submit`` set it for every rank),
else ``./hpcdl-debug/<job id>``, the job id being the one its launcher or scheduler gives it
(:data:`hpcdl.common.discovery.JOB_ID_VARIABLES`), else the rendezvous it meets at. ``hpcdl debug analyze
DIR`` reads them there.

The files may tell others what a job does, so they are private: the directory is made 0700, files 0600,
and no file is written through a symbolic link (another user's link could point anywhere). Standard
library only, and nothing here creates anything until a file is written.

``python -m hpcdl.common.debug_dir`` prints the directory a launcher gives its ranks (batch scripts export it
before the ranks start).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Mapping
from pathlib import Path

from hpcdl.common.discovery import job_id

DEBUG_DIR_ENV = "HPCDL_DEBUG_DIR"
ROOT = "hpcdl-debug"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def job_key(environ: Mapping[str, str] | None = None) -> str:
    """A name for this job that every rank derives alike and that is safe as a directory name: the launcher's
    or scheduler's job id, else the rendezvous address and port, else this process's parent (ranks started
    by one launcher process on one host)."""
    env = os.environ if environ is None else environ
    key = job_id(env)
    for host, port in (("HPCDL_RENDEZVOUS_ADDR", "HPCDL_RENDEZVOUS_PORT"), ("MASTER_ADDR", "MASTER_PORT")):
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


def make_private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) with mode 0700 for the last one; refuse a directory or a link to
    one that belongs to another user. OSError (PermissionError for another's) when it cannot."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for checked in (os.lstat(path), os.stat(path)):
        if checked.st_uid != os.geteuid():
            raise PermissionError(f"{path} belongs to another user; hpcdl does not write its files there")
    if not stat.S_ISDIR(os.stat(path).st_mode):
        raise NotADirectoryError(f"{path} is not a directory")
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write `path` whole (readers never see half a file) with mode 0600, in a private directory: a new file
    is created beside it without following links, then renamed over it (a link there is replaced, never
    followed)."""
    make_private_dir(path.parent)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)  # left by an earlier process with this pid
    fd = os.open(temporary, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


if __name__ == "__main__":
    print(launcher_dir())
