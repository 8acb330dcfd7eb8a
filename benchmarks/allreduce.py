"""Allreduce benchmark: hpcdl's direct allreduce against torch.distributed (gloo) and mpi4py (Open MPI).

Run it as ``hpcdl bench allreduce -np 2`` or ``python benchmarks/allreduce.py -np 2``: it launches itself on
N ranks with ``hpcdl run --mpi`` through Open MPI's mpirun (so mpi4py runs in the same job; without
mpirun.openmpi or mpi4py only hpcdl and gloo are measured) and measures every implementation on the same
float32 buffers, in place, sizes 4 B to 256 MiB. Timed blocks of the implementations are interleaved and
the best of ``--repeats`` is kept for each, so that a busy machine penalises every implementation alike.
Per size it prints time, algorithm bandwidth and bus bandwidth (nccl-tests: busbw = bytes * 2(n-1)/n /
time) of each implementation and the ratio of each peer's time to hpcdl's, and the single-core memcpy
bandwidth of this machine as the ceiling. ``--json`` prints one record per implementation and size
(impl, ranks, bytes, time_s, busbw_gbs). Benchmarks measure; they do not assert.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import numpy as np

from hpcdl.common.exceptions import HpcdlError
from hpcdl.common.sizes import parse_size

try:
    from ._launch import (
        NO_PROGRESS_HELP,
        OPENMPI,
        OPENMPI_ACROSS_HOSTS,
        broadcast_text,
        free_port,
        report_progress,
        run_ranks,
        slots_per_host,
    )
    from ._tcp_ceiling import TcpCeiling, peer_of
except ImportError:  # run as a script: python benchmarks/allreduce.py
    from _launch import (  # type: ignore[no-redef]
        NO_PROGRESS_HELP,
        OPENMPI,
        OPENMPI_ACROSS_HOSTS,
        broadcast_text,
        free_port,
        report_progress,
        run_ranks,
        slots_per_host,
    )
    from _tcp_ceiling import TcpCeiling, peer_of  # type: ignore[no-redef]

DEFAULT_SIZES = [4 * 4**k for k in range(14)]  # 4 B .. 256 MiB


@dataclass
class Record:
    impl: str
    ranks: int
    bytes: int
    time_s: float
    busbw_gbs: float
    algbw_gbs: float


def bus_bandwidth(nbytes: int, ranks: int, seconds: float) -> float:
    return nbytes * 2 * (ranks - 1) / ranks / seconds / 1e9 if ranks > 1 else 0.0


def memcpy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Single-core memcpy bandwidth in GB/s (bytes copied per second), best of `repeats`."""
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def iterations(probe_seconds: float, budget_seconds: float = 0.2) -> int:
    """Iterations of one timed block: about `budget_seconds` of work, at least 3, at most 5000."""
    return int(max(3, min(5000, budget_seconds / max(probe_seconds, 1e-7))))


# ---- worker: runs on every rank --------------------------------------------------------------------
# hpcdl configurations a job can compare (each in its own init of the runtime, taking turns in one job).
VARIANTS: dict[str, dict[str, object]] = {
    "hpcdl": {},  # as a user gets it: hierarchical or flat chosen by the runtime
    "hpcdl-flat": {"hierarchical_allreduce": False},  # one TCP ring over every rank
    "hpcdl-hier": {"hierarchical_allreduce": True},  # shared memory within hosts, TCP between them
}
CEILING_BYTES = 64 << 20
CEILING_STREAMS = (1, 2, 4)


def _peers(rank: int, size: int, spans_hosts: bool) -> dict[str, Callable[[np.ndarray], Callable[[], None]]]:
    """gloo and mpi4py where available, on the same ranks."""
    import hpcdl.common as hc

    impls: dict[str, Callable[[np.ndarray], Callable[[], None]]] = {}
    try:
        import torch
        import torch.distributed as dist

        port = np.array([free_port() if rank == 0 else 0], dtype=np.int64)
        hc.broadcast(port, root=0)
        local = os.environ.get("HPCDL_RENDEZVOUS_ADDR", "127.0.0.1")
        addr = broadcast_text(socket.gethostname() if spans_hosts else local)
        dist.init_process_group(
            "gloo", init_method=f"tcp://{addr}:{int(port[0])}", rank=rank, world_size=size
        )
        impls["gloo"] = lambda a: (lambda t: lambda: dist.all_reduce(t))(torch.from_numpy(a))
    except ImportError:
        pass
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        try:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
            impls["mpi4py"] = lambda a: lambda: comm.Allreduce(MPI.IN_PLACE, a)
        except ImportError:
            pass
    return impls


