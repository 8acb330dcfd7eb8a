"""Which program starts the ranks: ``hpcdl run --launcher`` (auto, local, ssh, or a platform's own).

Inside a batch allocation the ranks start with the allocation's own launcher (each platform module in
:mod:`hpcdl.platforms` declares its launchers and which one its allocation uses), so that they run inside
the job (its cgroup, CPU and GPU binding, accounting; killed with it) and no ssh to compute nodes is
needed. A *step* launcher starts all ranks as one parallel step, each task running
``hpcdl.runner.step_agent``, which finds its rank from the host it landed on and its index there. Where a
launcher can also start one task on a named host, elastic workers use that form, one worker at a time, each
behind the rank agent. ``ssh`` stays for plain host lists and as an explicit choice; ``local`` runs every
rank here.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping

from hpcdl import platforms
from hpcdl.platforms.base import NativeLauncher
from hpcdl.runner.allocation import Allocation
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import HostSlots, RankSlot


def placement(slots: list[RankSlot]) -> list[HostSlots]:
    """Hosts in rank order with how many ranks each runs (ranks of a host are consecutive)."""
    counts: dict[str, int] = {}
    for slot in slots:
        counts[slot.host] = counts.get(slot.host, 0) + 1
    return [HostSlots(host, count) for host, count in counts.items()]


def launcher_choices() -> tuple[str, ...]:
    """What ``--launcher`` accepts: auto, local, ssh and every platform's launchers."""
    return ("auto", "local", "ssh", *platforms.native_launchers())


def _allocation_launcher(allocation: Allocation) -> str:
    """The native launcher of a scheduler, or 'ssh' where the allocation has none on PATH."""
    return platforms.by_title(allocation.scheduler).native_launcher()


def choose_launcher(
    requested: str, allocation: Allocation | None, hosts: list[HostSlots] | None, all_local: bool
) -> str:
    """The launcher's name for ``--launcher REQUESTED``: ``auto`` takes the allocation's own launcher when the
    job runs inside one (on its hosts: no -H, or -H naming hosts of the allocation), else ssh for other
    hosts and local when every rank runs here."""
    choices = launcher_choices()
    programs = {name: cls.program for name, cls in platforms.native_launchers().items()}
    if requested not in choices:
        raise LaunchError(f"--launcher {requested}: choose one of {', '.join(choices)}")
    if requested != "auto":
        if requested in programs and shutil.which(programs[requested]) is None:
            raise LaunchError(
                f"--launcher {requested}: '{programs[requested]}' is not on PATH here; load the "
                "scheduler's module, run inside the allocation, or choose another launcher"
            )
        return requested
    if allocation is not None:
        names = {h.name for h in allocation.hosts}
        if hosts is None or all(h.name in names for h in hosts):
            native = _allocation_launcher(allocation)
            if native != "ssh" and shutil.which(programs[native]) is None:
                raise LaunchError(
                    f"inside the {allocation.scheduler} allocation, but '{programs[native]}' is not on "
                    "PATH; load the scheduler's module or pass --launcher ssh"
                )
            if native != "ssh" or not all_local:
                return native
    return "local" if all_local else "ssh"


def make_native(name: str, environ: Mapping[str, str], extra_args: tuple[str, ...]) -> NativeLauncher:
    return platforms.native_launchers()[name](environ, extra_args)
