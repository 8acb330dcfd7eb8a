"""Unpack a source archive (tar in any compression Python reads, or zip) into a stage directory, refusing
anything that would write or point outside it.

Python's tarfile extraction filters are not relied on: they are missing before 3.12 except in late point
releases, and some of their checks were bypassed until later fixes. Members are written here one at a time
instead: regular files and directories first (while the stage holds no link, so no path can lead out of
it), then hard links to files already written, then symbolic links, each checked against what is on disk
when it is made, and finally every link is resolved to prove that none leads out of the stage. Device
files and FIFOs are refused; set-id bits and ownership are dropped; modification times are kept (make
compares them, and a tarball whose files all look new would regenerate its configure script).
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

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
        self.real = os.path.realpath(destination)
        self.directories: list[tuple[Path, int, float]] = []

    def refuse(self, name: str, why: str) -> ArchiveError:
        return ArchiveError(f"refusing to unpack {self.archive.name}: its member '{name}' {why}")

    def parent_of(self, relative: PurePosixPath, name: str) -> Path:
        """Create the member's parent directories; the parent must resolve inside the stage."""
        target = self.root.joinpath(*relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not _within(os.path.realpath(target.parent), self.real):
            raise self.refuse(name, "would be written through a link that leads outside the unpack directory")
        return target

    def directory(self, member: tarfile.TarInfo, relative: PurePosixPath) -> None:
        if not relative.parts:
            return
        target = self.parent_of(relative, member.name)
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            raise self.refuse(member.name, "is a directory where the archive already put a file")
        target.mkdir(exist_ok=True)
        self.directories.append((target, 0o700 | (member.mode & 0o755), member.mtime))

    def file(self, tarred: tarfile.TarFile, member: tarfile.TarInfo, relative: PurePosixPath) -> None:
        target = self.parent_of(relative, member.name)
        if target.is_symlink() or target.is_dir():
            raise self.refuse(member.name, "is a file where the archive already put a directory or link")
        target.unlink(missing_ok=True)  # a later copy of the same member wins, as with tar itself
        source = tarred.extractfile(member)
        if source is None:
            raise self.refuse(member.name, "has no data")
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out, source:
            shutil.copyfileobj(source, out, COPY_BLOCK)
            os.fchmod(out.fileno(), 0o600 | (member.mode & 0o755))
        os.utime(target, (member.mtime, member.mtime), follow_symlinks=False)

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


def _check_links(archive: Path, top: Path) -> None:
    """Every link under `top`, resolved now that all exist (one may lead through another), stays in `top`."""
    bound = os.path.realpath(top)
    for directory, subdirectories, files in os.walk(top):
        for name in subdirectories + files:
            path = Path(directory) / name
            if path.is_symlink() and not _within(os.path.realpath(path), bound):
                raise ArchiveError(
                    f"refusing to unpack {archive.name}: the link {path.relative_to(top)} "
                    f"(-> {os.readlink(path)}) leads outside {top.name}"
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
                stage.directory(member, paths[id(member)])
            elif member.isreg():
                stage.file(tarred, member, paths[id(member)])
                files.add(paths[id(member)])
        for member in members:
            if member.islnk():
                stage.hard_link(member, paths[id(member)], files)
        for member in members:
            if member.issym():
                stage.symbolic_link(member, paths[id(member)])
    stage.restore_directories()


def _unpack_zip(archive: Path, destination: Path) -> None:
    """zipfile writes link entries as plain files and never follows links; only names need checking."""
    with zipfile.ZipFile(archive) as zipped:
        infos = zipped.infolist()
        for info in infos:
            _member_path(archive, info.filename)
        zipped.extractall(destination, members=infos)
        for info in infos:  # zipfile drops Unix modes; executables (nvcc) need them back
            mode = info.external_attr >> 16
            if mode and not info.is_dir() and not stat.S_ISLNK(mode):
                (destination / info.filename).chmod(0o600 | (mode & 0o755))


def unpack(archive: Path, destination: Path, strip: str = "") -> Path:
    """Unpack into `destination`; return the package root (`strip`, or the archive's single top directory).

    Raises ArchiveError, after removing what was unpacked, for a member that would escape `destination`.
    """
    destination.mkdir(parents=True, exist_ok=True)
    try:
        if zipfile.is_zipfile(archive):
            _unpack_zip(archive, destination)
        elif tarfile.is_tarfile(archive):
            _unpack_tar(archive, destination)
        else:
            raise ArchiveError(f"{archive.name} is neither a tar nor a zip archive")
        root = _package_root(archive, destination, strip)
        _check_links(archive, destination)
        if root != destination:  # a binary install copies the root alone: its links must stay in it
            _check_links(archive, root)
    except (ArchiveError, tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
        shutil.rmtree(destination, ignore_errors=True)
        if isinstance(exc, ArchiveError):
            raise
        raise ArchiveError(f"cannot unpack {archive.name}: {exc}") from None
    return root


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