ENGINE_TENSORS = 16


def _engine_step(a: np.ndarray) -> Callable[[], None]:
    """The buffer as ENGINE_TENSORS tensors through hpcdl.torch (Horovod's allreduce_async_ and synchronize,
    as DistributedOptimizer reduces gradients): the engine negotiates them and fuses them into one
    allreduce. Next to ``hpcdl`` (the direct call on the whole buffer) it shows what the engine costs."""
    import torch

    import hpcdl.torch as hvd

    parts = list(torch.from_numpy(a).chunk(ENGINE_TENSORS))
    names = [f"bench.{a.nbytes}.{i}" for i in range(len(parts))]

    def step() -> None:
        handles = [hvd.allreduce_async_(p, name=n, op=hvd.Sum) for p, n in zip(parts, names)]
        for handle in handles:
            hvd.synchronize(handle)

    return step


def _ceiling(rank: int, hosts: list[str]) -> Optional[TcpCeiling]:
    """The TCP probe between rank 0 and the first rank on another host, or None on one host."""
    import hpcdl.common as hc

    peer = peer_of(hosts)
    if peer is None:
        return None
    congestion = hc.tcp_congestion()
    listener, port = TcpCeiling.listen(congestion) if rank == 0 else (None, 0)
    where = broadcast_text(f"{socket.gethostname()} {port}").split()
    return TcpCeiling(
        rank, peer, where[0], int(where[1]), listener, congestion, max(CEILING_STREAMS), CEILING_BYTES,
        lambda a: hc.broadcast(a, root=0), hc.barrier,
    )  # fmt: skip


def _host_names() -> list[str]:
    """Every rank's host name, by rank."""
    import hpcdl.common as hc

    mine = np.zeros(64, dtype=np.uint8)
    name = socket.gethostname().encode()[:63]
    mine[: len(name)] = np.frombuffer(name, dtype=np.uint8)
    return [bytes(row).rstrip(b"\0").decode() for row in hc.allgather(mine.reshape(1, 64))]


def _measure_ceiling(probe: TcpCeiling, best: dict[tuple[str, int], float]) -> None:
    """One round of the TCP probes; keeps the best time of each in `best`."""
    times = {f"tcp-{k}-stream{'s' if k > 1 else ''}": probe.one_way(k) for k in CEILING_STREAMS}
    times["tcp-both-ways"] = probe.both_ways()
    for name, seconds in times.items():
        key = (name, probe.nbytes)
        best[key] = min(best.get(key, float("inf")), seconds)
    key = ("tcp-round-trip", 1)
    best[key] = min(best.get(key, float("inf")), probe.round_trip())


def _block(step: Callable[[], None], count: int) -> float:
    """Seconds per call over a block of `count` calls: the slowest rank's (the collective's time)."""
    import hpcdl.common as hc

    hc.barrier()
    start = time.perf_counter()
    for _ in range(count):
        step()
    seconds = (time.perf_counter() - start) / count
    return float(hc.allreduce(np.array([seconds]), op=hc.ReduceOp.MAX)[0])


def _calibrate(step: Callable[[], None]) -> int:
    """Calls per timed block (rank 0 sizes the blocks; every rank runs the same count)."""
    import hpcdl.common as hc

    step()
    start = time.perf_counter()
    for _ in range(3):
        step()
    count = np.array([iterations((time.perf_counter() - start) / 3)], dtype=np.int64)
    return int(hc.broadcast(count, root=0)[0])


