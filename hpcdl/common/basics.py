"""Lifecycle and topology of the runtime: init, shutdown, ranks, process sets."""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
from collections.abc import Sequence
from typing import Any, Optional, Union

from hpcdl.common import binding, config, discovery, elastic, last_words, library, mpi_library, stacks
from hpcdl.common.exceptions import HpcdlConfigError, HpcdlError, HpcdlNotInitializedError

_lock = threading.Lock()
_atexit_registered = False


def _process_sets_option(process_sets: Union[Sequence[Sequence[int]], str, None]) -> tuple[str, bool]:
    """(static sets text, dynamic flag) from init's process_sets argument."""
    if process_sets is None:
        return "", False
    if isinstance(process_sets, str):
        if process_sets != "dynamic":
            raise HpcdlConfigError(f"process_sets={process_sets!r}: pass a list of rank lists or 'dynamic'")
        return "", True
    parts = []
    for ranks in process_sets:
        ranks = list(ranks)
        if not ranks or not all(isinstance(r, int) and r >= 0 for r in ranks):
            raise HpcdlConfigError(f"process set {ranks!r} must be a non-empty list of world ranks")
        parts.append(",".join(str(r) for r in ranks))
    return ";".join(parts), False


def init(
    process_sets: Union[Sequence[Sequence[int]], str, None] = None,
    members: Optional[Sequence[int]] = None,
    **settings: Any,
) -> None:
    """Start the runtime: find the other ranks, connect, start the engine. A second call is a no-op.

    ``members``: the world ranks of this process's job (Horovod's ``init(comm=[...])``); every rank the
    launcher started still meets the others, then each keeps the ranks of its own list, numbered by their
    position in it. ``settings`` override the environment (e.g. ``timeout=5.0``, ``transport="tcp"``); see
    :mod:`hpcdl.common.config` for the names.
    """
    global _atexit_registered
    with _lock:
        lib = binding.runtime()  # the C hot paths too, from the first collective on
        if lib.hpcdl_is_initialized():
            return
        resolved = config.resolve(settings)
        static_sets, dynamic = _process_sets_option(process_sets)
        extra = {"dynamic_process_sets": True} if dynamic else {}
        if members is not None:
            extra["members"] = ",".join(str(int(r)) for r in members)
        if not elastic.enabled():
            _start(lib, resolved, None, static_sets, extra)
        else:
            _start_elastic(lib, resolved, static_sets, extra)
        last_words.install(lib.hpcdl_rank())
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True


def _start_elastic(lib: Any, resolved: config.Resolved, static_sets: str, extra: dict[str, Any]) -> None:
    """Join the elastic driver's next round; a round that was superseded while this worker met its
    peers (one of them failed or hosts came) is left for the newer one."""
    wait = float(os.environ.get(elastic.TIMEOUT_ENV, "600"))
    while True:
        env = {**os.environ, **elastic.join_next_round(wait)}
        try:
            _start(lib, resolved, env, static_sets, extra)
            return
        except HpcdlError:
            if not elastic.round_changed(force=True):
                raise


def _start(lib: Any, resolved: config.Resolved, env: Any, static_sets: str, extra: dict[str, Any]) -> None:
    info = discovery.discover(env)
    vendor = mpi_library.job_family(resolved.values["mpi"], info.launcher)
    meet = discovery.meeting(info, env, mpi_vendor=vendor)
    options: dict[str, Any] = dict(resolved.values)
    if meet.bootstrap == "mpi" or resolved.values["transport"] == "mpi":
        _, shim = mpi_library.activate(resolved.values["mpi"], info.launcher, env)
        options["mpi_shim"] = str(shim)
    options.update(
        rank=info.rank,
        size=info.size,
        host=info.host,
        bootstrap=meet.bootstrap,
        rendezvous_addr=meet.addr,
        rendezvous_ports=",".join(str(port) for port in meet.ports),
        rendezvous_serve=meet.serve,
        rendezvous_job=meet.job,
        rendezvous_origin=meet.origin,
        secret=meet.secret,
        process_sets=static_sets,
        user_set_knobs=config.user_set_knobs(resolved),
        **extra,
    )
    members = extra.get("members")
    size = len(members.split(",")) if members else info.size
    options.update(stacks.engine_options(_job_rank(info.rank, members), size))
    library.check(lib.hpcdl_init(config.options_text(options).encode()))


