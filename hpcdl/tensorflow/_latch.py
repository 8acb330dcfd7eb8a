"""The asynchronous ``HpcdlLatch`` kernel (``latch_op.cc``): compiled against the installed TensorFlow on
first use, cached, and loaded, with the Python end of its waits (:class:`Kernel`).

A graph's collective is submitted by one op, which hands the engine handles to the kernel's library
(:meth:`Kernel.watch`), waited for by a latch (which holds no executor thread while others may need it; the
library's own threads wait, without Python) and read by a third op (see ``mpi_ops._run``). The kernel is
built once per TensorFlow version and compiler into ``$XDG_CACHE_HOME/hpcdl/tensorflow`` (``~/.cache/...``),
under a file lock, so that the ranks of a host build it once; :func:`prebuild` builds it ahead of time
(``scripts/setup.sh`` does). Where it cannot be built (no C++ compiler, no TensorFlow headers),
graph-mode collectives wait inside their op as before, which a graph whose collectives each rank's
executor may run in a different order can deadlock until the engine's deadline: hpcdl warns once, saying
what to install.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Callable, Optional

import tensorflow as tf

from hpcdl.common import library

_SOURCE = Path(__file__).with_name("latch_op.cc")
_lock = threading.Lock()
_loaded: Optional[Kernel] = None
# (token, hpcdl status or Kernel.ORPHAN, message) -> the TensorFlow code and message to fail the latch with
Handler = Callable[[int, int, str], Optional[tuple[int, str]]]
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


class Kernel:
    """The loaded library: the latch op (``ops.hpcdl_latch``) and the calls that feed its waits.

    The submitting op hands a collective's engine handles over with :meth:`watch`; the library's threads
    wait for them and finish the latch. A failure comes back, on one Python thread, to the handler given to
    :meth:`serve`, which words it; the latch then fails with the TensorFlow code and message it returns.
    ``inline``: whether a latch may wait on its executor thread (TensorFlow runs kernels on at least two
    threads, see ``latch_op.cc``)."""

    ORPHAN = -1  # an event: the operations of a cancelled latch ended (release them)

    def __init__(self, path: Path) -> None:
        self.ops = tf.load_op_library(str(path))
        lib = ctypes.CDLL(str(path))
        runtime = library.load()
        i64, text = ctypes.c_int64, ctypes.c_char_p
        lib.hpcdl_tf_bind.argtypes = [ctypes.c_void_p] * 3
        lib.hpcdl_tf_bind.restype = None
        lib.hpcdl_tf_bind(
            *(
                ctypes.cast(getattr(runtime, f), ctypes.c_void_p)
                for f in ("hpcdl_wait", "hpcdl_poll", "hpcdl_last_error")
            )
        )
        self._watch = lib.hpcdl_tf_watch
        self._watch.argtypes = [i64, ctypes.POINTER(i64), ctypes.c_int, i64, ctypes.c_int, ctypes.c_int, text]
        self._watch.restype = None
        self._open = lib.hpcdl_tf_open
        self._open.argtypes = [i64, ctypes.c_int, text]
        self._open.restype = ctypes.c_int
        self._next = lib.hpcdl_tf_next_event
        self._next.argtypes = [ctypes.c_double, ctypes.POINTER(i64), ctypes.c_char_p, ctypes.c_int]
        self._next.restype = ctypes.c_int
        self._serving = False
        self.inline = _executor_threads() >= 2

    def watch(self, token: int, handles: Sequence[int], graph: int, graph_ops: int) -> None:
        """The latch of ``token`` completes when ``handles`` have ended; ``graph_ops``: how many submitting
        ops the graph ``graph`` (any id) holds, so that the library knows which latch of an execution is its
        last (0: unknown)."""
        ids = (ctypes.c_int64 * len(handles))(*handles)
        self._watch(token, ids, len(handles), graph, graph_ops, 0, None)

    def fail(self, token: int, code: int, message: str) -> None:
        """The latch of ``token`` fails with ``code`` (a TensorFlow error code) and ``message`` when it runs
        (its collective was never submitted)."""
        self._watch(token, None, 0, 0, 0, code, message.encode(errors="replace"))

    def serve(self, handler: Handler) -> None:
        """Start the thread that hands the library's events to ``handler(token, status, message)``: status
        :attr:`ORPHAN` (the handler returns None), or the hpcdl status a watched operation failed with (the
        handler returns the TensorFlow code and message to fail its latch with)."""
        with _lock:
            if not self._serving:
                threading.Thread(
                    target=self._events, args=(handler,), name="hpcdl-tf-latch", daemon=True
                ).start()
                self._serving = True

    def _events(self, handler: Handler) -> None:
        token = ctypes.c_int64()
        message = ctypes.create_string_buffer(1 << 16)
        while True:
            status = self._next(60.0, ctypes.byref(token), message, len(message))
            if status == 0:
                continue
            try:
                failure = handler(token.value, status, message.value.decode(errors="replace"))
            except Exception as exc:  # a bug: fail the step rather than leave it waiting for its deadline
                failure = (tf.errors.INTERNAL, f"hpcdl.tensorflow: {exc!r}")
            if failure is not None:
                self._open(token.value, failure[0], failure[1].encode(errors="replace"))


def _executor_threads() -> int:
    """The threads of TensorFlow's inter-op pool, which runs a graph's kernels (its default: one per core
    this process may use)."""
    configured = tf.config.threading.get_inter_op_parallelism_threads()
    from_environment = os.environ.get("TF_NUM_INTEROP_THREADS", "")
    if configured > 0:
        return int(configured)
    if from_environment.strip().isdigit() and int(from_environment) > 0:
        return int(from_environment)
    return len(os.sched_getaffinity(0))


def load() -> Optional[Kernel]:
    """The kernel, built if needed; None where it cannot be built (warned once)."""
    global _loaded, _failed
    with _lock:
        if _loaded is None and _failed is None:
            try:
                _loaded = Kernel(build())
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


def prebuild() -> None:
    """Build the kernel now (``scripts/setup.sh``), printing its path; exits saying why it cannot."""
    try:
        print(build())
    except RuntimeError as exc:
        raise SystemExit(f"hpcdl: cannot build the TensorFlow graph kernel: {exc}") from None