def worker(sizes: list[int], repeats: int, variants: list[str]) -> None:
    """Rounds of blocks: in each round every hpcdl variant (a runtime of its own, started anew for its turn)
    and, in the first variant's turn, the peers and the TCP probe measure every size once. The best block
    of each (implementation, size) over the rounds is kept."""
    import hpcdl.common as hc

    hc.init(**VARIANTS[variants[0]])
    rank, size = hc.rank(), hc.size()
    hosts = _host_names()
    spans = len(set(hosts)) > 1
    peers = _peers(rank, size, spans)
    probe = _ceiling(rank, hosts)
    best: dict[tuple[str, int], float] = {}
    counts: dict[tuple[str, int], int] = {}
    current = variants[0]
    done, total = 0, repeats * len(variants) * len(sizes)
    for _ in range(repeats):
        for variant in variants:
            if variant != current:
                hc.shutdown()
                hc.init(**VARIANTS[variant])
                current = variant
            impls = {variant: lambda a: lambda: hc.allreduce(a, out=a)}
            if variant == variants[0]:
                if "gloo" in peers:  # torch is there
                    impls["hpcdl.torch"] = _engine_step
                impls.update(peers)
            for nbytes in sizes:
                buffer = np.ones(max(nbytes // 4, 1), dtype=np.float32)
                for name, make in impls.items():
                    step = make(buffer)
                    if (name, nbytes) not in counts:
                        counts[(name, nbytes)] = _calibrate(step)
                    seconds = _block(step, counts[(name, nbytes)])
                    best[(name, nbytes)] = min(best.get((name, nbytes), float("inf")), seconds)
                done += 1
                if rank == 0:
                    report_progress(done, total)
            if probe is not None and variant == variants[0]:
                _measure_ceiling(probe, best)
    if rank == 0:
        for (name, nbytes), seconds in best.items():
            tcp = name.startswith("tcp-")  # the probe: two ranks, one way
            busbw = nbytes / seconds / 1e9 if tcp else bus_bandwidth(nbytes, size, seconds)
            record = Record(name, 2 if tcp else size, nbytes, seconds, busbw, nbytes / seconds / 1e9)
            print("RECORD " + json.dumps(asdict(record)), flush=True)
    if probe is not None:
        probe.close()
    if "gloo" in peers:
        import torch.distributed as dist

        dist.destroy_process_group()
    hc.shutdown()


# ---- launcher ----------------------------------------------------------------------------------------
def _human(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _time_text(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-2 else f"{seconds * 1e3:.2f} ms"


def table(records: list[Record], memcpy_gbs: float) -> str:
    """Per size: each implementation's time and bandwidths, then each one's time over hpcdl's."""
    impls = [i for i in dict.fromkeys(r.impl for r in records) if not i.startswith("tcp-")]
    ranks = next((r.ranks for r in records if r.impl == "hpcdl"), 0)
    by_key = {(r.impl, r.bytes): r for r in records}
    head = f"{'size':>9}"
    for impl in impls:
        head += f" | {impl + ' time':>15} {'algbw':>7} {'busbw':>7}"
    for impl in impls[1:]:
        head += f" | {impl + '/hpcdl':>15}"
    lines = [
        f"allreduce, float32 in place, {ranks} ranks; GB/s; single-core memcpy ceiling {memcpy_gbs:.2f} GB/s",
        *ceiling_lines(records),
        head,
        "-" * len(head),
    ]
    for nbytes in sorted({r.bytes for r in records if r.impl in impls}):
        line = f"{_human(nbytes):>9}"
        for impl in impls:
            r = by_key.get((impl, nbytes))
            t = _time_text(r.time_s) if r else "-"
            line += f" | {t:>15} {r.algbw_gbs if r else 0:7.2f} {r.busbw_gbs if r else 0:7.2f}"
        base = by_key.get(("hpcdl", nbytes))
        for impl in impls[1:]:
            r = by_key.get((impl, nbytes))
            line += f" | {r.time_s / base.time_s:14.2f}x" if r and base else f" | {'-':>15}"
        lines.append(line)
    lines += against_ceiling(records)
    return "\n".join(lines)


def ceiling_lines(records: list[Record]) -> list[str]:
    """What plain TCP carried between the first two hosts in the same job (none on one host)."""
    tcp = {r.impl: r for r in records if r.impl.startswith("tcp-")}
    if not tcp:
        return []
    streams = sorted((r for r in tcp.values() if r.impl.endswith(("-stream", "-streams"))),
                     key=lambda r: int(r.impl.split("-")[1]))  # fmt: skip
    one_way = ", ".join(f"{r.impl.split('-')[1]}: {r.algbw_gbs:.2f}" for r in streams)
    both = tcp.get("tcp-both-ways")
    trip = tcp.get("tcp-round-trip")
    nbytes = streams[0].bytes if streams else 0
    return [
        f"TCP ceiling between the first two hosts ({_human(nbytes)}, best of the rounds): one way over "
        f"N streams (N: GB/s) {one_way}"
        + (f"; both ways at once {both.algbw_gbs:.2f} GB/s each way" if both else "")
        + (f"; round trip of 1 byte {trip.time_s * 1e6:.1f} us" if trip else "")
    ]


def against_ceiling(records: list[Record]) -> list[str]:
    """hpcdl's busbw at 64 MiB and above as a share of one TCP stream, and its smallest time in round
    trips (only when the job measured the ceiling)."""
    by_key = {(r.impl, r.bytes): r for r in records}
    one = by_key.get(("tcp-1-stream", CEILING_BYTES))
    trip = by_key.get(("tcp-round-trip", 1))
    if one is None or trip is None:
        return []
    lines = []
    for impl in [i for i in dict.fromkeys(r.impl for r in records) if i.startswith("hpcdl")]:
        mine = sorted((r for r in records if r.impl == impl), key=lambda r: r.bytes)
        big = [
            f"{_human(r.bytes)} {100 * r.busbw_gbs / one.algbw_gbs:.0f} %"
            for r in mine
            if r.bytes >= 64 << 20
        ]
        if mine:
            lines.append(
                f"{impl}: busbw / one TCP stream: {', '.join(big) or '-'}; "
                f"{_human(mine[0].bytes)} in {mine[0].time_s / trip.time_s:.2f} round trips"
            )
    return lines


def launch(
    ranks: int,
    sizes: list[int],
    use_mpi: bool,
    repeats: int,
    variants: list[str],
    hosts: Optional[str] = None,
    mpi_args: str = "",
    no_progress: bool = False,
) -> list[Record]:
    args = ["--worker", "--sizes", ",".join(map(str, sizes)), "--repeats", str(repeats)]
    args += ["--variants", ",".join(variants)]
    texts = run_ranks(__file__, ranks, args, "RECORD", use_mpi, no_progress, hosts=hosts, mpi_args=mpi_args)
    return [Record(**json.loads(text)) for text in texts]


def _default_variants(per_host: list[int]) -> list[str]:
    """hpcdl as a user gets it; across hosts with several ranks on a host also each path forced."""
    if any(slots > 1 for slots in per_host):
        return ["hpcdl", "hpcdl-flat", "hpcdl-hier"]
    return ["hpcdl"]


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="hpcdl bench allreduce", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-np", "--num-proc", type=int, help="number of ranks (default 2, or every slot of --hosts)"
    )
    parser.add_argument(
        "--hosts",
        help="run across these hosts (hpcdl run -H syntax: host1:1,host2:1) and measure TCP between them",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        help="comma list of message sizes, e.g. 4,64KiB,1M (default 4 B .. 256 MiB, x4)",
    )
    parser.add_argument("--max-bytes", type=_size, help="drop sizes above this, e.g. 1G")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed blocks per size and implementation; the best is kept"
    )
    parser.add_argument(
        "--variants",
        help=f"hpcdl configurations to compare in the same job, of {', '.join(VARIANTS)} (default: hpcdl; "
        "with several ranks on a host of --hosts, all three)",
    )
    parser.add_argument(
        "--mpi-args",
        default=None,
        help=f"extra mpirun.openmpi arguments (default with --hosts: {' '.join(OPENMPI_ACROSS_HOSTS)})",
    )
    parser.add_argument("--no-mpi", action="store_true", help="launch with hpcdl run only (no mpi4py)")
    parser.add_argument("--json", action="store_true", help="print JSON records instead of the table")
    parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = args.sizes or DEFAULT_SIZES
    if args.max_bytes:
        sizes = [s for s in sizes if s <= args.max_bytes]
    per_host = slots_per_host(parser, args.hosts)
    variants = args.variants.split(",") if args.variants else _default_variants(per_host)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if args.worker:
        worker(sizes, args.repeats, variants)
        return
    ranks = args.num_proc if args.num_proc is not None else sum(per_host) or 2
    if ranks < 1:
        parser.error("-np must be at least 1")
    use_mpi = not args.no_mpi and shutil.which(OPENMPI) is not None and _has_mpi4py()
    mpi_args = (
        args.mpi_args if args.mpi_args is not None else " ".join(OPENMPI_ACROSS_HOSTS) if args.hosts else ""
    )
    records = launch(ranks, sizes, use_mpi, args.repeats, variants, args.hosts, mpi_args, args.no_progress)
    ceiling = memcpy_bandwidth()
    if args.json:
        memcpy = Record("memcpy", 1, 256 << 20, (256 << 20) / ceiling / 1e9, ceiling, ceiling)
        for r in [memcpy, *records]:
            print(json.dumps(asdict(r)))
    else:
        print(table(records, ceiling))
        if args.no_mpi:
            print("(mpi4py not measured: --no-mpi)")
        elif not use_mpi:
            print("(mpi4py not measured: needs mpirun.openmpi and mpi4py built against Open MPI)")


def _size(text: str) -> int:
    """An argparse type: bytes of a size such as 64KiB or 1M (argparse says what is allowed otherwise)."""
    try:
        return parse_size(text)
    except HpcdlError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sizes(text: str) -> list[int]:
    return [_size(item) for item in text.split(",")]


def _has_mpi4py() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
