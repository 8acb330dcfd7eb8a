"""``hpcdl run`` as a library call: resolve hosts, place ranks, host the rendezvous, start the ranks
(directly, over ssh, or through mpirun) and supervise them."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hpcdl.runner.allocation import detect_allocation
from hpcdl.runner.elastic import (
    ElasticJob,
    ElasticOptions,
    RoundBoard,
    check_options,
    driver_requests,
    worker_slot,
)
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import HostSlots, RankSlot, assign_ranks
from hpcdl.runner.mpi import MpiRun, build_mpi_command, detect_flavor, new_token
from hpcdl.runner.network import address_towards, interface_address, is_local_host
from hpcdl.runner.output import OutputOptions, OutputRouter, RankOutput
from hpcdl.runner.procs import AgentRank, SshOptions
from hpcdl.runner.rank_env import Rendezvous, forwarded_environment, rank_variables
from hpcdl.runner.rendezvous_host import host_rendezvous
from hpcdl.runner.service import ServiceServer, capacity_for
from hpcdl.runner.supervisor import JobProcess, Supervisor
from hpcdl.runner.tunables import tunable_environment

DEFAULT_START_TIMEOUT = 30.0
# Inherited values that would point ranks at another job's rendezvous.
_JOB_SPECIFIC = (
    "HPCDL_RENDEZVOUS_ADDR", "HPCDL_RENDEZVOUS_PORT", "HPCDL_RENDEZVOUS_SERVE", "HPCDL_SECRET",
    "HPCDL_ELASTIC_DRIVER", "HPCDL_ELASTIC_WORKER", "HPCDL_ELASTIC_TIMEOUT",
)  # fmt: skip


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
    elastic: ElasticOptions | None = None


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


def rank_settings_env(spec: LaunchSpec) -> dict[str, str]:
    """Tunables and -x values, the same for every rank."""
    settings = dict(spec.settings)
    if spec.tcp:
        if settings.get("transport", "tcp").lower() != "tcp":
            raise LaunchError(f"--tcp contradicts --transport {settings['transport']}; drop one of them")
        settings["transport"] = "tcp"
    return {**tunable_environment(settings), **spec.extra_env}


def _rendezvous_address(spec: LaunchSpec, remote_hosts: list[str]) -> str:
    iface = spec.settings.get("network_interface")
    if iface:
        return interface_address(iface)
    if not remote_hosts:
        return "127.0.0.1"
    return address_towards(remote_hosts[0])


@dataclass(frozen=True)
class _Job:
    """What every rank of one job shares."""

    spec: LaunchSpec
    slots: list[RankSlot]
    local_hosts: set[str]
    environ: dict[str, str]
    common_env: dict[str, str]  # tunables, -x
    rendezvous: Rendezvous | None
    ssh: SshOptions


def launch(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> int:
    """Run the job to its end; return the exit code for the launcher."""
    environ = {
        k: v for k, v in (os.environ if environ is None else environ).items() if k not in _JOB_SPECIFIC
    }
    if not spec.command:
        raise LaunchError("no command to run; write it after the options: hpcdl run -np 2 python train.py")
    if spec.elastic is not None:
        return _launch_elastic(spec, spec.elastic, environ)
    hosts, num_proc, source = resolve_hosts(spec, environ)
    slots = assign_ranks(hosts, num_proc)
    start_timeout = resolve_start_timeout(spec.start_timeout, environ)
    used_hosts = list(dict.fromkeys(slot.host for slot in slots))
    local_hosts = {host for host in used_hosts if is_local_host(host)}
    remote_hosts = [host for host in used_hosts if host not in local_hosts]
    common_env = rank_settings_env(spec)
    flavor = detect_flavor(spec.mpi.mpirun) if spec.mpi is not None else None
    rendezvous_addr = _rendezvous_address(spec, remote_hosts)
    router = OutputRouter(spec.output, num_proc)
    if spec.verbose:
        placement = ", ".join(f"{h}:{sum(1 for s in slots if s.host == h)}" for h in used_hosts)
        print(f"hpcdl run: {num_proc} ranks on {placement} (hosts from {source})", file=sys.stderr)
    hosted = host_rendezvous(num_proc)
    server, rendezvous = None, None
    if hosted is not None:
        server, secret = hosted
        rendezvous = Rendezvous(rendezvous_addr, server.port, secret)
        if spec.verbose:
            print(f"hpcdl run: rendezvous at {rendezvous.addr}:{rendezvous.port}", file=sys.stderr)
    ssh = _ssh_options(spec, start_timeout)
    job = _Job(spec, slots, local_hosts, environ, common_env, rendezvous, ssh)
    processes: list[JobProcess] = []
    supervisor = Supervisor(processes, slots, server, start_timeout)
    try:
        if flavor is not None:
            processes.append(_start_mpirun(job, flavor, router))
        else:
            processes.extend(_start_rank(job, slot, router) for slot in slots)
    except BaseException:
        supervisor.abort()
        raise
    return supervisor.run()


def _ssh_options(spec: LaunchSpec, start_timeout: float) -> SshOptions:
    return replace(spec.ssh, connect_timeout=min(start_timeout, 30.0))


def _start_agent(
    spec: LaunchSpec,
    slot: RankSlot,
    environ: dict[str, str],
    env: dict[str, str],
    output: RankOutput,
    ssh: SshOptions | None,
) -> AgentRank:
    """One rank behind the rank agent: here with the launcher's environment plus `env`, or (`ssh`) on its
    host with the forwarded part of that environment plus `env`."""
    if ssh is None:
        return AgentRank(slot, spec.command, {**environ, **env}, output)
    if spec.verbose:
        print(f"hpcdl run: rank {slot.rank}: {' '.join(ssh.argv(slot.host))} <agent>", file=sys.stderr)
    return AgentRank(slot, spec.command, {**forwarded_environment(environ), **env}, output, ssh)


def _start_rank(job: _Job, slot: RankSlot, router: OutputRouter) -> JobProcess:
    env = {**job.common_env, **rank_variables(slot, job.rendezvous)}
    ssh = None if slot.host in job.local_hosts else job.ssh
    return _start_agent(job.spec, slot, job.environ, env, router.for_rank(slot.rank), ssh)


def _start_mpirun(job: _Job, flavor: str, router: OutputRouter) -> JobProcess:
    assert job.spec.mpi is not None
    placed = [
        HostSlots(host, sum(1 for s in job.slots if s.host == host))
        for host in dict.fromkeys(slot.host for slot in job.slots)
    ]
    rank_env = dict(job.common_env)
    if job.rendezvous is not None:
        rank_env.update(
            HPCDL_RENDEZVOUS_ADDR=job.rendezvous.addr,
            HPCDL_RENDEZVOUS_PORT=str(job.rendezvous.port),
            HPCDL_SECRET=job.rendezvous.secret,
        )
    token = new_token()
    command = build_mpi_command(
        flavor,
        job.spec.mpi.mpirun,
        placed,
        len(job.slots),
        rank_env,
        job.environ,
        [sys.executable, "-m", "hpcdl.runner.mpi_rank", token, *job.spec.command],
        ssh=job.ssh,
        network_interface=job.spec.settings.get("network_interface"),
        tcp=job.spec.tcp,
        extra_args=job.spec.mpi.extra_args,
        is_root=os.geteuid() == 0,
    )
    if job.spec.verbose:
        print(f"hpcdl run: {command.shown}", file=sys.stderr)
    return MpiRun(command, flavor, job.slots, router, token)


def _launch_elastic(spec: LaunchSpec, options: ElasticOptions, environ: dict[str, str]) -> int:
    """Run an elastic job: workers on the slots of -H/--hostfile/the allocation/the discovery script."""
    if spec.mpi is not None:
        raise LaunchError(
            "--mpi cannot start an elastic job (mpirun fixes the ranks); drop --mpi or --min-np/--max-np"
        )
    check_options(options, spec.num_proc)
    hosts: list[HostSlots] = []  # from the discovery script, else -H/--hostfile, the allocation or here
    if options.discovery_script is None:
        hosts = resolve_hosts(replace(spec, num_proc=options.max_np), environ)[0]
    from hpcdl.common.rendezvous import RendezvousServer, make_secret

    secret = make_secret()
    remote = [h.name for h in hosts if not is_local_host(h.name)]
    addr = _rendezvous_address(spec, remote)
    board = RoundBoard()
    start_timeout = resolve_start_timeout(spec.start_timeout, environ)
    driver = ServiceServer(
        secret, driver_requests(board, options.timeout), addr, capacity_for(options.max_np)
    )
    driver.start()
    common_env = {
        **rank_settings_env(spec),
        "HPCDL_ELASTIC_DRIVER": f"{addr}:{driver.port}",
        "HPCDL_ELASTIC_TIMEOUT": str(options.timeout),
        "HPCDL_SECRET": secret,
    }
    router = OutputRouter(spec.output, options.max_np)
    ssh = _ssh_options(spec, start_timeout)

    def start_worker(number: int, host: str) -> JobProcess:
        identity = {"HPCDL_ELASTIC_WORKER": str(number), "HPCDL_HOSTNAME": host, "HOROVOD_HOSTNAME": host}
        worker_ssh = None if is_local_host(host) else ssh
        output = router.for_rank(number)
        return _start_agent(
            spec, worker_slot(number, host), environ, {**common_env, **identity}, output, worker_ssh
        )

    def start_rendezvous(size: int) -> tuple[int, Callable[[], None]]:
        server = RendezvousServer(size, secret)
        server.start()
        return server.port, server.stop

    job = ElasticJob(options, hosts, spec.num_proc, start_worker, start_rendezvous, board, addr)
    try:
        return job.run()
    finally:
        driver.stop()
