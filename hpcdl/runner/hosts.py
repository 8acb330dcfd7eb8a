"""Host lists (``-H host:slots,...``, hostfiles) and the placement of ranks on their slots.

Ranks fill hosts in the order given, each up to its slot count, as ``horovodrun`` and ``mpirun
-map-by slot`` do. Local rank = index among the ranks of one host; cross rank = index of the host
among the hosts that have a rank with the same local rank (Horovod's definition).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hpcdl.runner.errors import LaunchError

# RFC 1123 host names, IPv4 addresses and bracket-less IPv6 are all accepted by this pattern's
# character set; anything else (spaces, shell metacharacters) is refused before it reaches ssh.
_HOST_RE = re.compile(r"^[A-Za-z0-9_.:%-]+$")


@dataclass(frozen=True)
class HostSlots:
    """One host and how many ranks it may run."""

    name: str
    slots: int


@dataclass(frozen=True)
class RankSlot:
    """Where one rank runs and its place in the job's topology."""

    rank: int
    size: int
    host: str
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def _check_host(name: str, where: str) -> str:
    if not name or not _HOST_RE.match(name):
        raise LaunchError(f"{where}: '{name}' is not a host name; use letters, digits, '.', '-', '_'")
    if name.startswith("-"):  # ssh and mpirun would read it as an option
        raise LaunchError(f"{where}: '{name}' is not a host name: host names do not start with '-'")
    return name


def _parse_slots(text: str, where: str) -> int:
    try:
        slots = int(text)
    except ValueError:
        raise LaunchError(f"{where}: slots '{text}' is not a whole number") from None
    if slots < 1:
        raise LaunchError(f"{where}: slots must be at least 1, got {slots}")
    return slots


def merge_duplicates(hosts: list[HostSlots]) -> list[HostSlots]:
    """Join repeated hosts (``a:1,a:1`` = ``a:2``), keeping the order of first appearance."""
    merged: dict[str, int] = {}
    for host in hosts:
        merged[host.name] = merged.get(host.name, 0) + host.slots
    return [HostSlots(name, slots) for name, slots in merged.items()]


def parse_hosts_arg(text: str) -> list[HostSlots]:
    """Parse ``-H host1:2,host2:4`` (a host without ``:slots`` has one slot)."""
    hosts = []
    for item in (part.strip() for part in text.split(",")):
        where = f"-H entry '{item}'"
        if not item:
            raise LaunchError(f"-H '{text}' has an empty entry; write host1:2,host2:2")
        name, sep, slots = item.rpartition(":")
        if not sep:
            name, slots = item, "1"
        hosts.append(HostSlots(_check_host(name, where), _parse_slots(slots, where)))
    return merge_duplicates(hosts)


def parse_hostfile(path: Path) -> list[HostSlots]:
    """Parse a hostfile: OpenMPI/Horovod ``host [slots=N] [max_slots=M]`` or MPICH ``host:N`` lines,
    ``#`` comments."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise LaunchError(f"cannot read hostfile {path}: {exc.strerror}") from None
    hosts = []
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        fields = line.split()
        name, sep, mpich_slots = fields[0].partition(":")
        _check_host(name, where)
        slots = _parse_slots(mpich_slots, where) if sep else 1
        for field in fields[1:]:
            key, sep, value = field.partition("=")
            if sep and key == "slots":
                slots = _parse_slots(value, where)
            elif sep and key in ("max_slots", "max-slots"):
                _parse_slots(value, where)  # OpenMPI's oversubscription cap: checked, not used
            else:
                raise LaunchError(
                    f"{where}: cannot read '{field}' in '{raw.strip()}'; "
                    "hostfile lines look like 'node01 slots=4'"
                )
        hosts.append(HostSlots(name, slots))
    if not hosts:
        raise LaunchError(f"hostfile {path} names no hosts; add lines like 'node01 slots=4'")
    return merge_duplicates(hosts)


def assign_ranks(hosts: list[HostSlots], num_proc: int) -> list[RankSlot]:
    """Place `num_proc` ranks on the hosts' slots, in order; refuse more ranks than slots."""
    total = sum(host.slots for host in hosts)
    if num_proc < 1:
        raise LaunchError(f"-np must be at least 1, got {num_proc}")
    if num_proc > total:
        listing = ",".join(f"{h.name}:{h.slots}" for h in hosts)
        raise LaunchError(
            f"-np {num_proc} asks for more ranks than the {total} slots of {listing}; "
            "lower -np or give hosts more slots (host:slots in -H, 'slots=N' in a hostfile)"
        )
    placed: list[tuple[str, int]] = []  # (host, local_rank)
    for host in hosts:
        for local_rank in range(host.slots):
            if len(placed) == num_proc:
                break
            placed.append((host.name, local_rank))
    local_sizes: dict[str, int] = {}
    for name, _ in placed:
        local_sizes[name] = local_sizes.get(name, 0) + 1
    hosts_in_order = list(local_sizes)
    slots = []
    for rank, (name, local_rank) in enumerate(placed):
        peers = [h for h in hosts_in_order if local_sizes[h] > local_rank]
        slots.append(
            RankSlot(
                rank=rank,
                size=num_proc,
                host=name,
                local_rank=local_rank,
                local_size=local_sizes[name],
                cross_rank=peers.index(name),
                cross_size=len(peers),
            )
        )
    return slots