def _job_rank(world_rank: int, members: Optional[str]) -> int:
    """This process's rank in its job: its position in ``init(members=...)``'s list, if it has one."""
    listed = [int(r) for r in members.split(",")] if members else []
    return listed.index(world_rank) if world_rank in listed else world_rank


def shutdown() -> None:
    """Stop the engine and release connections and shared memory (safe to call twice)."""
    library.check(library.load().hpcdl_shutdown())


def is_initialized() -> bool:
    return bool(library.load().hpcdl_is_initialized())


def _topology(fn: str) -> int:
    lib = library.load()
    value = getattr(lib, fn)()
    if value < 0:
        raise HpcdlNotInitializedError(library.last_error())
    return int(value)


def rank() -> int:
    return _topology("hpcdl_rank")


def size() -> int:
    return _topology("hpcdl_size")


def local_rank() -> int:
    return _topology("hpcdl_local_rank")


def local_size() -> int:
    return _topology("hpcdl_local_size")


def cross_rank() -> int:
    return _topology("hpcdl_cross_rank")


def cross_size() -> int:
    return _topology("hpcdl_cross_size")


def is_homogeneous() -> bool:
    return bool(_topology("hpcdl_is_homogeneous"))


def mpi_enabled() -> bool:
    """Whether MPI is in use by this job (before init: whether this build has MPI)."""
    return bool(library.load().hpcdl_mpi_enabled())


def mpi_threads_supported() -> bool:
    return bool(_topology("hpcdl_mpi_threads_supported"))


def transport_name(local: bool) -> str:
    """ "shm", "tcp", "mpi" or "self": what reaches peers on this host (local) or on other hosts."""
    name = library.load().hpcdl_transport_name(1 if local else 0)
    if not is_initialized():
        raise HpcdlNotInitializedError(library.last_error())
    return name.decode()


def tcp_congestion() -> str:
    """The congestion control of this rank's TCP connections to its peers, e.g. "cubic" (HPCDL_TCP_CONGESTION
    where the system offers it, else the system's default)."""
    name = library.load().hpcdl_tcp_congestion()
    if not is_initialized():
        raise HpcdlNotInitializedError(library.last_error())
    return name.decode()


# ---- process sets ----------------------------------------------------------------------------------
def add_process_set(ranks: Sequence[int]) -> int:
    """Create a process set of these world ranks (collective: every rank calls it with the same ranks)."""
    ranks = [int(r) for r in ranks]
    arr = (ctypes.c_int32 * len(ranks))(*ranks)
    result = library.load().hpcdl_add_process_set(arr, len(ranks))
    if result < 0:
        library.check(-result)
    return int(result)


def remove_process_set(process_set_id: int) -> None:
    library.check(library.load().hpcdl_remove_process_set(int(process_set_id)))


def _set_query(fn: str, process_set_id: int) -> int:
    """A process set query; -1 is an answer (not a member) unless the runtime reported an error: not
    initialised, or no set with this id."""
    lib = library.load()
    value = getattr(lib, fn)(int(process_set_id))
    message = library.last_error() if value < 0 else ""
    if message:
        raise (HpcdlConfigError if lib.hpcdl_is_initialized() else HpcdlNotInitializedError)(message)
    return int(value)


def process_set_rank(process_set_id: int) -> int:
    """This rank's index in the set (-1 if it is not a member)."""
    return _set_query("hpcdl_process_set_rank", process_set_id)


def process_set_size(process_set_id: int) -> int:
    return _set_query("hpcdl_process_set_size", process_set_id)


def process_set_ranks(process_set_id: int) -> list[int]:
    n = process_set_size(process_set_id)
    buf = (ctypes.c_int32 * max(n, 1))()
    library.load().hpcdl_process_set_ranks(int(process_set_id), buf, n)
    return [int(buf[i]) for i in range(n)]


def process_set_ids() -> list[int]:
    lib = library.load()
    n = lib.hpcdl_process_set_ids(None, 0)
    if n < 0:
        raise HpcdlNotInitializedError(library.last_error())
    buf = (ctypes.c_int32 * max(n, 1))()
    lib.hpcdl_process_set_ids(buf, n)
    return [int(buf[i]) for i in range(n)]
