"""The asynchronous ``HpcdlLatch`` kernel (``latch_op.cc``): compiled against the installed TensorFlow on
first use, cached, and loaded; and the waiter threads that open latches.

A graph's collective is submitted by one op, waited for by a latch (which holds no executor thread) and
read by a third op (see ``mpi_ops._run``). The kernel is built once per TensorFlow version and compiler
into ``$XDG_CACHE_HOME/hpcdl/tensorflow`` (``~/.cache/...``), under a file lock, so that the ranks of a
host build it once; ``python -m hpcdl.tensorflow._latch`` builds it ahead of time (``scripts/setup.sh``
does). Where it cannot be built (no C++ compiler, no TensorFlow headers), graph-mode collectives wait
inside their op as before, which a graph whose collectives each rank's executor may run in a different
order can deadlock until the engine's deadline: hpcdl warns once, saying what to install.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import itertools
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import tensorflow as tf

_SOURCE = Path(__file__).with_name("latch_op.cc")
_lock = threading.Lock()
Opener = Callable[[int, int, Optional[bytes]], int]
_loaded: Optional[tuple[Any, Opener]] = None
_failed: Optional[str] = None


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpcdl" / "tensorflow"


def _command(compiler: str, output: Path) -> list[str]:
    return [
        compiler,
        "-shared",
        "-fPIC",
        "-O2",
        "-w",
        *tf.sysconfig.get_compile_flags(),
        str(_SOURCE),
        "-o",
        str(output),
        *tf.sysconfig.get_link_flags(),
    ]


def library_path() -> Path:
    """Where the kernel for this TensorFlow, compiler and source lives once built."""
    compiler = os.environ.get("CXX") or "c++"
    key = hashlib.sha256(
        "\0".join([_SOURCE.read_text(), tf.__version__, compiler, *_command(compiler, Path("-"))]).encode()
    ).hexdigest()[:16]
    return _cache_dir() / f"hpcdl_latch_{tf.__version__}_{key}.so"


def build() -> Path:
    """Compile the kernel unless it is cached; returns its path. Raises ``RuntimeError`` saying why not."""
    target = library_path()
    if target.exists():
        return target
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler ({compiler!r}; set CXX, or install g++)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other ranks of this host wait for the first one's build
        if target.exists():
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            built = Path(scratch) / target.name
            result = subprocess.run(_command(compiler, built), capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"{compiler} failed:\n{result.stderr[-2000:]}")
            os.replace(built, target)
    return target


def load() -> Optional[tuple[Any, Opener]]:
    """(the op module, ``open(token, TensorFlow error code or 0, message)``), building the kernel if
    needed; None where it cannot be built (warned once)."""
    global _loaded, _failed
    with _lock:
        if _loaded is None and _failed is None:
            try:
                path = build()
                module = tf.load_op_library(str(path))
                opener = ctypes.CDLL(str(path)).hpcdl_tf_open
                opener.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_char_p]
                opener.restype = ctypes.c_int
                _loaded = (module, opener)
            except (OSError, RuntimeError, tf.errors.OpError) as exc:
                _failed = str(exc)
                warnings.warn(
                    "hpcdl.tensorflow could not build its asynchronous graph kernel, so collectives inside a "
                    "graph wait in their op: a graph whose collectives ranks run in different orders may "
                    "then wait for the engine's deadline. Install a C++ compiler (g++) to fix it. Reason: "
                    + _failed,
                    RuntimeWarning,
                    stacklevel=3,
                )
        return _loaded


class Waiters:
    """Threads that run blocking jobs (waits with the engine's deadline) for the latches: one per job in
    flight, reused, so no job waits behind another."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._free = 0
        self._names = itertools.count()

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._free > 0:
                self._free -= 1
            else:
                name = f"hpcdl-tf-waiter-{next(self._names)}"
                threading.Thread(target=self._serve, name=name, daemon=True).start()
        self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            finally:
                with self._lock:
                    self._free += 1


if __name__ == "__main__":
    try:
        print(build())
    except RuntimeError as exc:
        sys.exit(f"hpcdl: cannot build the TensorFlow graph kernel: {exc}")
