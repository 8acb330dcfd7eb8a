"""Where the GPU path's batches run: lanes (one CUDA stream each, ``--num-nccl-streams`` of them per device),
their fusion buffers, the events that order them with the callers' streams, and NVTX ranges.

Streams: a caller records an event on its current stream when it submits; the lane's stream waits on it
before touching the tensors (``wait_for_callers``), and the lane records a ``done`` event after the
batch's last kernel, which the caller's stream waits on when it synchronizes. Neither side blocks the
device or the host. On the CPU (gloo standing in for NCCL) a lane has no stream: its work is ordered by
the executor's threads.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Optional, Union

import torch

Marker = Union[int, "torch.cuda.Event"]  # a host time (ns, CLOCK_MONOTONIC) or a timed CUDA event


def caller_event(device: torch.device) -> Optional[torch.cuda.Event]:
    """An event on the caller's current stream of ``device`` (None on the CPU): the point after which the
    executor may read what the caller wrote."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


@dataclass
class Lane:
    """One of the executor's streams on one device, with its pool of fusion buffers: a batch takes one no
    batch in flight uses and gives it back once it is unpacked (on CUDA: once the unpacking is queued on
    the lane's stream, which orders every later use after it)."""

    index: int
    device: torch.device
    stream: Optional[torch.cuda.Stream] = None
    _free: dict[torch.dtype, list[torch.Tensor]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def open(index: int, device: torch.device) -> Lane:
        stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        return Lane(index, device, stream)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Make the lane's stream the current one (kernels and NCCL calls are ordered on it)."""
        if self.stream is None:
            yield
            return
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            yield

    def wait_for_callers(self, events: Sequence[Optional[torch.cuda.Event]]) -> None:
        if self.stream is None:
            return
        for event in dict.fromkeys(e for e in events if e is not None):  # once per event
            self.stream.wait_event(event)

    def use(self, tensors: Sequence[torch.Tensor]) -> None:
        """Tell the caching allocator that the lane's stream uses these caller tensors, so that their memory
        is not handed out again before the lane is done with it, whenever the caller drops them."""
        if self.stream is None:
            return
        for t in tensors:
            t.record_stream(self.stream)

    def fusion_buffer(self, dtype: torch.dtype, count: int) -> torch.Tensor:
        """A buffer of at least ``count`` elements for one batch, until :meth:`release`. Free buffers too
        small for it are dropped (a larger one replaces them), so the pool holds about as many buffers
        as batches run at once, each as large as the largest batch."""
        with self._lock:
            free = self._free.get(dtype, [])
            for i, buffer in enumerate(free):
                if buffer.numel() >= count:
                    return free.pop(i)
            free.clear()
        return torch.empty(max(count, 1), dtype=dtype, device=self.device)

    def release(self, buffers: Sequence[torch.Tensor]) -> None:
        with self._lock:
            for buffer in buffers:
                self._free.setdefault(buffer.dtype, []).append(buffer)

    def mark(self, timed: bool) -> Optional[Marker]:
        """A phase boundary for the timeline: a timed event on the lane's stream, or the host time."""
        if not timed:
            return None
        if self.stream is None:
            return time.monotonic_ns()
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return event

    def done_event(self) -> Optional[torch.cuda.Event]:
        """The point after the batch's last kernel; the completer sleeps on it (blocking sync)."""
        if self.stream is None:
            return None
        event = torch.cuda.Event(blocking=True)
        event.record(self.stream)
        return event


def phase_times(markers: Sequence[Optional[Marker]], ended_ns: int) -> Optional[list[int]]:
    """The batch's phase times (ns, CLOCK_MONOTONIC) from its markers: host times as they are; CUDA events
    placed by their distance to the last one, which ended when the completer saw the batch end."""
    if any(m is None for m in markers):
        return None
    if all(isinstance(m, int) for m in markers):
        return [int(m) for m in markers]  # type: ignore[arg-type]
    last = markers[-1]
    return [ended_ns - round(m.elapsed_time(last) * 1e6) for m in markers]  # type: ignore[union-attr]


class Nvtx:
    """NVTX ranges for Nsight: one per batch the executor runs on CUDA, from its launch to the end the
    completer sees (off with ``HPCDL_DISABLE_NVTX_RANGES=1`` / ``HOROVOD_DISABLE_NVTX_RANGES=1``)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and torch.cuda.is_available()

    def start(self, message: str) -> Optional[int]:
        return torch.cuda.nvtx.range_start(message) if self.enabled else None

    def end(self, range_id: Optional[int]) -> None:
        if range_id is not None:
            torch.cuda.nvtx.range_end(range_id)


def describe_exception(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:2000]
