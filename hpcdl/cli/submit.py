"""``hpcdl submit``: render a batch script for this cluster's scheduler and submit it (or print it)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hpcdl.common.exceptions import HpcdlError
from hpcdl.schedulers import (
    ArraySpec,
    JobSpecError,
    SignalSpec,
    Sweep,
    get_scheduler,
    load_site,
    scheduler_names,
)
from hpcdl.schedulers.submission import submit_job, write_script


def _pairs(items: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise JobSpecError(f"--env {item!r} must be NAME=VALUE")
        env[name] = value
    return env


def submit_command(
    command: list[str] = typer.Argument(
        ..., metavar="COMMAND...", help="What each rank runs (a *.py file runs with --python)."
    ),
    scheduler: Optional[str] = typer.Option(
        None,
        "--scheduler",
        "-s",
        help=f"auto|{'|'.join(scheduler_names())} (default: the site's, else auto).",
    ),
    site_file: Optional[Path] = typer.Option(
        None,
        "--site",
        help="Site file laid over HPCDL_SITE, ~/.config/hpcdl/site.yaml and /etc/hpcdl/site.yaml.",
    ),
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", help="Nodes (default 1)."),
    gpus: Optional[int] = typer.Option(
        None, "--gpus", "--gpus-per-node", "-g", help="GPUs per node (default: the site's)."
    ),
    ranks_per_node: Optional[int] = typer.Option(
        None, "--ranks-per-node", help="Ranks per node (default: one per GPU, else 1)."
    ),
    cpus_per_rank: Optional[int] = typer.Option(
        None, "--cpus-per-rank", "-c", help="CPUs per rank; sets OMP_NUM_THREADS."
    ),
    walltime: Optional[str] = typer.Option(
        None, "--time", "-t", help="Walltime: HH:MM:SS, D-HH:MM:SS, minutes, or 2h/90m."
    ),
    job_name: Optional[str] = typer.Option(None, "--job-name", "-J", help="Job name (default hpcdl)."),
    account: Optional[str] = typer.Option(None, "--account", "-A", help="Account / project to charge."),
    partition: Optional[str] = typer.Option(
        None, "--partition", "--queue", "-p", "-q", help="Partition or queue."
    ),
    qos: Optional[str] = typer.Option(None, "--qos", help="Quality of service."),
    constraint: Optional[str] = typer.Option(None, "--constraint", "-C", help="Node feature constraint."),
    job_output: Optional[str] = typer.Option(
        None, "--stdout", help="Job output path; {name}, {job_id}, {array_index} are filled in."
    ),
    job_error: Optional[str] = typer.Option(
        None, "--stderr", help="Job error path (default: with the output)."
    ),
    env: list[str] = typer.Option([], "--env", "-e", help="NAME=VALUE for every rank (repeatable)."),
    modules: list[str] = typer.Option([], "--module", "-m", help="Module to load first (repeatable)."),
    setup: list[str] = typer.Option([], "--setup", help="Shell line run before the launch (repeatable)."),
    signal: Optional[str] = typer.Option(
        None, "--signal", help="Signal before the walltime, SIG@SECONDS (e.g. USR2@90)."
    ),
    requeue: bool = typer.Option(
        False, "--requeue", help="Requeue the job after the signal (needs --signal)."
    ),
    checkpoint: Optional[Path] = typer.Option(
        None,
        "--checkpoint",
        help="Checkpoint directory of a training using hpcdl.checkpoint.run: the scheduler's warning signal "
        "(unless --signal), requeue where the scheduler can, the path passed to the ranks.",
    ),
    array: Optional[str] = typer.Option(
        None, "--array", help="Job array indices: 0-9, 0-9:2, 1,3,5, with %LIMIT."
    ),
    sweep: list[str] = typer.Option(
        [], "--sweep", help="NAME=V1,V2,...: one array task per combination (repeatable)."
    ),
    launcher_args: list[str] = typer.Option(
        [], "--launcher-arg", help="Extra argument for the scheduler's launcher."
    ),
    python: Optional[str] = typer.Option(
        None,
        "--python",
        help="Interpreter of hpcdl's helpers and of a *.py COMMAND on the nodes (default: the site's "
        "python:, else the one hpcdl runs in).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the script instead of submitting it."),
    script_out: Optional[Path] = typer.Option(
        None, "-o", "--output", help="Write the script to FILE (and submit it unless --dry-run)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite the -o FILE if it exists."),
) -> None:
    """Turn one job description into the right batch script for this cluster and submit it."""
    try:
        site = load_site(site_file)
        if requeue and not signal:
            raise JobSpecError(
                "--requeue needs --signal SIG@SECONDS: the job requeues after it has been signalled"
            )
        job = site.make_job(
            command,
            nodes=nodes,
            gpus_per_node=gpus,
            ranks_per_node=ranks_per_node,
            cpus_per_rank=cpus_per_rank,
            walltime=walltime,
            job_name=job_name,
            account=account,
            partition=partition,
            qos=qos,
            constraint=constraint,
            output=job_output,
            error=job_error,
            env=_pairs(env),
            modules=modules,
            setup=setup,
            signal=SignalSpec.parse(signal) if signal else None,
            requeue=requeue or None,
            array=ArraySpec.parse(array) if array else None,
            sweep=Sweep.parse(sweep) if sweep else None,
            launcher_args=launcher_args,
            python=python,
            checkpoint=str(checkpoint.expanduser().absolute()) if checkpoint else None,
        )
        backend = get_scheduler(scheduler or site.scheduler)
        if dry_run:
            script = backend.render(job, site)
            if script_out is not None:
                write_script(script, script_out, force)
                typer.echo(f"hpcdl: wrote {script_out} ({backend.name})", err=True)
            else:
                typer.echo(script, nl=False)
            return
        submitted = submit_job(backend, job, site, script_out, force)
    except HpcdlError as exc:
        typer.echo(f"hpcdl submit: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(
        f"hpcdl: submitted {submitted.script} to {backend.name}; "
        f"follow it with: hpcdl jobs status {submitted.job_id}",
        err=True,
    )
    typer.echo(submitted.job_id)


def register(app: typer.Typer) -> None:
    """Add ``hpcdl submit`` to the root app."""
    app.command(
        "submit",
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(submit_command)
