"""``hpcdl run`` as a library call: resolve hosts, place ranks, host the rendezvous, start the ranks
(directly, over ssh, through the allocation's own launcher, or through mpirun) and supervise them."""

from __future__ import annotations

import os
import secrets
import shlex
import socket
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hpcdl import jobenv, platforms
from hpcdl.common import debug_dir, handshake, stacks
from hpcdl.runner.allocation import Allocation, detect_allocation
from hpcdl.runner.board import BoardServer
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
from hpcdl.runner.launchers import (
    NativeLauncher,
    choose_launcher,
    make_native,
    placement,
)
from hpcdl.runner.mpi import build_mpi_command, detect_flavor, mpi_reader, new_token
from hpcdl.runner.network import address_towards, interface_address, is_local_host
from hpcdl.runner.output import OutputOptions, OutputRouter, RankOutput
from hpcdl.runner.procs import AgentRank, LauncherStart, RemoteStart, SshOptions
from hpcdl.runner.rank_agent import reserve_port
from hpcdl.runner.rank_env import (
    TORCH_JOB_VARIABLES,
    TORCH_RANK_VARIABLES,
    Rendezvous,
    forwarded_environment,
    rank_variables,
    torch_variables,
)
from hpcdl.runner.rendezvous_host import host_rendezvous
from hpcdl.runner.service import ServiceServer, capacity_for
from hpcdl.runner.supervisor import JobProcess, Supervisor
from hpcdl.runner.tagged import TaggedRun, step_agent_reader
from hpcdl.runner.tunables import tunable_environment

DEFAULT_START_TIMEOUT = 30.0
BOARD_CLIENT_SOURCE = Path(handshake.__file__).read_text()


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
    launcher: str = "auto"  # --launcher (launchers.LAUNCHER_CHOICES)
    launcher_args: tuple[str, ...] = ()  # --launcher-args: extra srun / flux run / mpiexec ... arguments
    interfaces: tuple[str, ...] = ()  # --network-interfaces with several: each host uses the first it has


def resolve_start_timeout(explicit: float | None, environ: Mapping[str, str]) -> float:
    """--start-timeout > HPCDL_START_TIMEOUT > HOROVOD_START_TIMEOUT > 30 s."""
    if explicit is not None:
        value, source = explicit, "--start-timeout"
    else:
        for name in (jobenv.START_TIMEOUT, "HOROVOD_START_TIMEOUT"):
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


@dataclass(frozen=True)
class ResolvedHosts:
    hosts: list[HostSlots]
    num_proc: int
    source: str  # where the hosts came from, for --verbose
    allocation: Allocation | None


def resolve_hosts(spec: LaunchSpec, environ: Mapping[str, str]) -> ResolvedHosts:
    """The hosts, the number of ranks, where the hosts came from, and the allocation hpcdl run is in."""
    allocation = detect_allocation(environ, spec.slots_per_host) if spec.launcher != "local" else None
    if spec.hosts is not None:
        hosts, source = spec.hosts, "the host list"
    elif allocation is not None:
        hosts, source = allocation.hosts, allocation.describe()
    elif spec.num_proc is None:
        raise LaunchError("say how many ranks to start: hpcdl run -np N COMMAND")
    else:
        hosts, source = [HostSlots(socket.gethostname(), spec.num_proc)], "this machine"
    num_proc = spec.num_proc if spec.num_proc is not None else sum(h.slots for h in hosts)
    return ResolvedHosts(hosts, num_proc, source, allocation)


def rank_settings_env(spec: LaunchSpec) -> dict[str, str]:
    """Tunables and -x values, the same for every rank; --tcp also keeps NCCL off InfiniBand (horovodrun)."""
    settings = dict(spec.settings)
    tcp_only: dict[str, str] = {}
    if spec.tcp:
        if settings.get("transport", "tcp").lower() != "tcp":
            raise LaunchError(f"--tcp contradicts --transport {settings['transport']}; drop one of them")
        settings["transport"] = "tcp"
        tcp_only["NCCL_IB_DISABLE"] = "1"
    return {**tunable_environment(settings), **tcp_only, **spec.extra_env}


