"""What a checkpoint's history says about one job: how often it started again and from which step
(``hpcdl jobs status`` prints it for a job submitted with ``--checkpoint``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hpcdl.checkpoint.store import CheckpointStore


@dataclass
class JobProgress:
    """The runs of one job (its first start and every restart) as the checkpoint's history recorded them."""

    job: str
    resumed: list[Optional[int]] = field(default_factory=list)  # per run: the step it resumed from
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    requeues: int = 0

    @property
    def restarts(self) -> int:
        return max(len(self.resumed) - 1, 0)

    def describe(self) -> str:
        if not self.resumed:
            return f"job {self.job} has not started training yet (nothing in its checkpoint's history)"
        runs = ", ".join(
            f"run {n} from {'the start' if step is None else f'step {step}'}"
            for n, step in enumerate(self.resumed, 1)
        )
        text = f"{self.restarts} restart{'' if self.restarts == 1 else 's'} ({runs})"
        if self.checkpoints:
            last = self.checkpoints[-1]
            text += f"; last checkpoint: step {last['step']} ({last['reason']})"
        return text


def job_progress(path: Path, job: str) -> JobProgress:
    """The runs of ``job`` in the history of the checkpoint at ``path`` (none if it never started)."""
    progress = JobProgress(job)
    for event in CheckpointStore(path).history():
        if str(event.get("job", "")) != job:
            continue
        kind = event.get("event")
        if kind == "start":
            progress.resumed.append(event.get("resumed_step"))
        elif kind == "checkpoint":
            progress.checkpoints.append(event)
        elif kind == "requeue" and event.get("ok"):
            progress.requeues += 1
    return progress
