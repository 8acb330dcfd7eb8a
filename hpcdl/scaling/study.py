"""What a scaling study is: its mode, worker counts, workload and repetitions, and where its runs live.

A study is a directory. ``study.json`` holds the definition; each point (one worker count) has
``points/W<N>/``, and each repetition of it ``points/W<N>/repeat-<r>/`` with the ranks' step records
(:mod:`hpcdl.common.steps`). Runs of a rank get the study's contract in their environment
(``HPCDL_SCALING_DIR``, ``HPCDL_SCALING_REPEAT``, ``HPCDL_SCALING_BATCH``, ...), and placeholders
``{workers}``, ``{batch}``, ``{global_batch}`` and ``{NAME}`` of ``--param NAME=...`` in a user's command
are filled in per point.

Strong scaling keeps the global batch and splits it over the workers; weak scaling keeps the per-worker
batch (or pairs the values of ``--param NAME=V1,V2,...`` with the worker counts: the workload grows as the
user says it should).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import re
import shutil
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from hpcdl._version import __version__
from hpcdl.common import steps
from hpcdl.common.exceptions import HpcdlError
from hpcdl.common.output_file import write_output_file

FORMAT = 1
STUDY_FILE = "study.json"
JOBS_FILE = "jobs.json"  # the batch jobs of a submitted study
ALLREDUCE_FILE = "allreduce.jsonl"  # hpcdl bench allreduce records taken with the study
FAILED_FILE = "failed.txt"  # why the study's runs (or its submission) failed, written when they did
# What a study's runs write into its directory (the report files come later): all of it hpcdl's own.
RUN_OUTPUTS = (STUDY_FILE, FAILED_FILE, JOBS_FILE, ALLREDUCE_FILE, "points")
MODES = ("strong", "weak")
MODEL_NAMES = ("small", "resnet50")  # hpcdl.scaling.models.MODELS, named here without importing torch
_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class StudyError(HpcdlError):
    """A study cannot be defined, run, collected or reported as asked; the message says what to change."""


@dataclass(frozen=True)
class Workload:
    """The built-in synthetic model (``model``) or the user's own command (``command``)."""

    model: Optional[str] = None
    image_size: int = 0
    command: tuple[str, ...] = ()

    @property
    def is_synthetic(self) -> bool:
        return self.model is not None

    def describe(self) -> str:
        if self.model is not None:
            size = f", {self.image_size}x{self.image_size} images" if self.image_size else ""
            return f"built-in {self.model} model on synthetic data{size}"
        return " ".join(self.command)