def debug_env(spec: LaunchSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """HPCDL_DEBUG_DIR for every rank: the user's (-x, the environment), else the job's own directory."""
    return {debug_dir.DEBUG_DIR_ENV: str(debug_dir.launcher_dir({**environ, **spec.extra_env}))}


def _rendezvous_address(spec: LaunchSpec, remote_hosts: list[str]) -> str:
    iface = spec.settings.get("network_interface")
    if iface:
        return interface_address(iface)
    for candidate in spec.interfaces:
        try:
            return interface_address(candidate)
        except LaunchError:
            continue
    if not remote_hosts:
        return "127.0.0.1"
    return address_towards(remote_hosts[0])


@dataclass(frozen=True)
class TorchMaster:
    """torch.distributed's meeting point: the job-level variables, and how rank 0's host keeps MASTER_PORT
    free until torch listens on it (`holder` here, or rank 0's agent through the `board`)."""

    env: dict[str, str]
    holder: socket.socket | None = None
    board: BoardServer | None = None
    board_address: str = ""

    def stop(self) -> None:
        if self.holder is not None:
            self.holder.close()
        if self.board is not None:
            self.board.stop()


def torch_master(
    slots: list[RankSlot], local_hosts: set[str], user: Mapping[str, str], here: str, secret: str
) -> TorchMaster:
    """MASTER_ADDR/MASTER_PORT/WORLD_SIZE unless the user set them (`user`: -x over the environment).

    MASTER_ADDR is rank 0's host (`here`, the address the ranks reach this machine at, when rank 0 runs
    here). MASTER_PORT is a port of that host held until the job ends (``rank_agent.reserve_port``): by this
    launcher when rank 0 runs here, else by rank 0's agent, which posts it to a board for the others.
    """
    rank0 = slots[0]
    env = {"WORLD_SIZE": str(rank0.size)}
    env["MASTER_ADDR"] = here if rank0.host in local_hosts else rank0.host
    env = {k: v for k, v in env.items() if k not in user}
    if "MASTER_PORT" in user:
        return TorchMaster(env)
    if rank0.host in local_hosts:
        holder = reserve_port()
        return TorchMaster({**env, "MASTER_PORT": str(holder.getsockname()[1])}, holder=holder)
    board = BoardServer(secret, here, len(slots))
    return TorchMaster(env, board=board, board_address=f"{here}:{board.port}")


@dataclass(frozen=True)
class _Job:
    """What every rank of one job shares."""

    spec: LaunchSpec
    slots: list[RankSlot]
    local_hosts: set[str]
    environ: dict[str, str]
    common_env: dict[str, str]  # tunables, -x, torch.distributed's job-level variables
    rendezvous: Rendezvous | None
    ssh: SshOptions
    start_timeout: float
    master: TorchMaster

    def keep(self) -> set[str]:
        """Per-rank torch variables the user gave with -x."""
        return {name for name in TORCH_RANK_VARIABLES if name in self.spec.extra_env}

    def agent_spec(self) -> dict[str, Any]:
        """What every rank agent gets besides its command and environment."""
        extra: dict[str, Any] = {"start_timeout": self.start_timeout}
        if self.spec.interfaces:
            extra["interfaces"] = list(self.spec.interfaces)
        if self.master.board_address:
            extra["master_board"] = self.master.board_address
            extra["board_client"] = BOARD_CLIENT_SOURCE  # the agent may run where hpcdl is not installed
        return extra


def _service_node_hosts(launcher: str, hosts: list[HostSlots], from_allocation: bool) -> list[HostSlots]:
    """Launchers that run from a service node (aprun, jsrun) start ranks on compute nodes only; the node they
    run on (a MOM or launch node that LSF lists in its allocation) gets none."""
    native = platforms.native_launchers().get(launcher)
    if native is None or not native.from_service_node or not from_allocation:
        return hosts
    here = socket.gethostname().split(".", 1)[0]
    return [h for h in hosts if h.name.split(".", 1)[0] != here] or hosts


def launch(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> int:
    """Run the job to its end; return the exit code for the launcher."""
    environ = {
        k: v for k, v in (os.environ if environ is None else environ).items() if k not in jobenv.JOB_SPECIFIC
    }
    if not spec.command:
        raise LaunchError("no command to run; write it after the options: hpcdl run -np 2 python train.py")
    if spec.mpi is not None and spec.launcher not in ("auto", "ssh"):
        raise LaunchError(
            f"--mpi starts the ranks with mpirun; it cannot also use --launcher {spec.launcher}"
        )
    if spec.elastic is not None:
        return _launch_elastic(spec, spec.elastic, environ)
    resolved = resolve_hosts(spec, environ)
    used_hosts = list(dict.fromkeys(h.name for h in resolved.hosts))
    local_hosts = {host for host in used_hosts if is_local_host(host)}
    launcher = "mpi" if spec.mpi is not None else _launcher_name(spec, resolved, local_hosts)
    hosts = _service_node_hosts(launcher, resolved.hosts, spec.hosts is None)
    num_proc = spec.num_proc if spec.num_proc is not None else sum(h.slots for h in hosts)
    slots = assign_ranks(hosts, num_proc)
    start_timeout = resolve_start_timeout(spec.start_timeout, environ)
    placed_hosts = list(dict.fromkeys(slot.host for slot in slots))
    remote_hosts = [host for host in placed_hosts if host not in local_hosts]
    if launcher == "local" and remote_hosts:
        raise LaunchError(f"--launcher local runs every rank here, but {remote_hosts[0]} is another host")
    common_env = {**rank_settings_env(spec), **debug_env(spec, environ)}
    if spec.verbose and not any(environ.get(v) for v in ("HPCDL_LOG_LEVEL", "HOROVOD_LOG_LEVEL")):
        common_env.setdefault("HPCDL_LOG_LEVEL", "info")  # rank 0 says what it chose (paths, cache)
    rendezvous_addr = _rendezvous_address(spec, remote_hosts)
    router = OutputRouter(spec.output, num_proc)
    if spec.verbose:
        shown = ", ".join(f"{h.name}:{h.slots}" for h in placement(slots))
        print(
            f"hpcdl run: {num_proc} ranks on {shown} (hosts from {resolved.source}; launcher {launcher})",
            file=sys.stderr,
        )
    hosted = host_rendezvous(num_proc, rendezvous_addr)
    server, rendezvous = None, None
    if hosted is not None:
        server, secret = hosted
        rendezvous = Rendezvous(rendezvous_addr, server.port, secret)
        if spec.verbose:
            print(f"hpcdl run: rendezvous at {rendezvous.addr}:{rendezvous.port}", file=sys.stderr)
    user = {**{k: v for k, v in environ.items() if k in TORCH_JOB_VARIABLES}, **spec.extra_env}
    job_secret = rendezvous.secret if rendezvous is not None else secrets.token_hex(32)
    master = torch_master(slots, local_hosts, user, rendezvous_addr, job_secret)
    common_env.update(master.env)
    if rendezvous is None:  # rank 0 hosts one at MASTER_ADDR, or says why it cannot (not: no secret)
        common_env[jobenv.SECRET] = job_secret
    job = _Job(
        spec, slots, local_hosts, environ, common_env, rendezvous, _ssh_options(spec, start_timeout),
        start_timeout, master,
    )  # fmt: skip
    processes: list[JobProcess] = []
    job_debug_dir = Path(common_env[debug_dir.DEBUG_DIR_ENV])
    supervisor = Supervisor(processes, slots, server, start_timeout, job_debug_dir)
    try:
        processes.extend(_start_processes(job, launcher, router))
    except BaseException:
        supervisor.abort()
        master.stop()
        raise
    try:
        return supervisor.run()
    finally:
        master.stop()


def _start_processes(job: _Job, launcher: str, router: OutputRouter) -> Iterator[JobProcess]:
    """Start the job's processes with `launcher`: mpirun, one agent per rank (here, over ssh or through a
    one-task launcher such as blaunch), or one step of the allocation's launcher."""
    if launcher == "mpi":
        yield _start_mpirun(job, router)
        return
    if launcher in ("local", "ssh"):
        yield from (_start_rank(job, slot, router, job.ssh) for slot in job.slots)
        return
    native = make_native(launcher, job.environ, job.spec.launcher_args)
    placed = placement(job.slots)
    native.check_placement(placed)
    step = native.step_argv(placed)
    if step is not None:
        yield _start_step(job, native, step, router)
        return
    remote = LauncherStart(native.worker_argv, native.name)
    yield from (_start_rank(job, slot, router, remote) for slot in job.slots)


def _launcher_name(spec: LaunchSpec, resolved: ResolvedHosts, local_hosts: set[str]) -> str:
    all_local = all(h.name in local_hosts for h in resolved.hosts)
    return choose_launcher(spec.launcher, resolved.allocation, spec.hosts, all_local)


def _ssh_options(spec: LaunchSpec, start_timeout: float) -> SshOptions:
    return replace(spec.ssh, connect_timeout=min(start_timeout, 30.0))


def _start_agent(
    spec: LaunchSpec,
    slot: RankSlot,
    environ: dict[str, str],
    env: dict[str, str],
    output: RankOutput,
    remote: RemoteStart | None,
    extra_spec: dict[str, Any] | None = None,
    label: str = "rank",
) -> AgentRank:
    """One rank behind the rank agent: here with the launcher's environment plus `env`, or (`remote`) on its
    host with the forwarded part of that environment plus `env`."""
    if remote is None:
        return AgentRank(slot, spec.command, {**environ, **env}, output, extra_spec=extra_spec)
    if spec.verbose:
        shown = " ".join(remote.agent_argv(slot.host, sys.executable, "<agent>"))
        print(f"hpcdl run: {label} {slot.rank}: {shown}", file=sys.stderr)
    env = {**forwarded_environment(environ), **env}
    return AgentRank(slot, spec.command, env, output, remote, extra_spec=extra_spec)


def _start_rank(job: _Job, slot: RankSlot, router: OutputRouter, remote: RemoteStart) -> JobProcess:
    torch_env = {k: v for k, v in torch_variables(slot).items() if k not in job.keep()}
    env = {**job.common_env, **torch_env, **rank_variables(slot, job.rendezvous)}
    where = None if slot.host in job.local_hosts and isinstance(remote, SshOptions) else remote
    directory = Path(job.common_env[debug_dir.DEBUG_DIR_ENV])
    dumps = {"signal": int(stacks.STACK_SIGNAL), "file": str(directory / stacks.stack_path(slot.rank).name)}
    extra = {**job.agent_spec(), "stacks": dumps}
    return _start_agent(job.spec, slot, job.environ, env, router.for_rank(slot.rank), where, extra)


def _rendezvous_env(rendezvous: Rendezvous | None) -> dict[str, str]:
    if rendezvous is None:
        return {}
    return jobenv.rendezvous_env(rendezvous.addr, rendezvous.port, rendezvous.secret)


def _start_step(job: _Job, launcher: NativeLauncher, step: list[str], router: OutputRouter) -> JobProcess:
    """All ranks as one step (`step`: the launcher's argv) of the allocation's launcher, each task behind
    ``hpcdl.runner.step_agent``."""
    placed = placement(job.slots)
    token = new_token()
    identity = launcher.identity
    agent = [sys.executable, "-m", "hpcdl.runner.step_agent", "--token", token]
    agent += ["--placement", ",".join(f"{h.name}:{h.slots}" for h in placed)]
    agent += [
        "--host-variable",
        identity.host_variable or "",
        "--local-variable",
        identity.local_variable or "",
    ]
    agent += ["--rank-variable", identity.rank_variable, "--start-timeout", f"{job.start_timeout:g}"]
    if launcher.broadcasts_stdin:
        agent.append("--control-stdin")
    if job.spec.interfaces:
        agent += ["--interfaces", ",".join(job.spec.interfaces)]
    if job.keep():
        agent += ["--keep", ",".join(sorted(job.keep()))]
    if job.master.board_address:
        agent += ["--master-board", job.master.board_address]
    argv = [*step, *agent, "--", *job.spec.command]
    if job.spec.verbose:
        print(f"hpcdl run: {shlex.join(argv)}", file=sys.stderr)
    env = {**job.environ, **job.common_env, **_rendezvous_env(job.rendezvous)}
    return TaggedRun(
        argv, env, job.slots, router, step_agent_reader(token), control_stdin=launcher.broadcasts_stdin
    )


def _start_mpirun(job: _Job, router: OutputRouter) -> JobProcess:
    assert job.spec.mpi is not None
    flavor = detect_flavor(job.spec.mpi.mpirun)
    placed = placement(job.slots)
    rank_env = {**job.common_env, **_rendezvous_env(job.rendezvous)}
    if job.master.board_address:
        rank_env[jobenv.MASTER_BOARD] = job.master.board_address
        rank_env[jobenv.START_TIMEOUT] = f"{job.start_timeout:g}"
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
        network_interface=job.spec.settings.get("network_interface") or ",".join(job.spec.interfaces) or None,
        tcp=job.spec.tcp,
        extra_args=job.spec.mpi.extra_args,
        is_root=os.geteuid() == 0,
    )
    if job.spec.verbose:
        print(f"hpcdl run: {command.shown}", file=sys.stderr)
    return TaggedRun(command.argv, command.env, job.slots, router, mpi_reader(flavor, token))


def _launch_elastic(spec: LaunchSpec, options: ElasticOptions, environ: dict[str, str]) -> int:
    """Run an elastic job: workers on the slots of -H/--hostfile/the allocation/the discovery script, each
    started here, over ssh, or (inside an allocation) through its launcher's one-task form (srun steps)."""
    if spec.mpi is not None:
        raise LaunchError(
            "--mpi cannot start an elastic job (mpirun fixes the ranks); drop --mpi or --min-np/--max-np"
        )
    check_options(options, spec.num_proc)
    hosts: list[HostSlots] = []  # from the discovery script, else -H/--hostfile, the allocation or here
    allocation = detect_allocation(environ, spec.slots_per_host) if spec.launcher != "local" else None
    if options.discovery_script is None:
        hosts = resolve_hosts(replace(spec, num_proc=options.max_np), environ).hosts
    remote = [h.name for h in hosts if not is_local_host(h.name)]
    launcher = choose_launcher(spec.launcher, allocation, spec.hosts, all_local=not remote)
    start_remote = _worker_start(spec, launcher, environ)
    from hpcdl.common.rendezvous import RendezvousServer, make_secret

    secret = make_secret()
    addr = _rendezvous_address(spec, remote)
    board = RoundBoard()
    start_timeout = resolve_start_timeout(spec.start_timeout, environ)
    driver = ServiceServer(
        secret,
        driver_requests(board, options.timeout),
        addr,
        capacity_for(options.max_np),
        "the elastic driver",
    )
    driver.start()
    common_env = {
        **rank_settings_env(spec),
        **debug_env(spec, environ),
        jobenv.ELASTIC_DRIVER: f"{addr}:{driver.port}",
        jobenv.ELASTIC_TIMEOUT: str(options.timeout),
        jobenv.SECRET: secret,
    }
    router = OutputRouter(spec.output, options.max_np)
    ssh = _ssh_options(spec, start_timeout)
    extra_spec = {"interfaces": list(spec.interfaces)} if spec.interfaces else None
    if spec.verbose:
        print(f"hpcdl run: elastic workers start with launcher {launcher}", file=sys.stderr)

    def start_worker(number: int, host: str) -> JobProcess:
        identity = {jobenv.ELASTIC_WORKER: str(number), jobenv.HOSTNAME: host, jobenv.HOROVOD_HOSTNAME: host}
        where: RemoteStart | None = start_remote
        if where is None and not is_local_host(host):
            where = ssh
        slot, env = worker_slot(number, host), {**common_env, **identity}
        return _start_agent(spec, slot, environ, env, router.for_rank(number), where, extra_spec, "worker")

    def start_rendezvous(size: int) -> tuple[int, Callable[[], None]]:
        server = RendezvousServer(size, secret, addr)
        server.start()
        return server.port, server.stop

    job = ElasticJob(options, hosts, spec.num_proc, start_worker, start_rendezvous, board, addr)
    try:
        return job.run()
    finally:
        driver.stop()


def _worker_start(spec: LaunchSpec, launcher: str, environ: Mapping[str, str]) -> RemoteStart | None:
    """How elastic workers start: None for here/ssh by host, else the launcher's one-task form."""
    if launcher in ("local", "ssh"):
        return None
    native = make_native(launcher, environ, spec.launcher_args)
    if native.worker_argv("HOST") is None:
        able = [name for name, cls in platforms.native_launchers().items() if cls({}).worker_argv("HOST")]
        raise LaunchError(
            f"--launcher {launcher} cannot start one worker at a time, which elastic jobs need; "
            f"use {', '.join(able)} or ssh"
        )
    return LauncherStart(native.worker_argv, native.name)
