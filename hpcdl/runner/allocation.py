"""Hosts of the batch allocation ``hpcdl run`` is started in, read by the platform whose job it is
(:mod:`hpcdl.platforms`: Slurm, PBS, LSF, Cobalt or Flux).

Slot counts come from the scheduler where it says them (tasks per node, repeated node-file lines);
``--slots-per-host`` overrides them, and where the scheduler says nothing a host gets one slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpcdl import platforms
from hpcdl.platforms.base import Found
from hpcdl.runner.hosts import HostSlots, merge_duplicates


@dataclass(frozen=True)
class Allocation:
    scheduler: str  # the platform's title, e.g. "Slurm"
    source: str  # the variable or command the hosts came from
    hosts: list[HostSlots]

    def describe(self) -> str:
        return f"the {self.scheduler} allocation ({self.source})"


def host_slots(found: Found, override: int | None) -> list[HostSlots]:
    """The hosts of an allocation with their slots (`override`: --slots-per-host), repeated hosts joined."""
    if override is not None:
        return merge_duplicates([HostSlots(name, override) for name in found.names])
    counts = found.counts if found.counts is not None else [1] * len(found.names)
    return merge_duplicates([HostSlots(name, count) for name, count in zip(found.names, counts)])


def detect_allocation(environ: Mapping[str, str], slots_per_host: int | None = None) -> Allocation | None:
    """The allocation's hosts, or None outside a batch job."""
    detected = platforms.detect_allocation(environ)
    if detected is None:
        return None
    platform, found = detected
    return Allocation(platform.title, found.source, host_slots(found, slots_per_host))
