"""Rank-side programs of ``test_torch_lifecycle.py``: how a job of hpcdl.torch ranks ends when one rank
fails or leaves, and ``hvd.init(comm=...)`` jobs made of a subset of the ranks.

``python torch_lifecycle_checks.py SCENARIO`` runs one scenario on this rank. It prints ``RESULT <json>``
lines (see ``_ranks.result_line``) with wall-clock times, so that the test can measure how long the
others took to notice and how long the launcher took to end the job.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import hpcdl.common as hc
import hpcdl.torch as hvd


def result(**fields: object) -> None:
    print("RESULT " + json.dumps(fields), flush=True)


def train_until_it_fails() -> None:
    """What the surviving ranks do: collectives, as in a training loop, until one raises."""
    try:
        for step in range(1_000_000):
            hvd.allreduce(torch.ones(64), name=f"grad.{step % 8}")
    except hvd.HorovodInternalError as exc:
        result(rank=hvd.rank(), error_at=time.time(), error=type(exc).__name__, message=str(exc))
        raise


def failing_rank(how: str) -> None:
    """Rank 1 fails right after init (its exit runs hvd.shutdown through atexit) while rank 0 computes
    outside hpcdl for a long time and rank 2 already waits in a collective."""
    hvd.init()
    hvd.barrier()
    if hvd.rank() == 0:
        busy_until = time.time() + 60
        while time.time() < busy_until:  # a long forward pass: no hpcdl call
            torch.mm(torch.ones(64, 64), torch.ones(64, 64))
    if hvd.rank() != 1:
        train_until_it_fails()
        return
    time.sleep(0.2)  # rank 2 is inside its first allreduce by now
    result(rank=1, failing_at=time.time())
    if how == "raise":
        raise RuntimeError("a rank fails right after init")
    sys.exit(3)


def leaving_rank() -> None:
    """Rank 1 shuts down while rank 0 computes outside hpcdl: the shutdown returns at once (rank 0's
    engine answers for it), and rank 0's next collective says rank 1 has shut down."""
    hvd.init()
    hvd.barrier()
    if hvd.rank() == 1:
        start = time.time()
        hvd.shutdown()
        result(rank=1, shutdown_seconds=time.time() - start, left_at=time.time())
        return
    busy_until = time.time() + 1.5
    while time.time() < busy_until:  # compute, no hpcdl call
        torch.mm(torch.ones(64, 64), torch.ones(64, 64))
    try:
        hvd.allreduce(torch.ones(4))
    except hc.HpcdlShutdownError as exc:
        result(rank=0, error=str(exc), usable=hvd.is_initialized())
    else:
        raise AssertionError("a collective after a peer shut down must raise")
    try:
        hvd.synchronize(hvd.allreduce_async(torch.ones(4)))
    except hc.HpcdlShutdownError as exc:
        result(rank=0, later_error=str(exc))
    hvd.shutdown()


GROUPS = [[0, 2], [3, 1]]  # two jobs; the second one's rank 0 is world rank 3


def subsets() -> None:
    """Four ranks form two jobs with hvd.init(comm=[...]): each is a complete, independent job."""
    world = hc.discovery.discover().rank
    members = next(g for g in GROUPS if world in g)
    hvd.init(comm=members, process_sets="dynamic")
    rank, size = hvd.rank(), hvd.size()
    assert (rank, size) == (members.index(world), len(members)), (rank, size)
    assert (hvd.local_rank(), hvd.local_size()) == (rank, size)  # one host
    total = hvd.allreduce(torch.tensor([float(world)]), op=hvd.Sum)
    root = hvd.broadcast(torch.tensor([world]), root_rank=1)  # a rank of this job
    gathered = hvd.allgather_object(world)
    alone = hvd.add_process_set([0])  # collective over this job only
    mine = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, process_set=alone) if rank == 0 else None
    hvd.barrier()
    result(
        world=world,
        rank=rank,
        size=size,
        total=total.item(),
        root=int(root.item()),
        gathered=gathered,
        alone=None if mine is None else mine.item(),
    )
    # The first job ends while the second keeps working: a shutdown concerns its own job only.
    if members == GROUPS[0]:
        hvd.shutdown()
        return
    time.sleep(1.0)
    for _ in range(20):
        hvd.allreduce(torch.ones(8))
    result(world=world, still_working=True)
    hvd.shutdown()


def outsider() -> None:
    """A process whose comm list leaves itself out gets a clear error."""
    world = hc.discovery.discover().rank
    try:
        hvd.init(comm=[1 - world])
    except ValueError as exc:
        result(world=world, error=str(exc))
    else:
        hvd.shutdown()
        result(world=world, error=None)


def mpi_split() -> None:
    """Horovod's documented pattern under mpirun: split MPI_COMM_WORLD with mpi4py and pass each part."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD.Get_rank()
    part = MPI.COMM_WORLD.Split(color=0 if world < 2 else 1, key=-world)  # reversed order inside a part
    hvd.init(comm=part)
    total = hvd.allreduce(torch.tensor([float(world)]), op=hvd.Sum)
    result(world=world, rank=hvd.rank(), size=hvd.size(), part_rank=part.Get_rank(), total=total.item())
    hvd.shutdown()


if __name__ == "__main__":
    scenario = sys.argv[1]
    if scenario in ("raise", "exit"):
        failing_rank(scenario)
    else:
        {"leave": leaving_rank, "subsets": subsets, "outsider": outsider, "mpi_split": mpi_split}[scenario]()
