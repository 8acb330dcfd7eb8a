"""Run a study's points on this machine (or inside the current batch allocation) through ``hpcdl run``.

Each run is one ``hpcdl run -np W`` of the workload, its output kept in ``repeat-N/output.log``; its
records are read as soon as it ends, so a script that reports nothing, or a rank that failed, stops the
study at once with the reason. Every run has a deadline; Ctrl-C stops the running job (``hpcdl run``
passes it to every rank).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hpcdl.common.output_file import open_output_file, write_output_file
from hpcdl.scaling.results import RunResult, read_run
from hpcdl.scaling.study import ALLREDUCE_FILE, Run, StudyError, StudySpec, plan, repeat_dir

DEFAULT_RUN_TIMEOUT_S = 3600.0
STOP_GRACE_S = 10.0
TAIL_LINES = 15


@dataclass
class RunEvent:
    kind: str  # "start" or "done"
    run: Run
    index: int  # 0-based position in the plan
    total: int
    result: Optional[RunResult] = None
    seconds: float = 0.0


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _stop(process: subprocess.Popen, signum: int = signal.SIGTERM) -> None:
    """Ask ``hpcdl run`` to stop its ranks; kill it when it does not within the grace period (its rank
    agents then stop the ranks)."""
    if process.poll() is not None:
        return
    process.send_signal(signum)
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def hpcdl_run(
    ranks: int, command: list[str], env: dict[str, str], log: Path, timeout: float, what: str
) -> float:
    """Run ``hpcdl run -np RANKS COMMAND`` with its output in ``log``; the seconds it took. Raises
    StudyError when it fails or passes ``timeout``."""
    argv = [sys.executable, "-m", "hpcdl", "run", "-np", str(ranks), *command]
    started = time.monotonic()
    with open_output_file(log, "log", binary=True, replace=True, parents=True, mode=0o666) as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            _stop(process)
            raise StudyError(
                f"{what} did not finish within {timeout:.0f} s and was stopped; raise --run-timeout or "
                f"shorten the run. Its output: {log}"
            ) from None
        except KeyboardInterrupt:
            _stop(process, signal.SIGINT)
            raise
    if code != 0:
        raise StudyError(
            f"{what} failed (hpcdl run exit {code}); the end of its output ({log}):\n{_tail(log)}"
        )
    return time.monotonic() - started


def run_study(
    spec: StudySpec,
    directory: Path,
    on_event: Callable[[RunEvent], None] = lambda event: None,
    timeout: float = DEFAULT_RUN_TIMEOUT_S,
) -> list[RunResult]:
    """Every run of the study, in the interleaved order of :func:`~hpcdl.scaling.study.plan`."""
    runs = plan(spec)
    results = []
    for index, run in enumerate(runs):
        on_event(RunEvent("start", run, index, len(runs)))
        where = repeat_dir(directory, run.workers, run.repeat)
        where.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **spec.environment(directory, run.workers, run.repeat)}
        what = f"W={run.workers} repeat {run.repeat}"
        seconds = hpcdl_run(
            run.workers,
            spec.rank_command(run.workers, sys.executable),
            env,
            where / "output.log",
            timeout,
            what,
        )
        result = read_run(spec, directory, run.workers, run.repeat)
        results.append(result)
        on_event(RunEvent("done", run, index, len(runs), result, seconds))
    return results


def allreduce_sizes(reduced_bytes: Optional[int]) -> list[int]:
    """4 B and powers of 4 up to the first at or above the bytes a step reduces (64 MiB when unknown)."""
    top = reduced_bytes or (64 << 20)
    sizes = [4]
    while sizes[-1] < top:
        sizes.append(sizes[-1] * 4)
    return sizes


def measure_allreduce(
    directory: Path, ranks: int, reduced_bytes: Optional[int], timeout: float = DEFAULT_RUN_TIMEOUT_S
) -> Path:
    """``hpcdl bench allreduce -np RANKS --json`` on this machine, its records kept as ``allreduce.jsonl``."""
    sizes = ",".join(map(str, allreduce_sizes(reduced_bytes)))
    argv = [sys.executable, "-m", "hpcdl", "bench", "allreduce", "-np", str(ranks), "--json", "--no-progress"]
    argv += ["--no-mpi", "--sizes", sizes, "--repeats", "3"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise StudyError(f"hpcdl bench allreduce -np {ranks} did not finish within {timeout:.0f} s") from None
    records = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    if done.returncode != 0 or not records:
        raise StudyError(
            f"hpcdl bench allreduce -np {ranks} failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
        )
    path = directory / ALLREDUCE_FILE
    text = "".join(json.dumps(r) + "\n" for r in records)
    write_output_file(path, "allreduce measurements", text, replace=True, mode=0o666)
    return path


def load_allreduce(path: Path) -> list[dict]:
    """Records of ``hpcdl bench allreduce --json`` (one JSON object per line)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise StudyError(f"cannot read allreduce records {path}: {exc.strerror}") from None
    try:
        return [json.loads(line) for line in lines if line.strip().startswith("{")]
    except json.JSONDecodeError:
        raise StudyError(
            f"{path} is not the output of hpcdl bench allreduce --json (one JSON record per line)"
        ) from None
