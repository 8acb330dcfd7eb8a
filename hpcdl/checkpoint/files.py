"""Files that are complete or absent: written beside their final name, flushed to the disk (``fsync``) and
renamed into place, with the directory synced so that the rename itself survives a crash. A reader never
sees half a file under a final name; a writer killed midway leaves only a temporary file (a dot name).

Every file written records its size and SHA-256, and a read checks both before anything is unpickled,
and that the file belongs to this user (a checkpoint is a pickle: loading one runs code it names).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

from hpcdl.checkpoint.errors import CheckpointError


@dataclass(frozen=True)
class FileRecord:
    """A file of a checkpoint: its name in the checkpoint's directory, size and SHA-256."""

    name: str
    size: int
    sha256: str


class _HashingWriter:
    """A binary file as ``pickle.dump`` sees it, hashing and counting what passes through."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        self._raw.write(view)
        self.hash.update(view)
        self.size += view.nbytes
        return view.nbytes


def fsync_directory(directory: Path) -> None:
    """Make the entries of ``directory`` (a rename, a new file) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(directory: Path, name: str, dump: Callable[[BinaryIO], None]) -> FileRecord:
    """Write ``directory/name`` with ``dump(file)``: all of it, or (killed midway) nothing under that name.
    The file is private to its owner (mode 0600)."""
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw:
            writer = _HashingWriter(raw)
            dump(cast(BinaryIO, writer))
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(temporary, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    fsync_directory(directory)
    return FileRecord(name, writer.size, writer.hash.hexdigest())


def write_text_atomic(directory: Path, name: str, text: str) -> FileRecord:
    return write_atomic(directory, name, lambda out: out.write(text.encode()))


def read_verified(directory: Path, record: FileRecord) -> bytes:
    """The bytes of ``directory/record.name`` once its owner, size and SHA-256 are those expected."""
    path = directory / record.name
    try:
        with open(path, "rb") as stream:
            check_owner(path, os.fstat(stream.fileno()).st_uid)
            data = stream.read()
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) != record.size or hashlib.sha256(data).hexdigest() != record.sha256:
        raise CheckpointError(
            f"{path} is damaged: {len(data)} bytes whose SHA-256 is not the one its manifest recorded "
            f"({record.size} bytes); the file was changed after it was written"
        )
    return data


def check_owner(path: Path, uid: int) -> None:
    """Refuse another user's file: a checkpoint is a pickle, whose loading runs code it names, and a file
    planted in a shared directory must not be loaded or written into."""
    if uid != os.geteuid():
        raise CheckpointError(
            f"{path} belongs to user id {uid}, not to you ({os.geteuid()}); hpcdl reads and writes only your "
            "own checkpoint files (copy it if you trust it, or use a checkpoint path of your own)"
        )
