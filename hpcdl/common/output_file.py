"""Every file hpcdl writes where the user points it (lockfiles, modulefiles, batch scripts, job records,
rank logs, build logs, study results...) is opened by :func:`open_output_file`, so that on a shared
cluster it never writes into another user's file, nor through a link another user could have planted.
Its twin in the runtime, for the timeline and the engine's other files, is ``open_output_file`` in
``collectives/src/engine/output_file.h``; both follow the same rules:

- The parent directories are walked one component at a time from ``/`` (or from the working directory,
  for a relative path), each opened with ``O_NOFOLLOW|O_DIRECTORY`` relative to the one before. A symbolic
  link on the way is followed only when no other user could have planted or replaced it: the link belongs
  to you or root, in a directory that belongs to you or root and that nobody else may write, or that has
  the sticky bit (``/tmp``: others cannot replace your entries there). A link in a shared directory
  (``/tmp/shared/sub -> /home/you/data``) is refused, not followed.
- The file is created exclusively (``O_CREAT|O_EXCL|O_NOFOLLOW``) in the directory so opened: nothing that
  is already there is written into (or truncated). An existing entry of yours is replaced only when the
  caller asks (``replace``: ``--force`` on the command line), atomically, by a new file made beside it and
  renamed over it, so a link is replaced rather than written through and whoever holds the old file open
  does not see the new contents. An entry of another user's is refused either way.
- A refusal is an :class:`OutputFileError` that names the path, the reason and what to do.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import stat
from pathlib import Path
from typing import IO, Any, Union

from hpcdl.common.exceptions import HpcdlError

PathLike = Union[str, "os.PathLike[str]"]
MAX_LINKS = 40  # as the kernel: more links than this on one path is a loop
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class OutputFileError(HpcdlError):
    """hpcdl refused to write a file where it was asked to; the message says why and what to do."""


def _user(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _others_may_replace(directory: os.stat_result) -> str | None:
    """Why users other than you and root may replace entries of yours in `directory` (None: they may not)."""
    if directory.st_uid not in (0, os.geteuid()):
        return f"it belongs to {_user(directory.st_uid)}"
    if directory.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not directory.st_mode & stat.S_ISVTX:
        return f"others may write it (mode {stat.S_IMODE(directory.st_mode):o}, without the sticky bit)"
    return None


def _untrusted_link(directory_fd: int, name: str) -> str | None:
    """Why the link `name` in `directory_fd` may have been planted or replaced by another user (None: it
    may not)."""
    link = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    if link.st_uid not in (0, os.geteuid()):
        return f"it belongs to {_user(link.st_uid)}"
    why = _others_may_replace(os.fstat(directory_fd))
    return f"it is in a directory another user could change: {why}" if why else None


class _Walk:
    """The directories of one output path, opened component by component (see the module's rules)."""

    def __init__(self, path: str, what: str, making: bool = False) -> None:
        self.path = path
        self.head = f"cannot make the {what} {path}" if making else f"cannot write the {what} to {path}"

    def refuse(self, why: str, fix: str) -> OutputFileError:
        return OutputFileError(f"{self.head}: {why}; {fix}")

    def open_directory(self, directory: str, parents: bool) -> int:
        """A descriptor of `directory` (the path's, or the path itself when it names a directory); with
        `parents`, missing directories are made on the way."""
        pending = [c for c in directory.split("/") if c not in ("", ".")]
        shown = "/" if self.path.startswith("/") else ""
        fd = os.open("/" if self.path.startswith("/") else ".", _DIRECTORY_FLAGS)
        links = 0
        try:
            while pending:
                name = pending.pop(0)
                try:
                    following = os.open(name, _DIRECTORY_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not parents:
                        where = os.path.join(shown, name)
                        raise self.refuse(
                            f"the directory {where} does not exist", "create it or choose another path"
                        ) from None
                    with contextlib.suppress(FileExistsError):  # made meanwhile: opened as it is
                        os.mkdir(name, 0o777, dir_fd=fd)
                    pending.insert(0, name)
                    continue
                except OSError as exc:
                    if not stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        where = os.path.join(shown, name)
                        raise self.refuse(
                            f"{where} is not a usable directory ({exc.strerror})", "choose another path"
                        ) from None
                    target = os.readlink(name, dir_fd=fd)
                    why = _untrusted_link(fd, name)
                    if why:
                        raise self.refuse(
                            f"{os.path.join(shown, name)} is a symbolic link (to {target}) that another user "
                            f"could have planted or replaced ({why}), which hpcdl does not follow",
                            "give a path without it (where it should lead, if you made it)",
                        ) from None
                    links += 1
                    if links > MAX_LINKS:
                        raise self.refuse(
                            "too many levels of symbolic links", "choose another path"
                        ) from None
                    pending[:0] = [c for c in target.split("/") if c not in ("", ".")]
                    if target.startswith("/"):
                        following = os.open("/", _DIRECTORY_FLAGS)
                        os.close(fd)
                        fd, shown = following, "/"
                    continue
                os.close(fd)
                fd, shown = following, os.path.join(shown, name)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def create(self, directory: int, name: str, mode: int, replace: bool) -> int:
        """A new file `name` in `directory`, open for writing; an existing entry replaced or refused."""
        try:
            return os.open(name, _CREATE_FLAGS, mode, dir_fd=directory)
        except FileExistsError:
            pass
        there = os.stat(name, dir_fd=directory, follow_symlinks=False)
        kind = "symbolic link" if stat.S_ISLNK(there.st_mode) else "file"
        if there.st_uid != os.geteuid():
            raise self.refuse(
                f"a {kind} of {_user(there.st_uid)} is there, which hpcdl neither writes into nor replaces",
                "remove it (or have it removed) or choose another path",
            )
        if stat.S_ISDIR(there.st_mode):
            raise self.refuse("it is a directory", "give the path of a file")
        if not replace:
            exists = f"the {kind} already exists"
            raise self.refuse(exists, "pass --force to replace it, or choose another path")
        temporary = f".{name}.{secrets.token_hex(6)}"
        fd = os.open(temporary, _CREATE_FLAGS, mode, dir_fd=directory)
        try:
            os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=directory)
            raise
        return fd


def open_output_fd(
    path: PathLike, what: str, *, replace: bool = False, parents: bool = False, mode: int = 0o600
) -> int:
    """A descriptor open for writing on a new file at `path` (see the module's rules); `what` names the
    file in errors ("timeline", "lockfile"); `replace` replaces an existing file or link of yours (else it
    is refused); `parents` makes missing parent directories; `mode` is the new file's (less the umask).

    Raises :class:`OutputFileError` with the reason when hpcdl will not write there.
    """
    walk = _Walk(os.fspath(path), what)
    name = os.path.basename(walk.path)
    if name in ("", ".", ".."):
        raise walk.refuse("it names a directory, not a file", "give the path of a file")
    try:
        directory = walk.open_directory(os.path.dirname(walk.path), parents)
        try:
            return walk.create(directory, name, mode, replace)
        finally:
            os.close(directory)
    except OutputFileError:
        raise
    except OSError as exc:
        raise walk.refuse(exc.strerror or str(exc), "choose a path you may write") from None


def make_directories(path: PathLike, what: str) -> Path:
    """Makes the directory `path` and its missing parents (``mkdir -p``) by the same rules: no link another
    user could have planted is followed on the way. Raises :class:`OutputFileError`."""
    walk = _Walk(os.fspath(path), what, making=True)
    try:
        os.close(walk.open_directory(walk.path, parents=True))
    except OSError as exc:
        raise walk.refuse(exc.strerror or str(exc), "choose a path you may write") from None
    return Path(path)


def private_directory(path: PathLike, what: str) -> os.stat_result:
    """Makes (mode 0700, parents as :func:`make_directories`) or checks a directory that only you may use,
    for what must not change between hpcdl's check and its use (downloads, unpacked sources); returns its
    ``lstat``, to recognise it later. One of yours that others may use is made private; a link, or another
    user's directory, is refused with :class:`OutputFileError`."""
    walk = _Walk(os.fspath(path), what, making=True)
    name = os.path.basename(walk.path.rstrip("/"))
    try:
        parent = walk.open_directory(os.path.dirname(walk.path.rstrip("/")), parents=True)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=parent)
            try:
                fd = os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
            except OSError:
                raise walk.refuse("it is not a directory (a link or a file is there)", "remove it") from None
        finally:
            os.close(parent)
        try:
            there = os.fstat(fd)
            if there.st_uid != os.geteuid():
                raise walk.refuse(
                    f"it belongs to {_user(there.st_uid)}, who could change what hpcdl checked before it "
                    "is used",
                    "remove it (or have it removed), or use a directory of your own",
                )
            if stat.S_IMODE(there.st_mode) & 0o077:
                os.fchmod(fd, 0o700)
                there = os.fstat(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise walk.refuse(exc.strerror or str(exc), "choose a path you may write") from None
    return there


def open_output_file(
    path: PathLike,
    what: str,
    *,
    binary: bool = False,
    replace: bool = False,
    parents: bool = False,
    mode: int = 0o600,
) -> IO[Any]:
    """:func:`open_output_fd` as a file object (text in UTF-8, or `binary`), for ``with`` blocks."""
    fd = open_output_fd(path, what, replace=replace, parents=parents, mode=mode)
    return os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")


def write_output_file(
    path: PathLike,
    what: str,
    data: str | bytes,
    *,
    replace: bool = False,
    parents: bool = False,
    mode: int = 0o600,
) -> Path:
    """Writes `data` to a new file at `path` through :func:`open_output_fd`; returns the path."""
    fd = open_output_fd(path, what, replace=replace, parents=parents, mode=mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data.encode() if isinstance(data, str) else data)
    return Path(path)
