"""Step times of a training script, as a scaling study reads them.

A study runs the user's script with ``HPCDL_SCALING_DIR`` (and ``HPCDL_SCALING_REPEAT``) in its environment;
a :class:`StepTimer` in the script then writes one JSON line per training step to
``$HPCDL_SCALING_DIR/repeat-N/steps.rankR.jsonl``: when the step began (wall clock), how long it took, how
long of it the script waited for collectives, and how many samples it processed::

    import hpcdl.torch as hvd

    timer = hvd.StepTimer()                   # outside a study: measures, writes nothing
    timer.watch(optimizer)                    # time in optimizer.synchronize() is communication
    for images, labels in loader:
        with timer.step(samples=len(images)):
            optimizer.zero_grad()
            loss_fn(model(images), labels).backward()
            optimizer.step()                  # waits for the gradients' allreduces: timed as communication

Communication is *measured* where the training loop blocks on collectives: ``DistributedOptimizer.step()``
waits in ``synchronize()`` for the gradient allreduces that backward started; what backward hid is not
counted, what it could not hide is. Any other wait can be marked with ``with timer.communication():``.

The timer is framework-free (no torch import); every step is recorded and the study discards its warm-up
steps when it reads the records.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hpcdl.common.exceptions import HpcdlError
from hpcdl.common.output_file import open_output_file

FORMAT = 1
DIR_VARIABLE = "HPCDL_SCALING_DIR"  # the study point's directory
REPEAT_VARIABLE = "HPCDL_SCALING_REPEAT"  # which repeat of the point this run is (1-based)
WARMUP_VARIABLE = "HPCDL_SCALING_WARMUP"  # steps the study will discard
TIMELINE_VARIABLE = "HPCDL_SCALING_TIMELINE_STEPS"  # measured steps rank 0 records in an engine timeline
BATCH_VARIABLE = "HPCDL_SCALING_BATCH"  # samples per worker per step, when the study sets it
WORKERS_VARIABLE = "HPCDL_SCALING_WORKERS"
GLOBAL_BATCH_VARIABLE = "HPCDL_SCALING_GLOBAL_BATCH"
MAX_WAITS_PER_STEP = 64  # wait intervals kept per step record (their total is always exact)
TIMELINE_FILE = "timeline.json"


class StepRecordError(HpcdlError):
    """Step records are missing, unreadable or incomplete."""


def run_directory(environ: Optional[dict[str, str]] = None) -> Optional[Path]:
    """Where this run's records go: ``$HPCDL_SCALING_DIR/repeat-$HPCDL_SCALING_REPEAT``, or None outside
    a study."""
    env = os.environ if environ is None else environ
    base = env.get(DIR_VARIABLE)
    if not base:
        return None
    return Path(base) / f"repeat-{env.get(REPEAT_VARIABLE) or '1'}"


def steps_file(directory: Path, rank: int) -> Path:
    return directory / f"steps.rank{rank}.jsonl"


def run_file(directory: Path, rank: int) -> Path:
    return directory / f"run.rank{rank}.json"


def _env_int(name: str, default: Optional[int]) -> Optional[int]:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise StepRecordError(f"{name}={raw!r} is not an integer; it is set by hpcdl scaling run") from None


def parameter_bytes(obj: Any) -> Optional[int]:
    """Bytes of the trainable parameters an optimizer holds (what a step's gradient allreduces move), read
    from its ``param_groups`` without importing the framework; None when it has none."""
    groups = getattr(obj, "param_groups", None)
    if not groups:
        return None
    seen: set[int] = set()
    total = 0
    for group in groups:
        for p in group.get("params", []):
            if id(p) in seen or not getattr(p, "requires_grad", True):
                continue
            seen.add(id(p))
            total += int(p.numel()) * int(p.element_size())
    return total or None


@dataclass
class _Step:
    start_wall: float
    start: float
    waits: list[tuple[float, float]] = field(default_factory=list)
    comm: float = 0.0


class StepTimer:
    """Times training steps and the communication waits inside them (see the module docstring).

    ``samples_per_step`` defaults to the study's per-worker batch (``HPCDL_SCALING_BATCH``);
    ``reduced_bytes`` (bytes a step allreduces) is read from the optimizer given to :meth:`watch` when not
    given. ``directory`` overrides where the records go (default: the study's, or nowhere).
    """

    def __init__(
        self,
        samples_per_step: Optional[int] = None,
        reduced_bytes: Optional[int] = None,
        directory: Optional[str | Path] = None,
    ) -> None:
        from hpcdl.common.discovery import discover

        info = discover()
        self.rank, self.size = info.rank, info.size
        self.samples_per_step = samples_per_step or _env_int(BATCH_VARIABLE, None)
        self.reduced_bytes = reduced_bytes
        self.directory = Path(directory) if directory is not None else run_directory()
        self.steps_done = 0
        self.total_seconds = 0.0  # over every step, warm-up included
        self.total_comm_seconds = 0.0
        self.last_seconds = 0.0
        self.last_comm_seconds = 0.0
        self._current: Optional[_Step] = None
        self._file: Optional[Any] = None
        self._warmup = _env_int(WARMUP_VARIABLE, 0) or 0
        self._trace_steps = _env_int(TIMELINE_VARIABLE, 0) or 0
        self._timeline_origin: Optional[float] = None
        self._tracing = False
        self._in_comm = False
        self._host = info.host

    # ---- what the script calls ----------------------------------------------------------------------
    def watch(self, obj: Any, method: str = "synchronize") -> Any:
        """Count the time spent in ``obj.method`` as communication (default: an optimizer's
        ``synchronize``, where ``DistributedOptimizer.step()`` waits for the gradient allreduces). Returns
        ``obj``."""
        original = getattr(obj, method, None)
        if not callable(original):
            raise StepRecordError(
                f"{type(obj).__name__} has no method {method!r} to time; pass the hvd.DistributedOptimizer, "
                "or mark waits with `with timer.communication():`"
            )

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.communication():
                return original(*args, **kwargs)

        setattr(obj, method, timed)
        if self.reduced_bytes is None:
            self.reduced_bytes = parameter_bytes(obj)
        return obj

    @contextlib.contextmanager
    def step(self, samples: Optional[int] = None) -> Iterator[None]:
        """Time one training step (forward, backward, update)."""
        if self._current is not None:
            raise StepRecordError("timer.step() blocks cannot nest; end one step before starting the next")
        self._maybe_start_timeline()
        self._current = _Step(time.time(), time.perf_counter())
        try:
            yield
        finally:
            current, self._current = self._current, None
        seconds = time.perf_counter() - current.start
        self.last_seconds, self.last_comm_seconds = seconds, current.comm
        self.total_seconds += seconds
        self.total_comm_seconds += current.comm
        self._write(
            {
                "step": self.steps_done,
                "start": round(current.start_wall, 6),
                "seconds": seconds,
                "comm": current.comm,
                "waits": [[round(a, 6), round(d, 6)] for a, d in current.waits[:MAX_WAITS_PER_STEP]],
                "samples": samples if samples is not None else self.samples_per_step,
            }
        )
        self.steps_done += 1
        self._maybe_stop_timeline()

    @contextlib.contextmanager
    def communication(self) -> Iterator[None]:
        """Mark a wait for collectives inside a step (nested marks count once)."""
        current = self._current
        if current is None or self._in_comm:
            yield
            return
        self._in_comm = True
        began = time.perf_counter()
        try:
            yield
        finally:
            self._in_comm = False
            ended = time.perf_counter()
            current.comm += ended - began
            current.waits.append((began - current.start, ended - began))

    def close(self) -> None:
        """Stop a timeline this timer started and close the records file."""
        if self._tracing:
            self._stop_timeline()
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> StepTimer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- records ---------------------------------------------------------------------------------------
    def _write(self, record: dict[str, Any]) -> None:
        if self.directory is None:
            return
        if self._file is None:
            path = steps_file(self.directory, self.rank)
            self._file = open_output_file(path, "step records", replace=True, parents=True, mode=0o666)
            self._file.write(json.dumps(self._header()) + "\n")
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def _header(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "kind": "header",
            "rank": self.rank,
            "size": self.size,
            "host": self._host,
            "pid": os.getpid(),
            "cpus": os.cpu_count() or 0,
            "reduced_bytes": self.reduced_bytes,
            "samples_per_step": self.samples_per_step,
        }

    # ---- engine timeline of a few measured steps (rank 0) --------------------------------------------
    def _maybe_start_timeline(self) -> None:
        if (
            self._trace_steps <= 0
            or self.rank != 0
            or self.directory is None
            or self._tracing
            or self._timeline_origin is not None
            or self.steps_done != self._warmup
        ):
            return
        from hpcdl.common import engine

        before = time.time()
        try:
            engine.start_timeline(str(self.directory / TIMELINE_FILE))
        except HpcdlError as exc:  # no engine in this script: the study goes on without a timeline
            self._trace_steps = 0
            self._write_note(f"no engine timeline: {exc}")
            return
        self._timeline_origin = (before + time.time()) / 2
        self._tracing = True
        self._write({"kind": "timeline", "file": TIMELINE_FILE, "origin": round(self._timeline_origin, 6)})

    def _maybe_stop_timeline(self) -> None:
        if self._tracing and self.steps_done >= self._warmup + self._trace_steps:
            self._stop_timeline()

    def _stop_timeline(self) -> None:
        from hpcdl.common import engine

        self._tracing = False
        with contextlib.suppress(HpcdlError):
            engine.stop_timeline()
        self._write({"kind": "timeline_stop", "at": round(time.time(), 6)})

    def _write_note(self, text: str) -> None:
        self._write({"kind": "note", "text": text})


# ---- reading records ---------------------------------------------------------------------------------
@dataclass
class RankSteps:
    """One rank's records of one run."""

    rank: int
    size: int
    host: str
    reduced_bytes: Optional[int]
    steps: list[dict[str, Any]]
    timeline_origin: Optional[float] = None
    cpus: int = 0
    timeline_stop: Optional[float] = None


def read_rank_steps(path: Path) -> RankSteps:
    """Parse one ``steps.rankR.jsonl``; a line cut short by a killed run ends the records."""
    header: Optional[dict[str, Any]] = None
    steps: list[dict[str, Any]] = []
    origin: Optional[float] = None
    stop: Optional[float] = None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise StepRecordError(f"cannot read step records {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break  # the last line of a run that was killed while writing
            raise StepRecordError(f"{path}:{number} is not a JSON step record") from None
        kind = record.get("kind")
        if kind == "header":
            header = record
        elif kind == "timeline":
            origin = float(record["origin"])
        elif kind == "timeline_stop":
            stop = float(record["at"])
        elif kind is None:
            steps.append(record)
    if header is None or header.get("format") != FORMAT:
        raise StepRecordError(
            f"{path} has no step-record header of format {FORMAT}; it was not written by hpcdl's StepTimer"
        )
    return RankSteps(
        int(header["rank"]),
        int(header["size"]),
        str(header.get("host", "")),
        header.get("reduced_bytes"),
        steps,
        origin,
        int(header.get("cpus") or 0),
        stop,
    )


def read_run_steps(directory: Path) -> dict[int, RankSteps]:
    """Every rank's step records in a run directory, by rank (empty when there are none)."""
    found = {}
    for path in sorted(directory.glob("steps.rank*.jsonl")):
        records = read_rank_steps(path)
        found[records.rank] = records
    return found


def read_run_times(directory: Path) -> dict[int, dict[str, Any]]:
    """Whole-run records (``hpcdl.scaling.runtimer``) in a run directory, by rank."""
    found = {}
    for path in sorted(directory.glob("run.rank*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            raise StepRecordError(f"{path} is not a readable run record") from None
        found[int(record["rank"])] = record
    return found
