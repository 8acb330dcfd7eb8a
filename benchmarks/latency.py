"""Latency benchmark: allreduce through the Horovod API, the engine and the runtime, against Open MPI.

Run it as ``hpcdl bench latency -np 2`` or ``python benchmarks/latency.py -np 2``: it launches itself on N
ranks with ``hpcdl run --mpi`` through Open MPI's mpirun (without mpirun.openmpi or mpi4py, Open MPI is not
measured) and times, in the same processes and on the same float32 values, for sizes 4 B to 256 MiB:

- ``mpi4py``: ``comm.Allreduce(MPI.IN_PLACE, a)`` (Open MPI, in place);
- ``runtime``: ``hpcdl.common.allreduce(a, out=a)``, the runtime's own blocking call (no engine);
- ``engine``: ``hpcdl.common.engine.allreduce_async(a, name=..., out=a)``, ``wait()``, ``release()``;
- ``hvd.allreduce``: ``hpcdl.torch.allreduce(t, name=...)`` (out of place, as Horovod users call it);
- ``hvd.allreduce_``: ``hpcdl.torch.allreduce_(t, name=...)`` (in place);
- ``hvd unnamed``: ``hpcdl.torch.allreduce(t)`` with no name, so a name the ranks have not used before every
  call (``allreduce.noname.<n>``), as scripts that average a metric often call it;
- ``horovod``: with ``--horovod``, ``horovod.torch.allreduce(t, name=...)``, Horovod itself initialised in the
  same processes (its MPI controller under mpirun; its background thread runs beside every column).

Each size runs ``--rounds`` rounds; a round times one block of calls of every implementation, in an order
shuffled anew each round (the same on every rank), each block after a barrier. A block's time per call is
the slowest rank's. The table gives each implementation's median over the rounds; each ratio is the median
of the two implementations' paired per-round ratios, so that a machine whose speed changes from one second
to the next penalises both alike. ``--busy`` starts a process beside every rank that keeps a core busy
(what a data loader's worker or another library's background thread does), to measure how the waits behave
when the ranks share their cores. ``--json`` prints the report as JSON.
Benchmarks measure; they do not assert.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from typing import Callable, Optional

import numpy as np

OPENMPI = "/usr/bin/mpirun.openmpi"

DEFAULT_SIZES = [4 * 4**k for k in range(14)]  # 4 B .. 256 MiB
IMPLS = ("mpi4py", "runtime", "engine", "hvd.allreduce", "hvd.allreduce_", "hvd unnamed", "horovod")
# (numerator, denominator, label): ratios of paired per-round times.
RATIOS = (
    ("hvd.allreduce", "runtime", "hvd.allreduce / runtime"),
    ("engine", "runtime", "engine / runtime"),
    ("hvd unnamed", "hvd.allreduce", "hvd unnamed / named"),
    ("mpi4py", "hvd.allreduce", "mpi4py / hvd.allreduce"),
    ("mpi4py", "hvd.allreduce_", "mpi4py / hvd.allreduce_"),
    ("horovod", "hvd.allreduce", "horovod / hvd.allreduce"),
)


def calls_per_block(probe_seconds: float, budget_seconds: float) -> int:
    """Calls of one timed block: about `budget_seconds` of work, at least 3, at most 20000."""
    return int(max(3, min(20000, budget_seconds / max(probe_seconds, 1e-7))))


def block_count(call: Callable[[], None], warmup: int, probes: int, budget_seconds: float) -> int:
    """Calls of one timed block of `call`: rank 0 times `probes` calls after `warmup` untimed ones and
    every rank runs the count it broadcasts (a collective: every rank calls this in the same order)."""
    import hpcdl.common as hc

    for _ in range(warmup):
        call()
    start = time.perf_counter()
    for _ in range(probes):
        call()
    probe = np.array([calls_per_block((time.perf_counter() - start) / probes, budget_seconds)], np.int64)
    return int(hc.broadcast(probe, root=0)[0])


def busy_process() -> subprocess.Popen:
    """A process that keeps one core busy beside this rank, as a data loader's worker or another library's
    background thread does; it holds no lock of this process (a thread of this process would also compete
    for the GIL, which measures Python, not the waits)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


