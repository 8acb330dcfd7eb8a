"""Writing a study's report files without overwriting what the user made.

hpcdl remembers the SHA-256 of every file it writes into a directory (``.hpcdl-outputs.json``). Running the
report again replaces those files while they are as hpcdl left them; a file hpcdl did not write, or one
the user has since edited, is replaced only with ``force``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from hpcdl.common.output_file import write_output_file
from hpcdl.scaling.study import StudyError

MANIFEST = ".hpcdl-outputs.json"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class OutputDirectory:
    def __init__(self, directory: Path, force: bool) -> None:
        self.directory = directory
        self.force = force
        self._manifest_path = directory / MANIFEST
        try:
            self._written: dict[str, str] = json.loads(self._manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self._written = {}

    def check(self, names: list[str]) -> None:
        """Raise before anything is written when one of ``names`` would overwrite the user's file."""
        if self.force:
            return
        foreign = []
        for name in names:
            path = self.directory / name
            if path.exists() and self._written.get(name) != _digest(path.read_bytes()):
                foreign.append(str(path))
        if foreign:
            raise StudyError(
                f"{', '.join(foreign)} exist(s) and hpcdl did not write them (or they were edited since); "
                "move them away, or add --force to overwrite them"
            )

    def write(self, name: str, data: bytes | str) -> Path:
        payload = data.encode() if isinstance(data, str) else data
        path = self.directory / name
        write_output_file(path, name, payload, replace=True, parents=True, mode=0o666)
        self._written[name] = _digest(payload)
        manifest = json.dumps(self._written, indent=1, sort_keys=True) + "\n"
        write_output_file(self._manifest_path, "list of written files", manifest, replace=True, mode=0o666)
        return path
