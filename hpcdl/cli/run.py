"""``hpcdl run``: start a job's ranks here, on other hosts over ssh, through the batch allocation's own
launcher (srun, flux run, ...), or through mpirun. Accepts every flag of Horovod 0.28's ``horovodrun``."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Optional

import typer

from hpcdl import jobenv
from hpcdl._version import __version__
from hpcdl.cli.helpformat import PanelledCommand
from hpcdl.common.exceptions import HpcdlError
from hpcdl.platforms.lsf import Jsrun
from hpcdl.runner.elastic import ElasticOptions
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.horovodrun import NO_EFFECT, no_effect_notes
from hpcdl.runner.hosts import parse_hostfile, parse_hosts_arg
from hpcdl.runner.launch import LaunchSpec, MpiOptions, launch
from hpcdl.runner.launchers import launcher_choices
from hpcdl.runner.output import OutputOptions
from hpcdl.runner.procs import HOST_KEY_POLICIES, SshOptions
from hpcdl.runner.rank_env import parse_extra_env
from hpcdl.runner.tunables import TUNABLES, check_value, load_config_file, merge_hierarchical

_TUNING = "Runtime tunables (set the HPCDL_* variable of each rank)"
_ELASTIC = "Elastic training (workers may fail or join; see hvd.elastic.run)"
_HOROVODRUN = "horovodrun flags that change nothing here (each says why)"
_HELP = {
    t.key: f"{t.help}{' (' + ', '.join(t.choices) + ')' if t.choices else ''} [{t.env}]" for t in TUNABLES
}


def _tunable(key: str, *names: str) -> Any:
    return typer.Option(None, *names, help=_HELP[key], rich_help_panel=_TUNING, show_default=False)


def _no_effect(*names: str) -> Any:
    key = names[0].lstrip("-").split("/")[0].replace("-", "_")
    return typer.Option(None, *names, help=NO_EFFECT[key][1] + ".", rich_help_panel=_HOROVODRUN)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hpcdl {__version__}")
        raise typer.Exit()


def run_command(
    ctx: typer.Context,
    command: list[str] = typer.Argument(None, help="The program and its arguments.", show_default=False),
    num_proc: Optional[int] = typer.Option(
        None,
        "-np",
        "--num-proc",
        help="Number of ranks (default: every slot of -H, the hostfile or the allocation).",
    ),
    hosts: Optional[str] = typer.Option(None, "-H", "--hosts", help="Hosts and slots: host1:2,host2:2."),
    hostfile: Optional[Path] = typer.Option(
        None, "--hostfile", "-hostfile", help="Hostfile with lines 'host slots=N'."
    ),
    slots_per_host: Optional[int] = typer.Option(
        None,
        "--slots-per-host",
        "--slots",
        min=1,
        help="Slots of every allocation host (overrides the scheduler's), and of hosts the discovery script "
        "prints without ':slots'.",
    ),
    launcher: str = typer.Option(
        "auto",
        "--launcher",
        help=f"What starts the ranks: {', '.join(launcher_choices())}. auto: the allocation's own launcher "
        "inside one, else ssh for other hosts.",
    ),
    launcher_args: str = typer.Option(
        "", "--launcher-args", help="Extra arguments for the launcher that starts the ranks."
    ),
    use_jsrun: bool = typer.Option(
        False, "--jsrun", help=f"Same as --launcher {Jsrun.name} (horovodrun's flag)."
    ),
    use_gloo: bool = typer.Option(
        False, "--gloo", help="hpcdl's own TCP controller, the default (horovodrun's flag; not with --mpi)."
    ),
    binding_args: str = typer.Option(
        "",
        "--binding-args",
        help="Process binding arguments for mpirun (--mpi) or the allocation's launcher.",
    ),
    ssh_port: Optional[int] = typer.Option(None, "-p", "--ssh-port", help="ssh port of the other hosts."),
    ssh_identity_file: Optional[Path] = typer.Option(None, "-i", "--ssh-identity-file", help="ssh key."),
    ssh_config_file: Optional[Path] = typer.Option(None, "--ssh-config-file", help="ssh -F config file."),
    ssh_host_key_policy: Optional[str] = typer.Option(
        None,
        "--ssh-host-key-policy",
        help="StrictHostKeyChecking for ssh to other hosts: yes, accept-new (trust a host's key on first "
        "use) or no. Default: as your ssh configuration says (OpenSSH: refuse hosts not in known_hosts).",
    ),
    extra_env: list[str] = typer.Option(
        [], "-x", help="Pass NAME (its value here) or NAME=VALUE to every rank; repeatable."
    ),
    use_mpi: bool = typer.Option(False, "--mpi", help="Start the ranks with mpirun/mpiexec."),
    mpirun: str = typer.Option("mpirun", "--mpirun", help="mpirun or mpiexec to use with --mpi."),
    mpi_args: str = typer.Option("", "--mpi-args", help="Extra arguments for mpirun (with --mpi)."),
    tcp: bool = typer.Option(False, "--tcp", help="All traffic between ranks over TCP."),
    min_np: Optional[int] = typer.Option(
        None,
        "--min-np",
        "--min-num-proc",
        help="Elastic: the fewest workers the job may run with.",
        rich_help_panel=_ELASTIC,
    ),
    max_np: Optional[int] = typer.Option(
        None,
        "--max-np",
        "--max-num-proc",
        help="Elastic: the most workers the job may grow to.",
        rich_help_panel=_ELASTIC,
    ),
    host_discovery_script: Optional[Path] = typer.Option(
        None,
        "--host-discovery-script",
        help="Elastic: a program that prints the usable hosts, one 'host:slots' per line; run every second.",
        rich_help_panel=_ELASTIC,
    ),
    elastic_timeout: float = typer.Option(
        600.0,
        "--elastic-timeout",
        help="Elastic: seconds the job may have fewer than --min-np workers before it fails.",
        rich_help_panel=_ELASTIC,
    ),
    reset_limit: Optional[int] = typer.Option(
        None,
        "--reset-limit",
        help="Elastic: the most times the workers may regroup.",
        rich_help_panel=_ELASTIC,
    ),
    blacklist_cooldown_range: Optional[tuple[float, float]] = typer.Option(
        None,
        "--blacklist-cooldown-range",
        metavar="MIN MAX",
        help="Elastic: a host where a worker failed is used again after MIN s, twice as long after each "
        "further failure, at most MAX s (default: never again).",
        rich_help_panel=_ELASTIC,
    ),
    start_timeout: Optional[float] = typer.Option(
        None,
        "--start-timeout",
        help=f"Seconds all ranks may take to meet [{jobenv.START_TIMEOUT}, HOROVOD_START_TIMEOUT; 30].",
    ),
    output_filename: Optional[Path] = typer.Option(
        None, "--output-filename", help="Also write each rank's output to DIR/rank.N/{stdout,stderr}."
    ),
    prefix_timestamp: bool = typer.Option(
        False, "--prefix-output-with-timestamp", "-prefix-timestamp", help="Time-stamp every output line."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite rank logs in --output-filename."),
    verbose: bool = typer.Option(False, "--verbose", help="Print hosts, rendezvous and launch commands."),
    check_build: bool = typer.Option(False, "--check-build", "-cb", help="Print the build matrix and exit."),
    config_file: Optional[Path] = typer.Option(None, "--config-file", help="YAML file of the settings."),
    fusion_threshold_mb: Optional[float] = _tunable("fusion_threshold_mb", "--fusion-threshold-mb"),
    cycle_time_ms: Optional[float] = _tunable("cycle_time_ms", "--cycle-time-ms"),
    cache_capacity: Optional[int] = _tunable("cache_capacity", "--cache-capacity"),
    hierarchical_allreduce: Optional[bool] = _tunable(
        "hierarchical_allreduce", "--hierarchical-allreduce/--no-hierarchical-allreduce"
    ),
    hierarchical_allgather: Optional[bool] = typer.Option(
        None,
        "--hierarchical-allgather/--no-hierarchical-allgather",
        help="The same switch as --hierarchical-allreduce: in hpcdl it covers every collective.",
        rich_help_panel=_TUNING,
        show_default=False,
    ),
    timeline_filename: Optional[str] = _tunable("timeline_filename", "--timeline-filename"),
    timeline_mark_cycles: Optional[bool] = _tunable(
        "timeline_mark_cycles", "--timeline-mark-cycles/--no-timeline-mark-cycles"
    ),
    autotune: Optional[bool] = _tunable("autotune", "--autotune/--no-autotune"),
    autotune_log_file: Optional[str] = _tunable("autotune_log_file", "--autotune-log-file"),
    autotune_warmup_samples: Optional[int] = _tunable("autotune_warmup_samples", "--autotune-warmup-samples"),
    autotune_steps_per_sample: Optional[int] = _tunable(
        "autotune_steps_per_sample", "--autotune-steps-per-sample"
    ),
    no_stall_check: Optional[bool] = _tunable("no_stall_check", "--no-stall-check/--stall-check"),
    stall_check_warning_time_seconds: Optional[float] = _tunable(
        "stall_check_warning_time_seconds", "--stall-check-warning-time-seconds"
    ),
    stall_check_shutdown_time_seconds: Optional[float] = _tunable(
        "stall_check_shutdown_time_seconds", "--stall-check-shutdown-time-seconds"
    ),
    flight_recorder_size: Optional[int] = _tunable("flight_recorder_size", "--flight-recorder-size"),
    log_level: Optional[str] = _tunable("log_level", "--log-level"),
    timeout: Optional[float] = _tunable("timeout", "--timeout", "--gloo-timeout-seconds"),
    transport: Optional[str] = _tunable("transport", "--transport"),
    mpi_library: Optional[str] = _tunable("mpi_library", "--mpi-library"),
    network_interfaces: list[str] = typer.Option(
        [],
        "--network-interface",
        "--network-interfaces",
        help="Network interface(s) for TCP traffic, comma-separated or repeated (each host uses the first "
        f"it has), or an IPv4 address; also used to reach other hosts [{jobenv.IFACE}].",
        rich_help_panel=_TUNING,
    ),
    small_message_bytes: Optional[int] = _tunable("small_message_bytes", "--small-message-bytes"),
    shm_chunk_bytes: Optional[int] = _tunable("shm_chunk_bytes", "--shm-chunk-bytes"),
    shm_stores: Optional[str] = _tunable("shm_stores", "--shm-stores"),
    tcp_spin_us: Optional[int] = _tunable("tcp_spin_us", "--tcp-spin-us"),
    tcp_send_buffer_bytes: Optional[int] = _tunable("tcp_send_buffer_bytes", "--tcp-send-buffer-bytes"),
    tcp_congestion: Optional[str] = _tunable("tcp_congestion", "--tcp-congestion"),
    gpu_operations: Optional[str] = _tunable("gpu_operations", "--gpu-operations"),
    num_nccl_streams: Optional[int] = _tunable("num_nccl_streams", "--num-nccl-streams"),
    disable_nvtx_ranges: Optional[bool] = _tunable(
        "disable_nvtx_ranges", "--disable-nvtx-ranges/--nvtx-ranges"
    ),
    dynamic_process_sets: Optional[bool] = _tunable(
        "dynamic_process_sets", "--dynamic-process-sets/--no-dynamic-process-sets"
    ),
    disable_cache: Optional[bool] = _no_effect("--disable-cache"),
    autotune_bayes_opt_max_samples: Optional[int] = _no_effect("--autotune-bayes-opt-max-samples"),
    autotune_gaussian_process_noise: Optional[float] = _no_effect("--autotune-gaussian-process-noise"),
    mpi_threads_disable: Optional[bool] = _no_effect("--mpi-threads-disable/--no-mpi-threads-disable"),
    thread_affinity: Optional[int] = _no_effect("--thread-affinity"),
    log_with_timestamp: Optional[bool] = _no_effect(
        "--log-with-timestamp/--log-without-timestamp", "--no-log-hide-timestamp/--log-hide-timestamp"
    ),
    version: Optional[bool] = typer.Option(
        None, "-v", "--version", callback=_version, is_eager=True, help="Print hpcdl's version and exit."
    ),
) -> None:
    """Run COMMAND as -np ranks: here, on -H/--hostfile hosts over ssh, or on the batch allocation
    through its own launcher (srun, flux run, ...).

    Example: hpcdl run -np 4 -H node1:2,node2:2 python train.py
    """
    if check_build:
        from hpcdl.cli.check_build import check_build_command

        check_build_command(verbose=verbose, as_json=False)
        return
    try:
        spec, notes = _spec_from_flags(ctx.params)
        for note in notes:
            typer.echo(f"hpcdl run: note: {note}", err=True)
        code = launch(spec)
    except HpcdlError as exc:
        typer.echo(f"hpcdl run: error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def _interfaces(given: list[str]) -> list[str]:
    """--network-interface(s): comma lists and repeats, in order, without duplicates."""
    return list(dict.fromkeys(name.strip() for item in given for name in item.split(",") if name.strip()))


def _spec_from_flags(params: dict[str, Any]) -> tuple[LaunchSpec, list[str]]:
    """Turn parsed flags (and --config-file) into a LaunchSpec and notes on horovodrun flags without effect;
    flags win over the file."""
    settings = load_config_file(params["config_file"]) if params["config_file"] else {}
    interfaces = _interfaces(params["network_interfaces"])
    if len(interfaces) == 1:
        params = {**params, "network_interface": interfaces[0]}
        interfaces = []
    else:
        params = {**params, "network_interface": None}
        if interfaces:
            settings.pop("network_interface", None)
    for tunable in TUNABLES:
        value = params[tunable.key]
        if value is not None:
            settings[tunable.key] = check_value(tunable.key, value, tunable.flag)
    merge_hierarchical(settings, params["hierarchical_allgather"])
    ignored = [key for key in NO_EFFECT if (settings.pop(key, None), params.get(key)) != (None, None)]
    use_mpi = params["use_mpi"] or (
        settings.pop("controller", "gloo").lower() == "mpi" and not params["use_gloo"]
    )
    if params["use_gloo"] and params["use_mpi"]:
        raise LaunchError("--gloo and --mpi choose different controllers; give one of them")
    launcher = params["launcher"]
    if params["use_jsrun"]:
        if launcher not in ("auto", Jsrun.name):
            raise LaunchError(f"--jsrun contradicts --launcher {launcher}; give one of them")
        launcher = Jsrun.name
    start_timeout = params["start_timeout"]
    if start_timeout is None:
        start_timeout = settings.pop("start_timeout", None)
    else:
        settings.pop("start_timeout", None)
    if params["hosts"] and params["hostfile"]:
        raise LaunchError("give hosts with -H or with --hostfile, not both")
    hosts = None
    if params["hosts"]:
        hosts = parse_hosts_arg(params["hosts"])
    elif params["hostfile"]:
        hosts = parse_hostfile(params["hostfile"])

    binding = shlex.split(params["binding_args"])
    mpi_args = " ".join(filter(None, [params["mpi_args"], params["binding_args"]]))
    spec = LaunchSpec(
        command=list(params["command"] or []),
        num_proc=params["num_proc"],
        hosts=hosts,
        settings=settings,
        extra_env=parse_extra_env(params["extra_env"], os.environ),
        ssh=_ssh_options(params),
        output=OutputOptions(params["prefix_timestamp"], params["output_filename"], params["force"]),
        start_timeout=start_timeout,
        slots_per_host=params["slots_per_host"],
        verbose=params["verbose"],
        tcp=params["tcp"],
        mpi=MpiOptions(params["mpirun"], mpi_args) if use_mpi else None,
        elastic=_elastic_options(params),
        launcher=launcher,
        launcher_args=tuple(shlex.split(params["launcher_args"]) + ([] if use_mpi else binding)),
        interfaces=tuple(interfaces),
    )
    return spec, no_effect_notes(ignored)


def _ssh_options(params: dict[str, Any]) -> SshOptions:
    policy = params["ssh_host_key_policy"]
    if policy is not None and policy not in HOST_KEY_POLICIES:
        raise LaunchError(f"--ssh-host-key-policy {policy}: choose one of {', '.join(HOST_KEY_POLICIES)}")
    ssh = (params["ssh_port"], params["ssh_identity_file"], params["ssh_config_file"])
    return SshOptions(*ssh, host_key_policy=policy)


def _elastic_options(params: dict[str, Any]) -> Optional[ElasticOptions]:
    """Elastic mode when --min-np, --max-np or --host-discovery-script is given (like horovodrun)."""
    min_np, max_np, script = params["min_np"], params["max_np"], params["host_discovery_script"]
    if min_np is None and max_np is None and script is None:
        return None
    num_proc = params["num_proc"]
    if min_np is None:
        min_np = num_proc if num_proc is not None else 1
    if max_np is None:
        if num_proc is None and script is not None:
            raise LaunchError("an elastic job with --host-discovery-script needs --max-np (or -np)")
        max_np = num_proc if num_proc is not None else min_np
    return ElasticOptions(
        min_np,
        max_np,
        script,
        params["elastic_timeout"],
        params["reset_limit"],
        params["blacklist_cooldown_range"],
        params["slots_per_host"] or 1,
    )


def register(app: typer.Typer) -> None:
    """Add ``hpcdl run`` to the root app."""
    app.command(
        "run",
        cls=PanelledCommand,
        context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
    )(run_command)