@dataclass
class StudySpec:
    mode: str
    workers: list[int]
    workload: Workload
    global_batch: Optional[int] = None  # strong
    batch: Optional[int] = None  # weak: per worker
    params: dict[str, list[str]] = field(default_factory=dict)
    steps: int = 20
    warmup: int = 5
    repeats: int = 3
    threads: int = 0  # torch threads per rank of the built-in model (0: torch's default; -1: not yet chosen)
    timeline_steps: int = 0
    launch: str = "local"  # local | batch
    created: str = ""
    host: str = ""
    cpus: int = 0
    hpcdl_version: str = __version__
    command_line: str = ""

    def fill_defaults(self, cpus: int) -> StudySpec:
        """Defaults of the built-in model: a batch of 32 per worker at the largest count, and, for a local
        study, the cores shared out over the largest count's ranks, so every point gives each rank the same
        share (batch jobs leave the threads to OMP_NUM_THREADS, set from --cpus-per-rank)."""
        if self.workload.is_synthetic and self.global_batch is None and self.batch is None:
            if self.mode == "strong":
                self.global_batch = 32 * max(self.workers)
            else:
                self.batch = 32
        if self.threads < 0:
            self.threads = 0 if self.launch == "batch" else max(1, cpus // max(self.workers))
        return self

    def validate(self) -> StudySpec:
        if self.mode not in MODES:
            raise StudyError(f"mode {self.mode!r} is not known; use --strong or --weak")
        if not self.workers:
            raise StudyError("no worker counts given; use e.g. -W 1,2,4,8")
        if any(w < 1 for w in self.workers):
            raise StudyError(f"worker counts must be at least 1, got {self.workers}")
        if len(set(self.workers)) != len(self.workers):
            raise StudyError(f"worker counts {self.workers} repeat a value; give each once")
        self.workers = sorted(self.workers)
        if self.workload.model is not None and self.workload.model not in MODEL_NAMES:
            raise StudyError(f"no built-in model {self.workload.model!r}; choose {' or '.join(MODEL_NAMES)}")
        for name, value, least in (("--steps", self.steps, 1), ("--warmup", self.warmup, 0)):
            if value < least:
                raise StudyError(f"{name} must be at least {least}, got {value}")
        if self.repeats < 1:
            raise StudyError(f"--repeats must be at least 1, got {self.repeats}")
        if self.mode == "strong":
            self._check_strong()
        elif self.global_batch is not None:
            raise StudyError(
                "--global-batch belongs to --strong studies; a --weak study fixes --batch per worker"
            )
        if self.workload.is_synthetic and self.params:
            raise StudyError(
                "--param sweeps a parameter of your own script; the built-in model takes --batch"
            )
        for name, values in self.params.items():
            if not _PARAM_NAME.match(name):
                raise StudyError(f"--param name {name!r} must be a variable name (letters, digits, _)")
            if len(values) != len(self.workers):
                raise StudyError(
                    f"--param {name} has {len(values)} values for {len(self.workers)} worker counts "
                    f"({','.join(map(str, self.workers))}); give one value per worker count, in their order"
                )
        if self.workload.is_synthetic and self.batch_for(self.workers[0]) is None:
            raise StudyError(
                "the built-in model needs a batch: --global-batch N (--strong) or --batch N (--weak)"
            )
        return self

    def _check_strong(self) -> None:
        if self.batch is not None:
            raise StudyError(
                "--batch fixes the per-worker batch of a --weak study; --strong takes --global-batch"
            )
        if self.params:
            raise StudyError("--param grows a workload with the workers: that is a --weak study")
        if self.global_batch is None:
            return
        multiple = math.lcm(*self.workers)
        uneven = [w for w in self.workers if self.global_batch % w]
        if uneven:
            suggestion = max(multiple, self.global_batch - self.global_batch % multiple)
            raise StudyError(
                f"global batch {self.global_batch} does not split evenly over {uneven[0]} workers; "
                f"use a multiple of {multiple} (e.g. --global-batch {suggestion})"
            )

    # ---- per point ------------------------------------------------------------------------------------
    def batch_for(self, workers: int) -> Optional[int]:
        """Samples per worker per step at this worker count (None when the script decides)."""
        if self.mode == "strong":
            return None if self.global_batch is None else self.global_batch // workers
        return self.batch

    def params_for(self, workers: int) -> dict[str, str]:
        index = self.workers.index(workers)
        return {name: values[index] for name, values in self.params.items()}

    def work_ratio(self, workers: int, base: int) -> float:
        """How much more work a step does at ``workers`` than at ``base`` (strong: 1, weak: workers/base)."""
        return 1.0 if self.mode == "strong" else workers / base

    def environment(self, directory: Path, workers: int, repeat: Optional[int]) -> dict[str, str]:
        """The variables every rank of one run gets (``repeat`` None: set per array task by the job)."""
        env = {
            steps.DIR_VARIABLE: str(point_dir(directory, workers).resolve()),
            steps.WARMUP_VARIABLE: str(self.warmup),
            steps.WORKERS_VARIABLE: str(workers),
        }
        if repeat is not None:
            env[steps.REPEAT_VARIABLE] = str(repeat)
        batch = self.batch_for(workers)
        if batch is not None:
            env[steps.BATCH_VARIABLE] = str(batch)
            env[steps.GLOBAL_BATCH_VARIABLE] = str(batch * workers)
        if self.timeline_steps:
            env[steps.TIMELINE_VARIABLE] = str(self.timeline_steps)
        env.update(self.params_for(workers))
        return env

    def rank_command(self, workers: int, python: str) -> list[str]:
        """What each rank runs at this worker count."""
        if self.workload.is_synthetic:
            command = [python, "-m", "hpcdl.scaling.synthetic", "--model", str(self.workload.model)]
            command += ["--batch", str(self.batch_for(workers)), "--steps", str(self.steps)]
            command += ["--warmup", str(self.warmup), "--threads", str(self.threads)]
            if self.workload.image_size:
                command += ["--image-size", str(self.workload.image_size)]
            return command
        values = {"workers": str(workers), **self.params_for(workers)}
        batch = self.batch_for(workers)
        if batch is not None:
            values.update(batch=str(batch), global_batch=str(batch * workers))
        filled = [
            _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), a) for a in self.workload.command
        ]
        return [python, "-m", "hpcdl.scaling.runtimer", *filled]

    # ---- persistence --------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["workload"]["command"] = list(self.workload.command)
        return {"format": FORMAT, **data}

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str) -> StudySpec:
        if data.get("format") != FORMAT:
            raise StudyError(
                f"{source} is not a study of format {FORMAT} (written by another hpcdl version?)"
            )
        values = {k: v for k, v in data.items() if k != "format"}
        workload = values.pop("workload")
        workload["command"] = tuple(workload.get("command", ()))
        try:
            return cls(workload=Workload(**workload), **values)
        except TypeError as exc:
            raise StudyError(f"{source} is not a readable study definition: {exc}") from None


