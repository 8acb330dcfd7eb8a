"""What hpcdl remembers about the jobs it submitted, so ``hpcdl jobs`` can find them later.

One small JSON file per job under ``$XDG_STATE_HOME/hpcdl/jobs`` (default ``~/.local/state``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from hpcdl.common.output_file import write_output_file


def records_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "hpcdl" / "jobs"


def _file_name(job_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", job_id) + ".json"


@dataclass
class JobRecord:
    scheduler: str
    job_id: str
    name: str
    workdir: str
    script: str
    log_globs: list[str]
    checkpoint: Optional[str] = None  # the training's checkpoint directory (--checkpoint)

    def save(self) -> Path:
        path = records_dir() / _file_name(self.job_id)
        text = json.dumps(asdict(self), indent=2) + "\n"
        return write_output_file(path, "job record", text, replace=True, parents=True)

    def log_files(self) -> list[Path]:
        """Existing files matching the job's output globs, relative globs taken from its workdir."""
        number = re.match(r"\d+", self.job_id)
        found: list[Path] = []
        for pattern in self.log_globs:
            filled = pattern.replace("{job_id}", self.job_id).replace(
                "{job_number}", number.group(0) if number else self.job_id
            )
            base = Path(filled) if Path(filled).is_absolute() else Path(self.workdir) / filled
            for match in sorted(base.parent.glob(base.name)):
                if match not in found:
                    found.append(match)
        return found


def load_record(job_id: str) -> Optional[JobRecord]:
    path = records_dir() / _file_name(job_id)
    if not path.is_file():
        return None
    try:
        return JobRecord(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return None
