"""Unpack a source archive (tar in any compression Python reads, or zip) into a stage directory, refusing
anything that would write or point outside it.

Everything is unpacked into a fresh private directory (``mkdtemp`` beside the destination, mode 0700, in
a parent that only the user may write), which is renamed into place once all of it has been checked: no
other user can plant a link in it or swap what was unpacked, and a half-unpacked or refused archive never
appears at the destination.

Python's tarfile and zipfile extraction are not relied on (tarfile's filters are missing before 3.12
except in late point releases, some of their checks were bypassed until later fixes, and zipfile checks
nothing on disk). Members of every kind of archive are written here one at a time, through the same
checks before each write: regular files and directories first (while the stage holds no link, so no path
can lead out of it), each parent made one component at a time and refused if it is not a real directory;
then (tar only) hard links to files already written, then symbolic links, each checked against what is on
disk when it is made, and finally every link is resolved to prove that none leads out of the stage. Zip
link entries are written as plain files, as zipfile does. Device files and FIFOs are refused; set-id bits
and ownership are dropped; modification times are kept (make compares them, and a tarball whose files all
look new would regenerate its configure script).
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO

from hpcdl.common.exceptions import HpcdlError
from hpcdl.stack.names import has_control_characters

COPY_BLOCK = 1 << 20


class ArchiveError(HpcdlError):
    """An archive is unreadable or holds a member that would escape the directory it is unpacked into."""


def _within(path: str, bound: str) -> bool:
    return path == bound or path.startswith(bound + os.sep)


def _member_path(archive: Path, name: str) -> PurePosixPath:
    """The member's path relative to the stage; refuses absolute paths, '..' and control characters."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or has_control_characters(name) or "\\" in name:
        raise ArchiveError(
            f"refusing to unpack {archive.name}: its member '{name}' points outside the unpack directory"
        )
    return path


class _Stage:
    """The directory being filled, and the checks every write into it goes through."""

    def __init__(self, archive: Path, destination: Path):
        self.archive = archive
        self.root = destination
        self.directories: list[tuple[Path, int, float]] = []

    def refuse(self, name: str, why: str) -> ArchiveError:
        return ArchiveError(f"refusing to unpack {self.archive.name}: its member '{name}' {why}")

    def parent_of(self, relative: PurePosixPath, name: str) -> Path:
        """Make the member's parent directories, one at a time: each must be a directory, not a link."""
        current = self.root
        for part in relative.parts[:-1]:
            current = current / part
            try:
                os.mkdir(current)  # mode as the umask says: the unpack directory (0700) keeps them private
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(current).st_mode):
                    raise self.refuse(
                        name, "would be written through a link or a file the archive holds"
                    ) from None
        return self.root.joinpath(*relative.parts)

    def directory(self, name: str, relative: PurePosixPath, mode: int, mtime: float) -> None:
        if not relative.parts:
            return
        target = self.parent_of(relative, name)
        try:
            os.mkdir(target)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(target).st_mode):
                raise self.refuse(name, "is a directory where the archive already put a file") from None
        self.directories.append((target, 0o700 | (mode & 0o755), mtime))

    def file(
        self,
        name: str,
        relative: PurePosixPath,
        source: Callable[[], IO[bytes] | None],
        mode: int,
        mtime: float,
    ) -> None:
        target = self.parent_of(relative, name)
        if os.path.lexists(target) and not stat.S_ISREG(os.lstat(target).st_mode):
            raise self.refuse(name, "is a file where the archive already put a directory or link")
        target.unlink(missing_ok=True)  # a later copy of the same member wins, as with tar itself
        data = source()
        if data is None:
            raise self.refuse(name, "has no data")
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out, data:
            shutil.copyfileobj(data, out, COPY_BLOCK)
            os.fchmod(out.fileno(), 0o600 | (mode & 0o755))
        os.utime(target, (mtime, mtime), follow_symlinks=False)

    def hard_link(self, member: tarfile.TarInfo, relative: PurePosixPath, files: set[PurePosixPath]) -> None:
        source = _member_path(self.archive, member.linkname)
        if source not in files:
            raise self.refuse(
                member.name, f"is a hard link to '{member.linkname}', which is not a file inside it"
            )
        target = self.parent_of(relative, member.name)
        if os.path.lexists(target):
            raise self.refuse(member.name, "is a hard link over a path the archive already holds")
        os.link(self.root.joinpath(*source.parts), target, follow_symlinks=False)

    def symbolic_link(self, member: tarfile.TarInfo, relative: PurePosixPath) -> None:
        pointed = PurePosixPath(os.path.normpath(os.path.join(str(relative.parent), member.linkname)))
        if (
            PurePosixPath(member.linkname).is_absolute()
            or has_control_characters(member.linkname)
            or pointed.parts[:1] == ("..",)
        ):
            raise self.refuse(member.name, f"is a link to '{member.linkname}', outside the unpack directory")
        target = self.parent_of(relative, member.name)
        if os.path.lexists(target):
            raise self.refuse(member.name, "is a link over a path the archive already holds")
        os.symlink(member.linkname, target)

    def restore_directories(self) -> None:
        """Directory modes and times last: writing into a directory changes its time (and may need +w)."""
        for directory, mode, mtime in reversed(self.directories):
            directory.chmod(mode)
            os.utime(directory, (mtime, mtime), follow_symlinks=False)


