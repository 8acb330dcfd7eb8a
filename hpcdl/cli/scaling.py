"""``hpcdl scaling run|collect|report``: strong and weak scaling studies read against T = G·f(W) + C(W)."""

from __future__ import annotations

import datetime
import os
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from hpcdl.cli.submit import _pairs as env_pairs
from hpcdl.common import progress
from hpcdl.common.exceptions import HpcdlError
from hpcdl.scaling import cluster, local, publish, textplot
from hpcdl.scaling import report as report_module
from hpcdl.scaling import study as study_module
from hpcdl.scaling.study import StudyError, StudySpec, Workload
from hpcdl.schedulers import scheduler_names
from hpcdl.schedulers.submission import GroupSubmissionError
from hpcdl.schedulers.watch import JobStatus

scaling_app = typer.Typer(
    help="Scaling studies: run a workload at several worker counts, fit T = G·f(W) + C(W), report and plot.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

_THRESHOLD_HELP = "Efficiency under which adding workers no longer pays."


def _counts(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise StudyError(f"{what} {text!r} must be a comma list of whole numbers, e.g. 1,2,4,8") from None
    if not values:
        raise StudyError(f"{what} is empty; give a comma list such as 1,2,4,8")
    return values


def _params(items: list[str]) -> dict[str, list[str]]:
    params: dict[str, list[str]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not values:
            raise StudyError(f"--param {item!r} must look like NAME=V1,V2,... (one value per worker count)")
        if name in params:
            raise StudyError(f"--param {name} is given twice; list all its values in one --param")
        params[name] = values.split(",")
    return params


def _fail(command: str, exc: HpcdlError) -> typer.Exit:
    typer.echo(f"hpcdl scaling {command}: {exc}", err=True)
    return typer.Exit(2)


def _publish_and_show(
    directory: Path,
    threshold: float,
    allreduce_file: Optional[Path],
    fit_from_study: bool,
    predict: Optional[str],
    force: bool,
) -> None:
    """Collect the study's records, fit, write the report files and print the report with text plots."""
    from hpcdl.scaling.results import collect

    spec = study_module.load(directory)
    results = collect(spec, directory)
    records = None
    if allreduce_file is None and not fit_from_study and (directory / study_module.ALLREDUCE_FILE).is_file():
        allreduce_file = directory / study_module.ALLREDUCE_FILE
    if allreduce_file is not None and not fit_from_study:
        records = local.load_allreduce(allreduce_file)
    report = report_module.build(
        results, records, threshold, _counts(predict, "--predict") if predict else None
    )
    written = publish.publish(report, directory, force)
    typer.echo(report_module.text(report))
    typer.echo("")
    typer.echo(textplot.render(report))
    typer.echo("")
    if written.plot_error:
        typer.echo(f"hpcdl scaling: {written.plot_error}", err=True)
    typer.echo(
        f"hpcdl scaling: report in {directory / 'report.md'} (CSV, JSON and plots beside it)", err=True
    )


@scaling_app.command(
    "run", context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True}
)
def run_command(
    command: Optional[list[str]] = typer.Argument(
        None,
        metavar="[COMMAND...]",
        help="Your training script and its arguments ({workers}, {batch}, {global_batch}, {NAME} are "
        "filled in per point); none: the built-in --model.",
    ),
    strong: bool = typer.Option(False, "--strong", help="Strong scaling: the global batch is split over W."),
    weak: bool = typer.Option(
        False, "--weak", help="Weak scaling: each worker keeps its batch (or --param)."
    ),
    workers: str = typer.Option("1,2,4", "--workers", "-W", help="Worker counts, e.g. 1,2,4,8."),
    model: Optional[str] = typer.Option(
        None, "--model", help="Built-in model without COMMAND: small (default) | resnet50."
    ),
    image_size: int = typer.Option(0, "--image-size", help="Image side of the built-in model (0: its own)."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", help="--strong: samples per step."),
    batch: Optional[int] = typer.Option(None, "--batch", help="--weak: samples per worker per step."),
    param: list[str] = typer.Option(
        [], "--param", help="--weak: NAME=V1,V2,... one value per worker count, for your script (repeatable)."
    ),
    steps: int = typer.Option(20, "--steps", help="Measured steps of the built-in model per run."),
    warmup: int = typer.Option(5, "--warmup", help="Steps discarded at the start of every run."),
    repeats: int = typer.Option(3, "--repeats", help="Runs per worker count (their spread is kept)."),
    threads: Optional[int] = typer.Option(
        None, "--threads", help="torch threads per rank of the built-in model (default: cores / largest W)."
    ),
    timeline: int = typer.Option(
        0, "--timeline", help="Record an engine timeline of this many measured steps per run (rank 0)."
    ),
    measure_allreduce: bool = typer.Option(
        False, "--measure-allreduce", help="Also run hpcdl bench allreduce here to measure B and α."
    ),
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", help="Study directory (default: scaling-MODE-DATE-TIME)."
    ),
    force: bool = typer.Option(False, "--force", help="Reuse an existing study directory."),
    run_timeout: float = typer.Option(
        local.DEFAULT_RUN_TIMEOUT_S, "--run-timeout", help="Seconds one run may take."
    ),
    threshold: float = typer.Option(report_module.DEFAULT_THRESHOLD, "--threshold", help=_THRESHOLD_HELP),
    submit: bool = typer.Option(False, "--submit", help="One batch job per worker count instead of here."),
    scheduler: Optional[str] = typer.Option(
        None, "--scheduler", "-s", help=f"--submit: auto|{'|'.join(scheduler_names())}"
    ),
    site_file: Optional[Path] = typer.Option(None, "--site", help="--submit: site file."),
    ranks_per_node: Optional[int] = typer.Option(None, "--ranks-per-node", help="--submit: ranks per node."),
    gpus: Optional[int] = typer.Option(None, "--gpus", "--gpus-per-node", help="--submit: GPUs per node."),
    cpus_per_rank: Optional[int] = typer.Option(
        None, "--cpus-per-rank", "-c", help="--submit: CPUs per rank."
    ),
    walltime: Optional[str] = typer.Option(None, "--time", "-t", help="--submit: walltime of each job."),
    account: Optional[str] = typer.Option(None, "--account", "-A", help="--submit: account."),
    partition: Optional[str] = typer.Option(None, "--partition", "-p", help="--submit: partition or queue."),
    env: list[str] = typer.Option([], "--env", "-e", help="--submit: NAME=VALUE for every rank."),
    modules: list[str] = typer.Option([], "--module", "-m", help="--submit: module to load first."),
    setup: list[str] = typer.Option([], "--setup", help="--submit: shell line run before the launch."),
    python: Optional[str] = typer.Option(
        None, "--python", help="--submit: the jobs' Python (default: the site's python:, else this one)."
    ),
    no_progress: bool = typer.Option(False, "--no-progress", help=progress.NO_PROGRESS_HELP),
) -> None:
    """Measure a scaling study: every worker count, --repeats times, here or as batch jobs."""
    try:
        if strong == weak:
            raise StudyError(
                "say which study: --strong (global batch split over W) or --weak (batch per worker)"
            )
        mode = "strong" if strong else "weak"
        counts = _counts(workers, "-W")
        user_command = tuple(command or ())
        if user_command and model is not None:
            raise StudyError("give either COMMAND (your script) or --model (the built-in workload), not both")
        spec = StudySpec(
            mode=mode,
            workers=counts,
            workload=Workload(command=user_command)
            if user_command
            else Workload(model=model or "small", image_size=image_size),
            global_batch=global_batch,
            batch=batch,
            params=_params(param),
            steps=steps,
            warmup=warmup,
            repeats=repeats,
            threads=threads if threads is not None else -1,
            timeline_steps=timeline,
            launch="batch" if submit else "local",
        )
        spec.fill_defaults(os.cpu_count() or 1).validate()
        if submit and measure_allreduce:
            raise StudyError(
                "--measure-allreduce runs here; on a cluster run hpcdl bench allreduce --json on the nodes "
                "and pass the records to hpcdl scaling report --allreduce"
            )
        if measure_allreduce and max(counts) < 2:
            raise StudyError("--measure-allreduce needs a worker count above 1 (an allreduce of one rank)")
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        directory = output or Path(f"scaling-{mode}-{stamp}")
        batch_plan = None
        if submit:
            options = cluster.BatchOptions(
                scheduler=scheduler,
                site_file=site_file,
                ranks_per_node=ranks_per_node,
                gpus_per_node=gpus,
                cpus_per_rank=cpus_per_rank,
                walltime=walltime,
                account=account,
                partition=partition,
                env=env_pairs(env),
                modules=modules,
                setup=setup,
                python=python,
            )
            batch_plan = cluster.plan_jobs(spec, directory, options)  # everything checked, nothing written
        study_module.stamp(spec, "hpcdl scaling " + shlex.join(sys.argv[2:]))
        study_module.create(directory, spec, force)
        try:
            if batch_plan is not None:
                _submit(spec, directory, batch_plan, force, no_progress)
                return
            _run_here(spec, directory, run_timeout, measure_allreduce, no_progress)
        except GroupSubmissionError as exc:
            if not exc.left:  # jobs it could not cancel may run: the directory stays theirs
                study_module.mark_failed(directory, str(exc))
            raise
        except HpcdlError as exc:
            study_module.mark_failed(directory, str(exc))
            raise
        _publish_and_show(directory, threshold, None, False, None, force)
    except HpcdlError as exc:
        raise _fail("run", exc) from None


def _run_here(
    spec: StudySpec, directory: Path, run_timeout: float, measure_allreduce: bool, no_progress: bool
) -> None:
    total = len(study_module.plan(spec)) + (1 if measure_allreduce else 0)
    with progress.bar("scaling study", total, no_progress=no_progress) as bar:

        def on_event(event: local.RunEvent) -> None:
            label = f"W={event.run.workers} repeat {event.run.repeat}/{spec.repeats}"
            if event.kind == "start":
                bar.update(description=label)
                return
            result = event.result
            assert result is not None
            comm = "" if result.comm_s is None else f", waits {result.comm_s * 1e3:.2f} ms"
            bar.log(f"{label}: {result.step_s * 1e3:.2f} ms per step{comm} ({event.seconds:.1f} s)")
            bar.advance()

        results = local.run_study(spec, directory, on_event, run_timeout)
        if measure_allreduce:
            largest = max(spec.workers)
            bar.update(description=f"hpcdl bench allreduce -np {largest}")
            sizes = [r.reduced_bytes for r in results if r.reduced_bytes]
            path = local.measure_allreduce(directory, largest, max(sizes) if sizes else None, run_timeout)
            bar.log(f"allreduce records in {path}")
            bar.advance()


def _submit(
    spec: StudySpec, directory: Path, batch_plan: cluster.BatchPlan, force: bool, no_progress: bool
) -> None:
    with progress.bar("submitting", len(spec.workers), no_progress=no_progress) as bar:

        def on_submitted(job: cluster.StudyJob) -> None:
            repeats = ",".join(map(str, job.repeats))
            bar.log(f"W={job.workers} (repeat {repeats}): {job.scheduler} job {job.job_id}")
            if job.repeats[-1] == spec.repeats:
                bar.advance()

        cluster.submit_study(batch_plan, directory, force, on_submitted)
    typer.echo(str(directory))
    typer.echo(
        f"hpcdl scaling: submitted; follow the jobs with: hpcdl jobs watch --study {directory}; "
        f"then: hpcdl scaling collect {directory}",
        err=True,
    )


@scaling_app.command("collect")
def collect_command(
    directory: Path = typer.Argument(..., help="The study directory (hpcdl scaling run -o)."),
    wait: bool = typer.Option(False, "--wait", help="Wait for the study's jobs to end first."),
    timeout: float = typer.Option(24 * 3600.0, "--timeout", help="--wait: seconds to wait at most."),
    interval: float = typer.Option(5.0, "--interval", help="--wait: seconds between polls."),
    threshold: float = typer.Option(report_module.DEFAULT_THRESHOLD, "--threshold", help=_THRESHOLD_HELP),
    allreduce_file: Optional[Path] = typer.Option(
        None, "--allreduce", help="hpcdl bench allreduce --json records taken on the study's nodes."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite report files hpcdl did not write."),
    no_progress: bool = typer.Option(False, "--no-progress", help=progress.NO_PROGRESS_HELP),
) -> None:
    """Gather a submitted study once its jobs ended (or --wait for them), then write its report."""
    try:
        spec = study_module.load(directory)
        if spec.launch == "batch":
            jobs = cluster.load_jobs(directory)
            with progress.bar("jobs finished", len(jobs), no_progress=no_progress) as bar:

                def on_poll(statuses: list[JobStatus]) -> None:
                    bar.update(completed=sum(1 for s in statuses if s.finished))

                cluster.finished_jobs(directory, wait, timeout, interval, on_poll)
        _publish_and_show(directory, threshold, allreduce_file, False, None, force)
    except HpcdlError as exc:
        raise _fail("collect", exc) from None


@scaling_app.command("report")
def report_command(
    directory: Path = typer.Argument(..., help="The study directory."),
    threshold: float = typer.Option(report_module.DEFAULT_THRESHOLD, "--threshold", help=_THRESHOLD_HELP),
    allreduce_file: Optional[Path] = typer.Option(
        None,
        "--allreduce",
        help="hpcdl bench allreduce --json records from the study's nodes (default: the study's, if any).",
    ),
    fit_from_study: bool = typer.Option(
        False, "--fit-from-study", help="Fit B and α to the study even when allreduce records exist."
    ),
    predict: Optional[str] = typer.Option(
        None, "--predict", help="Worker counts to predict, e.g. 16,64,256."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite report files hpcdl did not write."),
) -> None:
    """Fit the model to a finished study and write report.md, results.csv/json and the plots."""
    try:
        _publish_and_show(directory, threshold, allreduce_file, fit_from_study, predict, force)
    except HpcdlError as exc:
        raise _fail("report", exc) from None


def register(app: typer.Typer) -> None:
    """Add ``hpcdl scaling`` to the root app."""
    app.add_typer(scaling_app, name="scaling")
