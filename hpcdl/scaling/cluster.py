"""A study on a cluster: one batch job per worker count through ``hpcdl.schedulers`` (its repeats as the
tasks of a job array where the scheduler has arrays, else one job per repeat), recorded in ``jobs.json``
so that ``hpcdl scaling collect`` and ``hpcdl jobs watch --study`` find them later.

The jobs write their step records into the study directory, which must therefore be on a file system the
compute nodes share with the submitting host (as the home and work file systems of clusters are).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from hpcdl.common.output_file import write_output_file
from hpcdl.common.steps import REPEAT_VARIABLE
from hpcdl.scaling.study import JOBS_FILE, StudyError, StudySpec, mark_failed, point_dir
from hpcdl.schedulers import JobSpec, Scheduler, SiteConfig, Sweep, get_scheduler, load_site, watch
from hpcdl.schedulers.submission import GroupSubmissionError, Submitted, prepare_job, submit_group
from hpcdl.schedulers.watch import JobStatus, WatchedJob


@dataclass(frozen=True)
class StudyJob:
    workers: int
    job_id: str
    scheduler: str
    repeats: list[int]
    script: str

    @property
    def watched(self) -> WatchedJob:
        return WatchedJob(self.job_id, self.scheduler, f"scaling-W{self.workers}")


@dataclass
class BatchOptions:
    """What ``hpcdl submit`` would take, for every job of the study."""

    scheduler: Optional[str] = None
    site_file: Optional[Path] = None
    ranks_per_node: Optional[int] = None
    gpus_per_node: Optional[int] = None
    cpus_per_rank: Optional[int] = None
    walltime: Optional[str] = None
    account: Optional[str] = None
    partition: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)
    modules: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    launcher_args: list[str] = field(default_factory=list)
    python: Optional[str] = None  # the jobs' interpreter (default: the site's, else the one hpcdl runs in)


def geometry(workers: int, ranks_per_node: int, gpus_per_node: int) -> tuple[int, int, int]:
    """(nodes, ranks per node, GPUs per node) of the job of one point: full nodes of ``ranks_per_node``
    ranks, or one node with fewer ranks (and a matching share of its GPUs)."""
    if workers <= ranks_per_node:
        gpus = gpus_per_node if not gpus_per_node else max(1, gpus_per_node * workers // ranks_per_node)
        return 1, workers, gpus
    if workers % ranks_per_node:
        raise StudyError(
            f"{workers} workers do not fill nodes of {ranks_per_node} ranks; use worker counts that are "
            f"multiples of --ranks-per-node ({ranks_per_node}) or below it"
        )
    return workers // ranks_per_node, ranks_per_node, gpus_per_node


def save_jobs(directory: Path, jobs: list[StudyJob]) -> None:
    text = json.dumps([asdict(j) for j in jobs], indent=2) + "\n"
    write_output_file(directory / JOBS_FILE, "study's job list", text, replace=True, mode=0o666)


def load_jobs(directory: Path) -> list[StudyJob]:
    path = directory / JOBS_FILE
    if not path.is_file():
        raise StudyError(f"{directory} has no {JOBS_FILE}: its points were not submitted as batch jobs")
    try:
        return [StudyJob(**entry) for entry in json.loads(path.read_text(encoding="utf-8"))]
    except (OSError, ValueError, TypeError) as exc:
        raise StudyError(f"cannot read {path}: {exc}") from None


@dataclass(frozen=True)
class PlannedJob:
    """One batch job of a study, rendered and checked, not yet submitted."""

    workers: int
    repeats: list[int]
    job: JobSpec
    script: Path


@dataclass(frozen=True)
class BatchPlan:
    site: SiteConfig
    backend: Scheduler
    jobs: list[PlannedJob]


def plan_jobs(spec: StudySpec, directory: Path, options: BatchOptions) -> BatchPlan:
    """Every job of the study, checked against the site and its scheduler (geometry, walltime, the
    script the scheduler would accept) before anything is written or submitted."""
    site = load_site(options.site_file)
    backend = get_scheduler(options.scheduler or site.scheduler)
    gpus = options.gpus_per_node if options.gpus_per_node is not None else (site.gpus_per_node or 0)
    per_node = options.ranks_per_node or gpus or 1
    arrays = backend.array_variable is not None and spec.repeats > 1
    batches = [list(range(1, spec.repeats + 1))] if arrays else [[r] for r in range(1, spec.repeats + 1)]
    shapes = {workers: geometry(workers, per_node, gpus) for workers in spec.workers}
    python, python_origin = site.python_choice(options.python)
    planned = []
    for workers, (nodes, ranks_per_node, gpus_per_node) in shapes.items():
        where = point_dir(directory, workers).resolve()
        for repeats in batches:
            single = None if arrays else repeats[0]
            label = "" if arrays else f"-r{single}"
            output = "job-{job_id}_{array_index}.out" if arrays else f"job{label}-{{job_id}}.out"
            job = site.make_job(
                spec.rank_command(workers, python),
                nodes=nodes,
                ranks_per_node=ranks_per_node,
                gpus_per_node=gpus_per_node,
                cpus_per_rank=options.cpus_per_rank,
                walltime=options.walltime,
                job_name=f"scaling-W{workers}",
                account=options.account,
                partition=options.partition,
                qos=options.qos,
                constraint=options.constraint,
                output=str(where / output),
                env={**options.env, **spec.environment(directory, workers, single)},
                modules=options.modules,
                setup=options.setup,
                sweep=Sweep.parse([f"{REPEAT_VARIABLE}={','.join(map(str, repeats))}"]) if arrays else None,
                launcher_args=options.launcher_args,
                python=python,
                python_origin=python_origin,
            )
            backend.render(job, site)  # raises what the scheduler would reject
            planned.append(PlannedJob(workers, repeats, job, where / f"job{label}.{backend.name}.sh"))
    return BatchPlan(site, backend, planned)


def submit_study(
    plan: BatchPlan,
    directory: Path,
    force: bool = False,
    on_submitted: Callable[[StudyJob], None] = lambda job: None,
) -> list[StudyJob]:
    """Submit the planned jobs, all or none (``schedulers.submission.submit_group``: the scheduler checks
    every script first, and a refusal part-way cancels the jobs submitted before it). ``jobs.json`` is
    updated after each submission, so it always lists the jobs that are in."""
    workdir = directory.resolve()
    group = []
    for planned in plan.jobs:
        planned.script.parent.mkdir(parents=True, exist_ok=True)
        group.append(prepare_job(plan.backend, planned.job, plan.site, planned.script, force, workdir))
    by_script = {planned.script: planned for planned in plan.jobs}
    jobs: list[StudyJob] = []

    def entry(submitted: Submitted) -> StudyJob:
        planned = by_script[submitted.script]
        return StudyJob(
            planned.workers, submitted.job_id, plan.backend.name, planned.repeats, str(planned.script)
        )

    def submitted_one(submitted: Submitted) -> None:
        jobs.append(entry(submitted))
        save_jobs(directory, jobs)
        on_submitted(jobs[-1])

    try:
        submit_group(plan.backend, group, submitted_one)
    except GroupSubmissionError as exc:
        save_jobs(directory, [entry(left) for left in exc.left])  # the cancelled jobs are not the study's
        raise
    return jobs


def finished_jobs(
    directory: Path,
    wait_for_them: bool,
    timeout: float = watch.DEFAULT_TIMEOUT_S,
    interval: float = watch.DEFAULT_INTERVAL_S,
    on_poll: Callable[[list[JobStatus]], None] = lambda statuses: None,
) -> list[JobStatus]:
    """The study's jobs once all have ended (waiting for them when asked); StudyError naming the jobs that
    are still queued or running, or that did not complete."""
    jobs = [job.watched for job in load_jobs(directory)]
    statuses = watch.wait(jobs, timeout, interval, on_poll) if wait_for_them else watch.poll(jobs)
    on_poll(statuses)
    pending = [s for s in statuses if not s.finished]
    if pending:
        listing = ", ".join(f"{s.job.job_id} ({s.summary()})" for s in pending)
        raise StudyError(
            f"{len(pending)} of {len(statuses)} job(s) have not finished: {listing}; follow them with "
            f"hpcdl jobs watch --study {directory}, or collect with --wait"
        )
    failed = [s for s in statuses if not s.succeeded and not s.error]
    if failed:
        listing = ", ".join(f"{s.job.job_id} ({s.summary()})" for s in failed)
        reason = (
            f"job(s) {listing} did not complete; their output is in {directory}/points/W*/job-*.out "
            "(hpcdl jobs logs JOB)"
        )
        mark_failed(directory, reason)  # every job has ended: a corrected rerun may reuse the directory
        raise StudyError(reason)
    return statuses