def _check_links(archive: Path, top: Path, shown: str) -> None:
    """Every link under `top` (`shown` in messages), resolved now that all exist (one may lead through
    another), stays in `top`."""
    bound = os.path.realpath(top)
    for directory, subdirectories, files in os.walk(top):
        for name in subdirectories + files:
            path = Path(directory) / name
            if path.is_symlink() and not _within(os.path.realpath(path), bound):
                raise ArchiveError(
                    f"refusing to unpack {archive.name}: the link {path.relative_to(top)} "
                    f"(-> {os.readlink(path)}) leads outside {shown}"
                )


def _unpack_tar(archive: Path, destination: Path) -> None:
    stage = _Stage(archive, destination)
    with tarfile.open(archive) as tarred:
        members = tarred.getmembers()
        paths = {id(m): _member_path(archive, m.name) for m in members}
        for member in members:
            if not (member.isdir() or member.isreg() or member.issym() or member.islnk()):
                raise stage.refuse(member.name, "is a device file or FIFO")
        files: set[PurePosixPath] = set()
        for member in members:  # in archive order: the compressed stream is read forward only
            if member.isdir():
                stage.directory(member.name, paths[id(member)], member.mode, member.mtime)
            elif member.isreg():
                stage.file(
                    member.name,
                    paths[id(member)],
                    lambda m=member: tarred.extractfile(m),
                    member.mode,
                    member.mtime,
                )
                files.add(paths[id(member)])
        for member in members:
            if member.islnk():
                stage.hard_link(member, paths[id(member)], files)
        for member in members:
            if member.issym():
                stage.symbolic_link(member, paths[id(member)])
    stage.restore_directories()


def _unpack_zip(archive: Path, destination: Path) -> None:
    """Member by member, as tar's files and directories (zip link entries become plain files)."""
    stage = _Stage(archive, destination)
    with zipfile.ZipFile(archive) as zipped:
        infos = zipped.infolist()
        paths = [_member_path(archive, info.filename) for info in infos]
        for info, relative in zip(infos, paths):
            mode = info.external_attr >> 16  # Unix modes, when the archive was made on Unix
            mtime = time.mktime((*info.date_time, 0, 0, -1))
            if stat.S_ISLNK(mode):
                mode = 0o644  # written as a plain file holding the link's target
            if info.is_dir():
                stage.directory(info.filename, relative, mode or 0o755, mtime)
            else:
                stage.file(info.filename, relative, lambda i=info: zipped.open(i), mode or 0o644, mtime)
    stage.restore_directories()


def _check_parent(destination: Path) -> None:
    """The destination's parent: a real directory of the user's that nobody else may write."""
    parent = destination.parent
    try:
        there = os.lstat(parent)
    except OSError as exc:
        raise ArchiveError(f"cannot unpack into {destination}: {exc.strerror}") from None
    if stat.S_ISLNK(there.st_mode) or not stat.S_ISDIR(there.st_mode):
        problem = "is a link or not a directory"
    elif there.st_uid != os.geteuid():
        problem = f"belongs to uid {there.st_uid}"
    elif there.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"may be written by others (mode {stat.S_IMODE(there.st_mode):o})"
    else:
        return
    raise ArchiveError(
        f"cannot unpack into {destination}: {parent} {problem}; sources are unpacked only under a directory "
        "of yours that no other user may change"
    )


def unpack(archive: Path, destination: Path, strip: str = "") -> Path:
    """Unpack into `destination` (which must not exist; its parent must be a directory of the user's that
    nobody else may write); return the package root (`strip`, or the archive's single top directory).

    Raises ArchiveError, leaving nothing at `destination`, for a member that would escape it.
    """
    _check_parent(destination)
    if os.path.lexists(destination):
        raise ArchiveError(f"cannot unpack {archive.name} into {destination}: it exists; remove it first")
    work = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    try:
        if zipfile.is_zipfile(archive):
            _unpack_zip(archive, work)
        elif tarfile.is_tarfile(archive):
            _unpack_tar(archive, work)
        else:
            raise ArchiveError(f"{archive.name} is neither a tar nor a zip archive")
        root = _package_root(archive, work, strip)
        _check_links(archive, work, destination.name)
        if root != work:  # a binary install copies the root alone: its links must stay in it
            _check_links(archive, root, root.name)
        os.rename(work, destination)  # fails if anything appeared there meanwhile
    except (ArchiveError, tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
        shutil.rmtree(work, ignore_errors=True)
        if isinstance(exc, ArchiveError):
            raise
        raise ArchiveError(f"cannot unpack {archive.name}: {exc}") from None
    return destination / root.relative_to(work)


def _package_root(archive: Path, destination: Path, strip: str) -> Path:
    if strip:
        root = destination / strip
        if root.is_symlink() or not root.is_dir():
            raise ArchiveError(f"{archive.name} has no directory {strip} (the recipe's 'strip')")
        return root
    entries = list(destination.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    return destination
