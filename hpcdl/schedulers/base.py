"""The interface every scheduler backend implements, and the parts of a batch script they share.

A backend turns a JobSpec into ``ScriptParts`` (directives and the launch line, all computed here in
Python); the scheduler's template in ``templates/batch/`` only lays those parts out. Submission, status,
cancel and logs go through the scheduler's own commands.
"""

from __future__ import annotations

import dataclasses
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional

from hpcdl.checkpoint import contract
from hpcdl.schedulers.errors import JobSpecError, SchedulerError, ScriptCheckError
from hpcdl.schedulers.job import JobSpec, SignalSpec
from hpcdl.schedulers.render import ScriptParts, render_parts
from hpcdl.schedulers.shell import check_value, quote, shell_word
from hpcdl.schedulers.site import SiteConfig

COMMAND_TIMEOUT_S = 60.0
PLACEHOLDERS = ("name", "job_id", "array_index")

# Seconds the script waits for its rendezvous server's address line (a Python start on a busy file system).
RENDEZVOUS_START_TIMEOUT_S = 120


@dataclass(frozen=True)
class JobState:
    """One job (or array task) as its scheduler sees it, with hpcdl's common name for the state."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, HELD, SUSPENDED, UNKNOWN
    native: str


def run_command(
    argv: list[str],
    what: str,
    timeout: float = COMMAND_TIMEOUT_S,
    stdin: Optional[str] = None,
    cwd: Optional[Path] = None,
) -> str:
    """Run a scheduler command; its stdout, or a SchedulerError quoting its stderr."""
    try:
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
        )
    except FileNotFoundError:
        raise SchedulerError(
            f"{argv[0]} not found on PATH; {what} needs it (load the scheduler's module?)"
        ) from None
    except subprocess.TimeoutExpired:
        raise SchedulerError(
            f"{quote(argv)} did not answer within {timeout:.0f}s while trying to {what}"
        ) from None
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise SchedulerError(f"could not {what}: {quote(argv)} failed: {message}")
    return done.stdout


def rank_prefix(job: JobSpec, rank: str, local_rank: str) -> list[str]:
    """argv prefix that gives each rank torch.distributed's RANK, LOCAL_RANK, WORLD_SIZE and
    LOCAL_WORLD_SIZE (unless set already) and, for GPU jobs, its GPU(s), then execs the command.

    `rank` and `local_rank` are the launcher's shell expressions. GPUs: the rank indexes into the
    CUDA_VISIBLE_DEVICES the scheduler set (or 0..G-1 when it set none), so it is right both when the launcher
    already narrowed the list and when each rank sees the whole node.
    """
    snippet = (
        f"lr={local_rank}; "
        f'export RANK="${{RANK:-{rank}}}" LOCAL_RANK="${{LOCAL_RANK:-$lr}}" '
        f'WORLD_SIZE="${{WORLD_SIZE:-{job.total_ranks}}}" '
        f'LOCAL_WORLD_SIZE="${{LOCAL_WORLD_SIZE:-{job.resolved_ranks_per_node}}}"; '
    )
    if job.gpus_per_node:
        per_rank, sharing = job.gpu_slice
        all_gpus = " ".join(str(i) for i in range(job.gpus_per_node))
        snippet += (
            'if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then IFS=, read -r -a g <<< "$CUDA_VISIBLE_DEVICES"; '
            f"else g=({all_gpus}); fi; "
            f'p=("${{g[@]:$(( lr * {per_rank} / {sharing} % ${{#g[@]}} )):{per_rank}}}"); '
            'export CUDA_VISIBLE_DEVICES="$(IFS=,; echo "${p[*]}")"; '
        )
    return ["bash", "-c", snippet + 'exec "$@"', "hpcdl-rank"]


class Scheduler(ABC):
    """One batch system: detect it, render a script for it, and drive its commands."""

    name: ClassVar[str]
    rank_variable: ClassVar[str] = ""
    local_rank_variable: ClassVar[str] = ""
    array_variable: ClassVar[Optional[str]] = None
    array_base: ClassVar[int] = 0
    job_id_variable: ClassVar[str] = ""  # the job's id in its environment
    can_requeue: ClassVar[bool] = True
    # Folders searched for its template before templates/batch (a backend that ships its own).
    template_dirs: ClassVar[tuple[Path, ...]] = ()
    # What --checkpoint asks for unless --signal or the site's checkpoint_signal says otherwise: the warning
    # signal and how long before the walltime (the time to reach a commit point and write the checkpoint).
    checkpoint_signal: ClassVar[SignalSpec] = SignalSpec("USR2", 120)

    @classmethod
    @abstractmethod
    def detect(cls) -> bool:
        """Whether this scheduler's submit command is on PATH."""

    @classmethod
    def claims(cls) -> bool:
        """Whether this process runs inside one of this scheduler's jobs and it is here, so that it wins over
        the others found on PATH (Flux inside an instance, even within another scheduler's job)."""
        return False

    # ---- rendering ------------------------------------------------------------------------------
    def render(self, job: JobSpec, site: SiteConfig) -> str:
        """The batch script for ``job``; raises ScriptCheckError if the scheduler would reject it."""
        script = render_parts(self.parts(job, site), self.template_dirs)
        problems = self.validate(script, site)
        if problems:
            raise ScriptCheckError(self.name, problems)
        return script

    @abstractmethod
    def directives(self, job: JobSpec, site: SiteConfig) -> list[str]:
        """The directive bodies (after the ``#SBATCH``-style prefix), site extras included."""

    @abstractmethod
    def launcher(self, job: JobSpec) -> list[str]:
        """The parallel launcher's argv, without the rank command."""

    @abstractmethod
    def validate(self, script: str, site: SiteConfig) -> list[str]:
        """What the real scheduler would reject in this script (empty when it would accept it)."""

    def check_supported(self, job: JobSpec) -> None:
        """Refuse requests this scheduler cannot express (override to add limits)."""
        return None

    def signal_parts(self, job: JobSpec) -> tuple[Optional[int], Optional[str]]:
        """(seconds after start to signal ourselves, or None when the scheduler signals; requeue command)."""
        assert job.signal is not None
        return job.walltime_seconds - job.signal.seconds, None

    def local_rank(self, job: JobSpec) -> str:
        """Shell expression of a rank's index on its node."""
        return self.local_rank_variable

    def first_node_prefix(self) -> list[str]:
        """argv prefix that runs a command on the job's first compute node (empty: the script runs there)."""
        return []

    def rendezvous_command(self, job: JobSpec) -> str:
        """The command of the script's rendezvous server (``hpcdl.runner.batch_rendezvous``), which also holds
        MASTER_PORT where rank 0 runs on the script's host."""
        hold = [] if self.first_node_prefix() else ["--master-port"]
        return quote(
            [job.python, "-m", "hpcdl.runner.batch_rendezvous", "--size", str(job.total_ranks), *hold]
        )

    def master_probe_command(self, job: JobSpec) -> Optional[str]:
        """Where rank 0 runs on another node than the script: shell printing that node's name, a port free
        there for torch.distributed's MASTER_PORT (it cannot be held from here; see README, residual risk)
        and its interface towards the rendezvous."""
        prefix = self.first_node_prefix()
        probe = [job.python, "-m", "hpcdl.runner.batch_rendezvous", "--probe"]
        return quote([*prefix, *probe]) if prefix else None

    def workdir_command(self) -> Optional[str]:
        """Shell that enters the submission directory, where the scheduler does not start there."""
        return None

    @abstractmethod
    def output_path(self, pattern: str, job: JobSpec) -> str:
        """Translate hpcdl placeholders ({name}, {job_id}, {array_index}) to this scheduler's own."""

    def default_output(self, job: JobSpec) -> Optional[str]:
        suffix = "_{array_index}" if (job.array or job.sweep) else ""
        return f"{{name}}-{{job_id}}{suffix}.out"

    def resolved_output(self, job: JobSpec) -> Optional[str]:
        """The output path pattern in hpcdl placeholders, the user's or this scheduler's default."""
        return job.output if job.output is not None else self.default_output(job)

    def array_indices(self, job: JobSpec) -> Optional[tuple[int, ...]]:
        if job.sweep:
            return tuple(range(self.array_base, self.array_base + len(job.sweep)))
        return job.array.indices if job.array else None

    def checkpointed(self, job: JobSpec, site: SiteConfig) -> JobSpec:
        """What ``--checkpoint`` implies here: the warning signal (unless given) and requeue (where this
        scheduler can requeue), so that the training stops at a commit, saves, and runs again."""
        signal = job.signal or (SignalSpec.parse(site.checkpoint_signal) if site.checkpoint_signal else None)
        return dataclasses.replace(
            job, signal=signal or self.checkpoint_signal, requeue=job.requeue or self.can_requeue
        ).validate()

    def checkpoint_exports(self, job: JobSpec, requeue: Optional[str]) -> list[tuple[str, str]]:
        """The environment that tells ``hpcdl.checkpoint.run`` where to save, which signals warn, how rank 0
        requeues the job (empty: it cannot) and the job's id (expanded when the script runs)."""
        assert job.checkpoint is not None and job.signal is not None
        return [
            (contract.PATH_ENV, shell_word(job.checkpoint, "the checkpoint path")),
            (contract.SIGNALS_ENV, f"{job.signal.name},TERM"),
            (contract.REQUEUE_ENV, shell_word(requeue or "", "the requeue command")),
            (contract.JOB_ID_ENV, f'"${{{self.job_id_variable}}}"'),
        ]

    def parts(self, job: JobSpec, site: SiteConfig) -> ScriptParts:
        job.validate()
        if job.checkpoint is not None:
            job = self.checkpointed(job, site)
        self.check_supported(job)
        if (job.array or job.sweep) and self.array_variable is None:
            raise JobSpecError(f"{self.name} has no job arrays; submit one job per sweep point instead")
        rank_command = [*rank_prefix(job, self.rank_variable, self.local_rank(job)), *job.argv]
        launch = quote([*self.launcher(job), *job.launcher_args, *rank_command])
        timer, requeue = self.signal_parts(job) if job.signal else (None, None)
        exports = [("OMP_NUM_THREADS", str(job.resolved_cpus_per_rank))]
        exports += [(k, shell_word(v, f"the value of {k}")) for k, v in job.env.items()]
        if job.checkpoint is not None:
            exports += self.checkpoint_exports(job, requeue)
        cases: list[tuple[int, list[tuple[str, str]]]] = []
        if job.sweep:
            for index, point in zip(self.array_indices(job) or (), job.sweep.points):
                cases.append(
                    (index, [(n, shell_word(v, "sweep value")) for n, v in zip(job.sweep.names, point)])
                )
        return ScriptParts(
            scheduler=self.name,
            directives=self.directives(job, site),
            exports=exports,
            modules=[shell_word(m, "module") for m in job.modules],
            setup=list(job.setup),
            python=shell_word(job.python, "python"),
            python_origin=check_value(job.python_origin, "the origin of python"),
            secret_command=quote([job.python, "-c", "import secrets; print(secrets.token_hex(32))"]),
            debug_dir_command=quote([job.python, "-m", "hpcdl.runner.print_debug_dir"]),
            rendezvous_command=self.rendezvous_command(job),
            rendezvous_timeout_s=RENDEZVOUS_START_TIMEOUT_S,
            master_probe_command=self.master_probe_command(job),
            launch=launch,
            sweep_variable=self.array_variable if job.sweep else None,
            sweep_cases=cases,
            signal=job.signal.name if job.signal else None,
            signal_timer_s=timer,
            requeue_command=requeue,
            workdir_command=self.workdir_command(),
        )

    # ---- driving the scheduler -----------------------------------------------------------------
    @abstractmethod
    def submit(self, script: Path, workdir: Path) -> str:
        """Submit the script with ``workdir`` as the job's working directory; the job id."""

    def check_submission(self, script: Path, workdir: Path) -> None:
        """Ask the scheduler whether it would accept the script, without submitting it (SchedulerError with
        its answer when not); a scheduler that cannot be asked so accepts here."""
        return None

    @abstractmethod
    def status(self, job_id: str) -> list[JobState]:
        """The job's state (one entry per array task where the scheduler lists them)."""

    @abstractmethod
    def cancel(self, job_id: str) -> None:
        """Cancel the job (all its array tasks)."""

    def log_files(self, job_id: str) -> list[Path]:
        """Output files the scheduler itself reports for a job (empty where it reports none)."""
        return []

    def log_globs(self, job: JobSpec) -> list[str]:
        """Where the job's output lands, as globs with ``{job_id}`` still to fill in."""
        pattern = self.resolved_output(job)
        if pattern is None:
            return []
        paths = [pattern]
        if job.error:
            paths.append(job.error)
        return [p.replace("{name}", job.job_name).replace("{array_index}", "*") for p in paths]
