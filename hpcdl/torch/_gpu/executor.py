"""The GPU path's executor: it runs the device batches the engine decided, in the order the engine hands them
over (the same on every rank, so every rank starts its NCCL calls in the same order), and reports each
batch's end so that its handles complete and the timeline records its phases.

Two threads. The launcher takes a batch (``DeviceQueue.next``), finds the operations by their tags, and on
a lane (a CUDA stream and the process groups of that stream) waits for the callers' streams, packs, starts
the collective and, on CUDA, queues what follows it on the stream (after the next batch's packing, which
so overlaps this collective), then records the batch's ``done`` event. It never waits for the device.
The completer takes the started batches in order, waits for each to end (CUDA: sleeps on its ``done``
event; CPU: waits for the work and runs what follows it) and reports it. When the engine fails (a dead
peer seen by its heartbeat, a deadline, a failed batch), ``next`` raises in the launcher, which aborts
the process groups: a collective a dead peer will never join ends, and the GPU is free.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import torch

from hpcdl.common.engine import DeviceBatch, DeviceQueue
from hpcdl.common.exceptions import HpcdlError, HpcdlShutdownError
from hpcdl.common.types import OpType
from hpcdl.torch._gpu.collectives import RUNNERS, DeviceOp, Started
from hpcdl.torch._gpu.groups import Groups
from hpcdl.torch._gpu.lanes import Lane, Marker, Nvtx, describe_exception, phase_times

_POLL_S = 1.0  # how long the launcher waits for a batch before looking whether it must stop
_DRAIN_S = 2.0  # how long stop() lets started batches end before it aborts them


@dataclass
class _InFlight:
    """A batch whose collective started, until the completer reported its end."""

    batch: DeviceBatch
    lane: Lane
    started: Started
    ops: list[DeviceOp]  # this rank's operations in it
    markers: list[Optional[Marker]]  # start and collective begin; then collective end and end
    nvtx_range: Optional[int]
    done: Optional[torch.cuda.Event] = None

    def follow(self) -> None:
        """CUDA: queue on the lane's stream what follows the collective, then the batch's ``done`` event;
        the fusion buffers go back to the lane (whatever uses them next is queued after this)."""
        with self.lane.active():
            self.started.work.wait()  # the lane's stream waits for the collective; the host does not
            self.markers.append(self.lane.mark(self.batch.timed))
            self.started.after()
            self.markers.append(self.lane.mark(self.batch.timed))
            self.done = self.lane.done_event()
        for op in self.ops:
            op.done = self.done
        self.lane.release(self.started.buffers)

    def wait(self) -> Optional[list[int]]:
        """Block until the batch ended (on the CPU: wait for the collective, then run what follows it);
        its phase times when timed."""
        if self.done is not None:
            self.done.synchronize()
            return phase_times(self.markers, time.monotonic_ns())
        self.started.work.wait()
        self.markers.append(self.lane.mark(self.batch.timed))
        self.started.after()
        self.markers.append(self.lane.mark(self.batch.timed))
        self.lane.release(self.started.buffers)
        return phase_times(self.markers, 0)


class Executor:
    """Runs the engine's device batches on ``groups`` until stopped or the engine fails."""

    def __init__(self, groups: Groups, lanes: int, device: torch.device, nvtx: Nvtx) -> None:
        self._groups = groups
        self._lanes_per_device = max(1, lanes)
        self._device = device  # where a rank that joined stands in, until it ran its own tensors
        self._nvtx = nvtx
        self._queue = DeviceQueue()
        self._operations: dict[int, DeviceOp] = {}  # by tag, from submission until its batch starts
        self._tags = itertools.count(1)
        self._lanes: dict[tuple[torch.device, int], Lane] = {}
        self._batches_per_set: Counter[int] = Counter()
        self._running: queue.SimpleQueue[Optional[_InFlight]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._drain_lock = threading.Lock()
        self._drained = False
        self._launcher = threading.Thread(target=self._launch_loop, name="hpcdl-gpu-launcher", daemon=True)
        self._completer = threading.Thread(
            target=self._complete_loop, name="hpcdl-gpu-completer", daemon=True
        )
        self._completer.start()  # first: the launcher may drain it at once (the job already shut down)
        self._launcher.start()

    # ---- the callers' side ------------------------------------------------------------------------

    def register(self, op: DeviceOp) -> int:
        """The tag the operation is submitted with; the executor finds it by that tag in its batch."""
        tag = next(self._tags)
        self._operations[tag] = op
        return tag

    def forget(self, tag: int) -> None:
        """The engine refused the submission: it will never come in a batch."""
        self._operations.pop(tag, None)

    def stop(self) -> None:
        """Stop taking batches, let the started ones end (abort them when they do not) and close the groups.
        Batches the engine decides afterwards fail with its shutdown."""
        self._stopping.set()
        self._queue.interrupt()
        self._launcher.join()
        self._drain()

    def _drain(self) -> None:
        """Let the started batches end and be reported, then close the groups; abort them instead when a
        batch does not end within _DRAIN_S (its peers are gone or stuck)."""
        with self._drain_lock:
            if self._drained:
                return
            self._drained = True
        self._running.put(None)
        self._completer.join(_DRAIN_S)
        if self._completer.is_alive():
            self._groups.abort()
        else:
            self._groups.close()

    # ---- the launcher -----------------------------------------------------------------------------

    def _launch_loop(self) -> None:
        # CUDA: a started batch whose follow-up (unpacking, the done event) waits until the next batch's
        # packing is queued, so that the packing overlaps this batch's collective on the lane's stream.
        following: Optional[_InFlight] = None
        try:
            while not self._stopping.is_set():
                try:
                    batch = self._queue.next(0.0 if following is not None else _POLL_S)
                except HpcdlError as exc:  # the engine failed or the job shut down
                    if following is not None:
                        self._follow(following)  # before a drain, which ends the completer's queue
                        following = None
                    self._engine_stopped(exc)
                    return
                started = self._launch(batch) if batch is not None else None
                if following is not None:
                    self._follow(following)
                    following = None
                if started is not None and started.lane.stream is not None:
                    following = started
                elif started is not None:
                    self._running.put(started)
        finally:
            if following is not None:
                self._follow(following)

    def _engine_stopped(self, exc: HpcdlError) -> None:
        """The engine hands out no more batches. When the job shut down, the batches started here still
        end (every rank let its own end before leaving): let them, abort only what does not. Any other
        failure has failed them already: abort at once, so that a collective waiting for a dead peer
        ends and the GPU is free."""
        if self._stopping.is_set():
            return
        if isinstance(exc, HpcdlShutdownError):
            self._drain()
        else:
            self._groups.abort()

    def _launch(self, batch: DeviceBatch) -> Optional[_InFlight]:
        """Start the batch's collective (None when that failed: the batch is reported failed)."""
        nvtx_range = None
        try:
            ops = [self._operations.pop(tag) if tag else None for tag in batch.tags]
            present = [op for op in ops if op is not None]
            if present:
                self._device = present[0].input.device
            lane_index = self._batches_per_set[batch.process_set] % self._lanes_per_device
            self._batches_per_set[batch.process_set] += 1
            lane = self._lane(self._device, lane_index)
            group = self._groups.get(batch.process_set, lane_index)
            nvtx_range = self._nvtx.start(_label(batch))
            with lane.active():
                lane.wait_for_callers([op.ready for op in present])
                start = lane.mark(batch.timed)  # QUEUE ends once the callers' streams reached it
                started = RUNNERS[batch.op_type](batch, ops, lane, group)
        except Exception as exc:  # a bad batch or a failed launch: fail it (and with it the engine)
            self._nvtx.end(nvtx_range)
            self._report(batch, error=describe_exception(exc))
            return None
        return _InFlight(batch, lane, started, present, [start, started.begin], nvtx_range)

    def _follow(self, inflight: _InFlight) -> None:
        try:
            inflight.follow()
        except Exception as exc:
            self._nvtx.end(inflight.nvtx_range)
            self._report(inflight.batch, error=describe_exception(exc))
            return
        self._running.put(inflight)

    def _lane(self, device: torch.device, index: int) -> Lane:
        lane = self._lanes.get((device, index))
        if lane is None:
            lane = self._lanes[(device, index)] = Lane.open(index, device)
        return lane

    # ---- the completer ----------------------------------------------------------------------------

    def _complete_loop(self) -> None:
        while True:
            inflight = self._running.get()
            if inflight is None:
                return
            try:
                times = inflight.wait()
            except Exception as exc:  # the collective failed (a peer lost, an abort)
                self._report(inflight.batch, error=describe_exception(exc))
            else:
                self._report(inflight.batch, times=times)
            finally:
                self._nvtx.end(inflight.nvtx_range)

    def _report(
        self, batch: DeviceBatch, error: Optional[str] = None, times: Optional[Sequence[int]] = None
    ) -> None:
        # The engine may be gone (shut down meanwhile): then nobody waits for this batch any more.
        with contextlib.suppress(HpcdlError):
            DeviceQueue.done(batch, error=error, times_ns=times)


def _label(batch: DeviceBatch) -> str:
    """The NVTX range of a batch, as Nsight shows it."""
    what = batch.op_type.name if batch.op_type != OpType.ALLREDUCE or not batch.fused else "FUSED_ALLREDUCE"
    return f"hpcdl {what} ({len(batch.tags)} tensor{'s' if len(batch.tags) != 1 else ''})"
