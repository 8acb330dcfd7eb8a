"""``hpcdl run`` as a library call: resolve hosts, place ranks, host the rendezvous, start the ranks
(directly, over ssh, or through mpirun) and supervise them."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcdl.runner.allocation import detect_allocation
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import HostSlots, RankSlot, assign_ranks
from hpcdl.runner.network import address_towards, interface_address, is_local_host
from hpcdl.runner.output import OutputOptions, OutputRouter
from hpcdl.runner.procs import LocalRank, RemoteRank, SshOptions
from hpcdl.runner.rank_env import Rendezvous, forwarded_environment, rank_variables
from hpcdl.runner.rendezvous_host import host_rendezvous
from hpcdl.runner.supervisor import RankProcess, Supervisor
from hpcdl.runner.tunables import tunable_environment

DEFAULT_START_TIMEOUT = 30.0
# Inherited values that would point ranks at another job's rendezvous.
_JOB_SPECIFIC = ("HPCDL_RENDEZVOUS_ADDR", "HPCDL_RENDEZVOUS_PORT", "HPCDL_SECRET")


@dataclass(frozen=True)
class MpiOptions:
    """``--mpi``: which mpirun/mpiexec and extra arguments for it."""

    mpirun: str = "mpirun"
    extra_args: str = ""


@dataclass(frozen=True)
class LaunchSpec:
    command: list[str]
    num_proc: int | None = None
    hosts: list[HostSlots] | None = None  # None: the allocation's hosts, else this machine
    settings: dict[str, Any] = field(default_factory=dict)  # resolved tunables (tunables.TUNABLES keys)
    extra_env: dict[str, str] = field(default_factory=dict)  # -x
    ssh: SshOptions = field(default_factory=SshOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    start_timeout: float | None = None
    slots_per_host: int | None = None
    verbose: bool = False
    tcp: bool = False
    mpi: MpiOptions | None = None


def resolve_start_timeout(explicit: float | None, environ: Mapping[str, str]) -> float:
    """--start-timeout > HPCDL_START_TIMEOUT > HOROVOD_START_TIMEOUT > 30 s."""
    if explicit is not None:
        value, source = explicit, "--start-timeout"
    else:
        for name in ("HPCDL_START_TIMEOUT", "HOROVOD_START_TIMEOUT"):
            if environ.get(name):
                try:
                    value, source = float(environ[name]), name
                except ValueError:
                    raise LaunchError(f"{name}={environ[name]!r} is not a number of seconds") from None
                break
        else:
            return DEFAULT_START_TIMEOUT
    if value <= 0:
        raise LaunchError(f"{source} must be a positive number of seconds, got {value:g}")
    return value


def resolve_hosts(spec: LaunchSpec, environ: Mapping[str, str]) -> tuple[list[HostSlots], int, str]:
    """The hosts, the number of ranks and where the hosts came from."""
    if spec.hosts is not None:
        hosts, source = spec.hosts, "the host list"
    else:
        allocation = detect_allocation(environ, spec.slots_per_host)
        if allocation is not None:
            hosts, source = allocation.hosts, allocation.describe()
        elif spec.num_proc is None:
            raise LaunchError("say how many ranks to start: hpcdl run -np N COMMAND")
        else:
            hosts, source = [HostSlots(socket.gethostname(), spec.num_proc)], "this machine"
    num_proc = spec.num_proc if spec.num_proc is not None else sum(h.slots for h in hosts)
    return hosts, num_proc, source


def _rendezvous_address(spec: LaunchSpec, remote_hosts: list[str]) -> str:
    iface = spec.settings.get("network_interface")
    if iface:
        return interface_address(iface)
    if not remote_hosts:
        return "127.0.0.1"
    return address_towards(remote_hosts[0])


def rank_settings_env(spec: LaunchSpec) -> dict[str, str]:
    """Tunables and -x values, the same for every rank."""
    settings = dict(spec.settings)
    if spec.tcp:
        if settings.get("transport", "tcp").lower() != "tcp":
            raise LaunchError(f"--tcp contradicts --transport {settings['transport']}; drop one of them")
        settings["transport"] = "tcp"
    return {**tunable_environment(settings), **spec.extra_env}


def launch(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> int:
    """Run the job to its end; return the exit code for the launcher."""
    environ = dict(os.environ if environ is None else environ)
    if not spec.command:
        raise LaunchError("no command to run; write it after the options: hpcdl run -np 2 python train.py")
    hosts, num_proc, source = resolve_hosts(spec, environ)
    slots = assign_ranks(hosts, num_proc)
    start_timeout = resolve_start_timeout(spec.start_timeout, environ)
    used_hosts = list(dict.fromkeys(slot.host for slot in slots))
    local = {host for host in used_hosts if is_local_host(host)}
    remote_hosts = [host for host in used_hosts if host not in local]
    common_env = rank_settings_env(spec)
    if spec.mpi is not None:
        from hpcdl.runner.mpi import launch_with_mpi

        return launch_with_mpi(spec, slots, hosts, common_env, environ, start_timeout)
    if spec.verbose:
        placement = ", ".join(f"{h}:{sum(1 for s in slots if s.host == h)}" for h in used_hosts)
        print(f"hpcdl run: {num_proc} ranks on {placement} (hosts from {source})", file=sys.stderr)
    router = OutputRouter(spec.output, num_proc)
    hosted = host_rendezvous(num_proc)
    server, rendezvous = None, None
    if hosted is not None:
        server, secret = hosted
        rendezvous = Rendezvous(_rendezvous_address(spec, remote_hosts), server.port, secret)
        if spec.verbose:
            print(f"hpcdl run: rendezvous at {rendezvous.addr}:{rendezvous.port}", file=sys.stderr)
    base_env = {k: v for k, v in environ.items() if k not in _JOB_SPECIFIC}
    remote_base = {k: v for k, v in forwarded_environment(environ).items() if k not in _JOB_SPECIFIC}
    ranks: list[RankProcess] = []
    ssh = SshOptions(spec.ssh.port, spec.ssh.identity_file, spec.ssh.config_file, min(start_timeout, 30.0))
    supervisor = Supervisor(ranks, server, start_timeout)
    try:
        for slot in slots:
            ranks.append(
                _start_rank(
                    slot, spec, slot.host in local, base_env, remote_base, common_env, rendezvous, router, ssh
                )
            )
    except LaunchError:
        supervisor.abort()
        raise
    return supervisor.run()


def _start_rank(
    slot: RankSlot,
    spec: LaunchSpec,
    is_local: bool,
    base_env: dict[str, str],
    remote_base: dict[str, str],
    common_env: dict[str, str],
    rendezvous: Rendezvous | None,
    router: OutputRouter,
    ssh: SshOptions,
) -> RankProcess:
    output = router.for_rank(slot.rank)
    identity = rank_variables(slot, rendezvous)
    if is_local:
        return LocalRank(slot, spec.command, {**base_env, **common_env, **identity}, output)
    if spec.verbose:
        print(f"hpcdl run: rank {slot.rank}: {' '.join(ssh.argv(slot.host))} <agent>", file=sys.stderr)
    return RemoteRank(slot, spec.command, {**remote_base, **common_env, **identity}, output, ssh)