# ---- worker: runs on every rank --------------------------------------------------------------------
def _impls(nbytes: int, horovod: bool) -> dict[str, Callable[[], None]]:
    import hpcdl.common as hc
    from hpcdl.common import engine

    a = np.zeros(max(nbytes // 4, 1), dtype=np.float32)  # zeros stay zeros under a sum
    impls: dict[str, Callable[[], None]] = {}
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        try:
            from mpi4py import MPI

            impls["mpi4py"] = lambda: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a)
        except ImportError:
            pass
    impls["runtime"] = lambda: hc.allreduce(a, out=a)

    def via_engine() -> None:
        handle = engine.allreduce_async(a, name=f"lat.engine.{nbytes}", op=hc.ReduceOp.SUM, out=a)
        handle.wait()
        handle.release()

    impls["engine"] = via_engine
    try:
        import torch

        import hpcdl.torch as hvd

        t = torch.from_numpy(a)
        impls["hvd.allreduce"] = lambda: hvd.allreduce(t, name=f"lat.hvd.{nbytes}", op=hvd.Sum)
        impls["hvd.allreduce_"] = lambda: hvd.allreduce_(t, name=f"lat.hvd_.{nbytes}", op=hvd.Sum)
        impls["hvd unnamed"] = lambda: hvd.allreduce(t, op=hvd.Sum)
    except ImportError:
        pass
    if horovod:
        import horovod.torch as real_hvd

        ht = torch.from_numpy(a.copy())
        impls["horovod"] = lambda: real_hvd.allreduce(ht, name=f"lat.horovod.{nbytes}", op=real_hvd.Sum)
    return impls


def timed_rounds(
    calls: dict[str, Callable[[], object]], counts: dict[str, int], rounds: int, salt: int
) -> dict[str, list[float]]:
    """Each call's time per call in each round: a round times one block of every call, in an order shuffled
    anew (the same on every rank), each block after a barrier; a block's time is the slowest rank's."""
    import hpcdl.common as hc

    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(rounds):
        order = list(calls)
        random.Random(round_ * 7919 + salt).shuffle(order)
        for name in order:
            hc.barrier()
            start = time.perf_counter()
            for _ in range(counts[name]):
                calls[name]()
            seconds = (time.perf_counter() - start) / counts[name]
            times[name].append(float(hc.allreduce(np.array([seconds]), op=hc.ReduceOp.MAX)[0]))
    return times


def worker(sizes: list[int], rounds: int, budget: float, busy: bool, horovod: bool) -> None:
    import hpcdl.common as hc

    try:
        import hpcdl.torch as hvd

        hvd.init()
    except ImportError:
        hc.init()
    if horovod:
        import horovod.torch as real_hvd

        real_hvd.init()
    rank = hc.rank()
    spinner = busy_process() if busy else None
    # Which hpcdl the ranks measure: an editable install's import hook can win over PYTHONPATH.
    report: dict = {"sizes": {}, "hpcdl": os.path.dirname(os.path.abspath(hc.__file__))}
    for done, nbytes in enumerate(sizes):
        impls = _impls(nbytes, horovod)
        warmup = 20 if nbytes < 1 << 20 else 2
        counts = {name: block_count(call, warmup, 5, budget) for name, call in impls.items()}
        report["sizes"][nbytes] = timed_rounds(impls, counts, rounds, nbytes)
        if rank == 0:
            print(f"PROGRESS {done + 1} {len(sizes)}", flush=True)  # as _launch.report_progress does
    if spinner is not None:
        spinner.kill()
        spinner.wait()
    if rank == 0:
        print("REPORT " + json.dumps(report), flush=True)
    if horovod:
        real_hvd.shutdown()
    hc.shutdown()


# ---- launcher ----------------------------------------------------------------------------------------
def _human(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-2 else f"{seconds * 1e3:.2f} ms"


def summarize(report: dict) -> dict:
    """Medians per implementation and size, and the paired ratios."""
    out = {}
    for nbytes, times in report["sizes"].items():
        row: dict = {"median_s": {name: statistics.median(t) for name, t in times.items()}}
        for num, den, label in RATIOS:
            if num in times and den in times:
                row[label] = statistics.median(a / b for a, b in zip(times[num], times[den]))
        out[int(nbytes)] = row
    return out


def table(summary: dict, header: str) -> str:
    impls = [i for i in IMPLS if any(i in row["median_s"] for row in summary.values())]
    ratios = [label for _, _, label in RATIOS if any(label in row for row in summary.values())]
    head = f"{'size':>9}" + "".join(f" | {i:>14}" for i in impls) + "".join(f" | {r:>23}" for r in ratios)
    lines = [header, head, "-" * len(head)]
    for nbytes in sorted(summary):
        row = summary[nbytes]
        line = f"{_human(nbytes):>9}"
        line += "".join(f" | {_time(row['median_s'][i]) if i in row['median_s'] else '-':>14}" for i in impls)
        line += "".join(f" | {row[r]:22.2f}x" if r in row else f" | {'-':>23}" for r in ratios)
        lines.append(line)
    return "\n".join(lines)


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="hpcdl bench latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", "--num-proc", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--sizes", help="comma list of message sizes in bytes (default 4 B .. 256 MiB, x4)")
    parser.add_argument("--max-bytes", type=int, help="drop sizes above this many bytes")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per size (default 7)")
    parser.add_argument("--block-seconds", type=float, default=0.05, help="length of one timed block")
    parser.add_argument("--busy", action="store_true", help="a busy process beside every rank (contention)")
    parser.add_argument("--no-mpi", action="store_true", help="launch with hpcdl run only (no mpi4py)")
    parser.add_argument(
        "--horovod",
        action="store_true",
        help="also time horovod.torch.allreduce, Horovod initialised in the same processes (needs horovod "
        "importable by the ranks, e.g. through PYTHONPATH)",
    )
    parser.add_argument(
        "--pythonpath",
        help="the ranks import hpcdl from this directory (another build, installed with pip --target), to "
        "measure it beside this one",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on a terminal")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    if args.max_bytes:
        sizes = [s for s in sizes if s <= args.max_bytes]
    if args.worker:
        worker(sizes, args.rounds, args.block_seconds, args.busy, args.horovod)
        return
    if args.horovod and importlib.util.find_spec("horovod") is None:
        sys.exit("--horovod: horovod is not importable here (install it, or put its directory on PYTHONPATH)")
    # The ranks import only hpcdl (another build's, with --pythonpath); the launcher's helpers only here.
    try:
        from ._launch import run_ranks
    except ImportError:  # run as a script: python benchmarks/latency.py
        from _launch import run_ranks  # type: ignore[no-redef]
    use_mpi = not args.no_mpi and shutil.which(OPENMPI) is not None and _has_mpi4py()
    if args.pythonpath:
        os.environ["PYTHONPATH"] = args.pythonpath  # the launcher and its ranks, not this process
    load_before = os.getloadavg()[0]
    worker_args = ["--worker", "--sizes", ",".join(map(str, sizes)), "--rounds", str(args.rounds)]
    worker_args += ["--block-seconds", str(args.block_seconds)] + (["--busy"] if args.busy else [])
    worker_args += ["--horovod"] if args.horovod else []
    (text,) = run_ranks(__file__, args.num_proc, worker_args, "REPORT", use_mpi, args.no_progress)[:1]
    report = json.loads(text)
    measured = measured_build(report["hpcdl"], args.pythonpath)
    summary = summarize(report)
    load_after = os.getloadavg()[0]
    busy = ", a busy process beside each rank" if args.busy else ""
    header = (
        f"allreduce latency, float32, {args.num_proc} ranks{busy}; "
        f"hpcdl from {measured}{'' if args.pythonpath else ' (commit ' + _commit() + ')'}; "
        f"load average {load_before:.2f} before, {load_after:.2f} after"
    )
    if args.json:
        print(json.dumps({"header": header, "sizes": summary}, indent=1))
    else:
        print(table(summary, header))
        if not use_mpi:
            print("(mpi4py not measured: needs mpirun.openmpi and mpi4py built against Open MPI)")


def measured_build(imported: str, pythonpath: Optional[str]) -> str:
    """Where the ranks' hpcdl came from (the directory above the package they reported importing); exits
    when ``--pythonpath`` named another, since then the benchmark measured the wrong build."""
    measured = os.path.dirname(imported)
    wanted = [os.path.abspath(d) for d in (pythonpath or "").split(os.pathsep) if d]
    if wanted and not any(measured.startswith(d + os.sep) for d in wanted):
        sys.exit(
            f"the ranks imported hpcdl from {measured}, not from {pythonpath}: an editable install's "
            "import hook wins over PYTHONPATH; measure from an environment without it (or both builds "
            "installed with pip --target)"
        )
    return measured


def _has_mpi4py() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
