"""The checkpoint directory of a job, as rank 0 keeps it (no collectives here).

Layout of ``PATH``::

    ckpt-000007-step-1200/      a complete checkpoint: state.pkl (rank 0's, the replicated state),
                                rank-00001.pkl ... (each rank's own part, where there is one) and
                                manifest.json (written last: step, ranks, layout, every file's size/SHA-256)
    .ckpt-000008-step-1300.partial/    one being written (or left by a writer that died)
    history.jsonl               one line per start, checkpoint and requeue of every run

A checkpoint becomes visible in one step: its directory is renamed from the dot name once every file
in it, the manifest last, is on the disk. Older checkpoints are removed only after that, so a crash at
any moment leaves the previous one valid. The newest complete directory (by its sequence number) is
the one to resume from; one that fails its checks is skipped for the one before it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from hpcdl.checkpoint.errors import CheckpointError
from hpcdl.checkpoint.files import FileRecord, check_owner, fsync_directory, write_text_atomic
from hpcdl.common.output_file import make_directories

FORMAT = 1
MANIFEST = "manifest.json"
STATE_FILE = "state.pkl"
HISTORY = "history.jsonl"
_COMPLETE = re.compile(r"^ckpt-(\d{6,})-step-(\d+)$")
_PARTIAL = re.compile(r"^\.ckpt-\d{6,}-step-\d+\.partial$")
_TRASH = re.compile(r"^\.ckpt-.*\.trash-[0-9a-f]+$")


def shard_file(rank: int) -> str:
    return f"rank-{rank:05d}.pkl"


@dataclass
class Manifest:
    """What a complete checkpoint holds; ``manifest.json`` of its directory."""

    step: int
    reason: str
    world_size: int
    job: str
    layout: dict[str, Any]
    files: list[FileRecord]
    sharded: bool
    written_at: float = field(default_factory=time.time)
    format: int = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError(f"not a manifest of format {FORMAT}")
        raw["files"] = [FileRecord(**f) for f in raw["files"]]
        return cls(**raw)

    def record(self, name: str) -> Optional[FileRecord]:
        return next((f for f in self.files if f.name == name), None)


@dataclass(frozen=True)
class Found:
    """A complete checkpoint: its directory and manifest."""

    directory: Path
    manifest: Manifest


class CheckpointStore:
    """The checkpoints under ``root``; only rank 0 changes the directory (other ranks write their own
    files into the directory rank 0 made for them)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # ---- reading ---------------------------------------------------------------------------------
    def complete(self) -> list[tuple[int, Path]]:
        """(sequence number, directory) of the complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            match = _COMPLETE.match(entry.name)
            if match and entry.is_dir():
                found.append((int(match.group(1)), entry))
        return sorted(found)

    def latest(self) -> tuple[Optional[Found], list[str]]:
        """The newest checkpoint that passes its checks, and why any newer one was passed over."""
        if self.root.exists() and not self.root.is_dir():
            raise CheckpointError(f"checkpoint path {self.root} is not a directory; give a directory")
        skipped = []
        for _, directory in reversed(self.complete()):
            try:
                return Found(directory, self.manifest(directory)), skipped
            except CheckpointError as exc:
                skipped.append(str(exc))
        return None, skipped

    def manifest(self, directory: Path) -> Manifest:
        """The manifest of ``directory``, once every file it lists is there with its size."""
        path = directory / MANIFEST
        try:
            with open(path, "rb") as stream:
                check_owner(path, os.fstat(stream.fileno()).st_uid)
                manifest = Manifest.from_json(stream.read().decode())
        except OSError as exc:
            raise CheckpointError(f"{directory} has no readable {MANIFEST} ({exc.strerror or exc})") from None
        except (ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"{path} is not an hpcdl checkpoint manifest ({exc})") from None
        for record in manifest.files:
            try:
                size = (directory / record.name).stat().st_size
            except OSError:
                raise CheckpointError(f"{directory} lacks {record.name}, which its manifest lists") from None
            if size != record.size:
                raise CheckpointError(
                    f"{directory / record.name} has {size} bytes, its manifest says {record.size}"
                )
        return manifest

    # ---- writing (rank 0) ------------------------------------------------------------------------
    def begin(self, step: int) -> Path:
        """A fresh directory for the checkpoint of ``step``, under its dot name. Directories that writers
        which died left behind are removed first (one job writes a checkpoint path at a time)."""
        make_directories(self.root, "checkpoint directory")
        self.remove_leftovers()
        sequence = max((number for number, _ in self.complete()), default=0) + 1
        partial = self.root / f".ckpt-{sequence:06d}-step-{step}.partial"
        partial.mkdir()
        return partial

    def finish(self, partial: Path, manifest: Manifest, keep: int) -> Path:
        """Write the manifest into ``partial``, make the directory durable, give it its final name; then
        (only then) remove all but the ``keep`` newest checkpoints."""
        write_text_atomic(partial, MANIFEST, manifest.to_json())
        fsync_directory(partial)
        final = self.root / partial.name[1:].removesuffix(".partial")
        os.rename(partial, final)
        fsync_directory(self.root)
        for _, older in self.complete()[:-keep]:
            self._remove(older)
        return final

    def abandon(self, partial: Path) -> None:
        self._remove(partial)

    def remove_leftovers(self) -> list[str]:
        """Remove what writers that died left: partial checkpoints, half-removed old ones."""
        removed = []
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if _PARTIAL.match(entry.name) or _TRASH.match(entry.name):
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry.name)
        return removed

    def _remove(self, directory: Path) -> None:
        """Rename first (the checkpoint is gone at once, not file by file), then delete."""
        trash = directory.with_name(f".{directory.name.lstrip('.')}.trash-{secrets.token_hex(4)}")
        os.rename(directory, trash)
        shutil.rmtree(trash, ignore_errors=True)

    # ---- history ---------------------------------------------------------------------------------
    def append_history(self, event: dict[str, Any]) -> None:
        """Add one line to the history (one ``write`` on an append-only file of yours, never through a
        link, then ``fsync``)."""
        make_directories(self.root, "checkpoint directory")
        line = (json.dumps({"time": round(time.time(), 3), **event}, sort_keys=True) + "\n").encode()
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.root / HISTORY, flags, 0o600)
        except OSError as exc:
            raise CheckpointError(f"cannot write {self.root / HISTORY}: {exc.strerror or exc}") from None
        try:
            check_owner(self.root / HISTORY, os.fstat(fd).st_uid)
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def history(self) -> list[dict[str, Any]]:
        """Every event recorded (a line a crash cut short is left out)."""
        events = []
        with contextlib.suppress(FileNotFoundError):
            for line in (self.root / HISTORY).read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if isinstance(event, dict):
                        events.append(event)
        return events