def point_dir(directory: Path, workers: int) -> Path:
    return directory / "points" / f"W{workers}"


def repeat_dir(directory: Path, workers: int, repeat: int) -> Path:
    return point_dir(directory, workers) / f"repeat-{repeat}"


@dataclass(frozen=True)
class Run:
    workers: int
    repeat: int


def plan(spec: StudySpec) -> list[Run]:
    """Every run of the study, repeats interleaved (1, 2, 4, 1, 2, 4, ...): a machine whose speed drifts
    during the study then penalises every point alike."""
    return [Run(w, r) for r in range(1, spec.repeats + 1) for w in spec.workers]


def stamp(spec: StudySpec, command_line: str) -> StudySpec:
    """Fill in when, where and how the study was made."""
    spec.created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    spec.host = socket.gethostname()
    spec.cpus = os.cpu_count() or 0
    spec.command_line = command_line
    return spec


def mark_failed(directory: Path, reason: str) -> None:
    """Record that the study's runs (or its submission) failed: its rerun may then reuse the directory."""
    if (directory / STUDY_FILE).is_file():
        with contextlib.suppress(HpcdlError, OSError):  # without the note, the rerun needs --force
            write_output_file(directory / FAILED_FILE, "study's failure note", reason.rstrip() + "\n",
                              replace=True, mode=0o666)  # fmt: skip


def failed_run_only(directory: Path) -> bool:
    """Whether `directory` holds nothing but the outputs of a study whose runs failed: nothing the user
    made, no report, no batch job that may still run."""
    if not (directory / FAILED_FILE).is_file():
        return False
    return all(entry.name in RUN_OUTPUTS for entry in directory.iterdir())


def create(directory: Path, spec: StudySpec, force: bool) -> None:
    """Make the study directory and write its definition; refuses a directory that already holds a study
    or anything else unless ``force`` (then only the study's own files are replaced), or unless it holds
    only what a failed run of a study wrote (that is replaced: none of it is the user's)."""
    if directory.exists() and not directory.is_dir():
        raise StudyError(f"{directory} exists and is not a directory; choose another --output")
    rerun = directory.is_dir() and failed_run_only(directory)
    if directory.is_dir() and any(directory.iterdir()) and not force and not rerun:
        what = "a study" if (directory / STUDY_FILE).exists() else "files"
        raise StudyError(
            f"{directory} already holds {what}; choose another --output, or add --force to run the study "
            "there again (its old runs and report are replaced)"
        )
    if force or rerun:  # the old study's runs and measurements, never anything else
        if (directory / "points").is_dir():
            shutil.rmtree(directory / "points")
        for name in (JOBS_FILE, ALLREDUCE_FILE, FAILED_FILE):
            (directory / name).unlink(missing_ok=True)
    text = json.dumps(spec.to_json(), indent=2) + "\n"
    write_output_file(directory / STUDY_FILE, "study", text, replace=True, parents=True, mode=0o666)


def load(directory: Path) -> StudySpec:
    path = directory / STUDY_FILE
    if not path.is_file():
        raise StudyError(
            f"{directory} is not a scaling study (no {STUDY_FILE}); make one with hpcdl scaling run"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise StudyError(f"cannot read {path}: {exc}") from None
    return StudySpec.from_json(data, str(path))
