"""The scheduler backends by name, read from the platform registry (:mod:`hpcdl.platforms`: a platform
with a batch-script backend names it), and which one this machine has."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from hpcdl import platforms
from hpcdl.schedulers.base import Scheduler
from hpcdl.schedulers.errors import SchedulerError


def backend(name: str) -> type[Scheduler]:
    """The backend class of the platform called `name` (imported on first use)."""
    module, _, attribute = platforms.get(name).scheduler.partition(":")
    cls = getattr(importlib.import_module(module), attribute)
    if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
        raise TypeError(f"platform {name!r} names {module}:{attribute}, which is no Scheduler")
    return cls


class _Backends(Mapping[str, type[Scheduler]]):
    """Every registered scheduler backend by name, as the registry holds them now."""

    def __getitem__(self, name: str) -> type[Scheduler]:
        if name not in platforms.scheduler_names():
            raise KeyError(name)
        return backend(name)

    def __iter__(self) -> Iterator[str]:
        return iter(platforms.scheduler_names())

    def __len__(self) -> int:
        return len(platforms.scheduler_names())


SCHEDULERS: Mapping[str, type[Scheduler]] = _Backends()


def detect_scheduler() -> str:
    """The scheduler to submit to here; a SchedulerError naming what was looked for when none is found."""
    found = [p for p in platforms.by_priority() if p.scheduler]
    backends = [backend(p.name) for p in found]
    chosen = next((b for b in backends if b.claims()), None) or next(
        (b for b in backends if b.detect()), None
    )
    if chosen is not None:
        return chosen.name
    raise SchedulerError(
        f"no batch scheduler found on PATH (looked for {', '.join(p.submit_program for p in found)}); "
        f"load the scheduler's module, or name one with --scheduler {'|'.join(SCHEDULERS)} (--dry-run "
        "renders a script without submitting)"
    )


def get_scheduler(name: str) -> Scheduler:
    """The backend called ``name``; ``auto`` detects it from the commands on PATH."""
    if name == "auto":
        name = detect_scheduler()
    if name not in SCHEDULERS:
        raise SchedulerError(f"unknown scheduler {name!r}; use auto or one of {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name]()
