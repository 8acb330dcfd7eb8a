"""Unpacking source archives for `hpcdl stack build`: members and links that would write or point outside
the stage are refused (with tarfile's extraction filter present or not: hpcdl does not rely on it), and
archives that stay inside unpack with their links, hard links, modes and times."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from hpcdl.stack.archive import ArchiveError, unpack

OLD_TIME = 1_000_000_000  # 2001: make compares times, so they must survive unpacking


def tar_of(path: Path, *members: tuple[str, str, str]) -> Path:
    """A .tar.gz of (kind, name, data or link target) members; kinds: file, dir, symlink, hardlink, fifo."""
    with tarfile.open(path, "w:gz") as tar:
        for kind, name, payload in members:
            info = tarfile.TarInfo(name)
            info.mtime = OLD_TIME
            data = b""
            if kind == "file":
                data = payload.encode()
                info.size, info.mode = len(data), 0o755 if payload.startswith("#!") else 0o644
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, payload
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, payload
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, io.BytesIO(data) if data else None)
    return path


@pytest.fixture(params=["tarfile-filters", "no-tarfile-filters"])
def python(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each attack runs twice: with tarfile's extraction filters, and as on a Python that has none."""
    if request.param == "no-tarfile-filters":
        for name in ("data_filter", "tar_filter", "fully_trusted_filter"):
            monkeypatch.delattr(tarfile, name, raising=False)
    return request.param


@pytest.fixture
def place(tmp_path: Path) -> tuple[Path, Path]:
    """(stage to unpack into, a directory beside it that an attack would reach with ../outside)."""
    stage = tmp_path / "work" / "stage"
    outside = tmp_path / "work" / "outside"
    outside.mkdir(parents=True)
    (outside / "precious").write_text("keep me")
    return stage, outside


ATTACKS = {
    "absolute path": [("file", "/tmp/hpcdl-evil-absolute", "x")],
    "dot-dot path": [("file", "pkg/../../outside/evil", "x")],
    "absolute symlink, then a file through it": [
        ("symlink", "pkg/escape", "/"),
        ("file", "pkg/escape/tmp/hpcdl-evil-through-link", "x"),
    ],
    "relative symlink leaving the stage": [("symlink", "pkg/up", "../../outside")],
    "symlink chain leaving through another link": [
        ("dir", "pkg/x", ""),
        ("symlink", "pkg/a", "b/x/../../.."),
        ("symlink", "pkg/b", "."),
    ],
    "link made inside a link to the parent": [
        ("symlink", "pkg/here", "."),
        ("symlink", "pkg/here/out", ".."),
    ],
    "hard link to a file outside": [("hardlink", "pkg/passwd", "/etc/passwd")],
    "hard link climbing out": [("hardlink", "pkg/precious", "../outside/precious")],
    "fifo": [("fifo", "pkg/pipe", "")],
}


@pytest.mark.parametrize("attack", ATTACKS.keys())
def test_escaping_members_are_refused(
    attack: str, python: str, place: tuple[Path, Path], tmp_path: Path
) -> None:
    stage, outside = place
    archive = tar_of(tmp_path / "evil.tar.gz", ("file", "pkg/README", "hello"), *ATTACKS[attack])
    with pytest.raises(ArchiveError, match=r"refusing to unpack evil\.tar\.gz"):
        unpack(archive, stage)
    assert not stage.exists(), "what was unpacked is removed"
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]
    assert (outside / "precious").read_text() == "keep me"
    assert not Path("/tmp/hpcdl-evil-absolute").exists()
    assert not Path("/tmp/hpcdl-evil-through-link").exists()


def test_zip_members_climbing_out_are_refused(place: tuple[Path, Path], tmp_path: Path) -> None:
    stage, outside = place
    archive = tmp_path / "evil.whl"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("pkg/ok.txt", "fine")
        zipped.writestr("../outside/evil", "x")
    with pytest.raises(ArchiveError, match=r"'\.\./outside/evil' points outside"):
        unpack(archive, stage)
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]


def test_links_that_stay_inside_unpack_with_modes_and_times(python: str, tmp_path: Path) -> None:
    archive = tar_of(
        tmp_path / "good.tar.gz",
        ("dir", "pkg-1.0", ""),
        ("file", "pkg-1.0/configure", "#!/bin/sh\necho configured\n"),
        ("file", "pkg-1.0/lib/libx.so.1", "library"),
        ("symlink", "pkg-1.0/lib/libx.so", "libx.so.1"),
        ("symlink", "pkg-1.0/bin/x", "../lib/libx.so"),
        ("hardlink", "pkg-1.0/lib/libx-copy.so.1", "pkg-1.0/lib/libx.so.1"),
    )
    root = unpack(archive, tmp_path / "stage")
    assert root == tmp_path / "stage" / "pkg-1.0"
    assert (root / "bin" / "x").read_text() == "library"
    assert os.readlink(root / "lib" / "libx.so") == "libx.so.1"
    assert (root / "lib" / "libx-copy.so.1").stat().st_ino == (root / "lib" / "libx.so.1").stat().st_ino
    assert os.access(root / "configure", os.X_OK)
    assert (root / "configure").stat().st_mtime == OLD_TIME
    assert root.stat().st_mtime == OLD_TIME  # directory times restored after their files were written
    assert (root / "lib" / "libx.so.1").stat().st_mtime < time.time() - 3600


def test_a_binary_root_may_not_link_out_of_itself(tmp_path: Path) -> None:
    """A binary install copies only the stripped root: a link leaving it would leave the install."""
    archive = tar_of(
        tmp_path / "wheel.tar.gz",
        ("file", "vendor/other/secret", "x"),
        ("symlink", "vendor/tool/lib/peek", "../../other/secret"),
    )
    with pytest.raises(ArchiveError, match="leads outside tool"):
        unpack(archive, tmp_path / "stage", strip="vendor/tool")


def test_a_zip_is_unpacked_member_by_member_with_modes_and_times(tmp_path: Path) -> None:
    archive = tmp_path / "tool.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        script = zipfile.ZipInfo("tool-1/bin/run", date_time=(2001, 9, 9, 1, 46, 40))
        script.external_attr = 0o755 << 16
        zipped.writestr(script, "#!/bin/sh\n")
        link = zipfile.ZipInfo("tool-1/lib/link")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zipped.writestr(link, "/etc/passwd")  # a link entry: written as a plain file, as zipfile does
    root = unpack(archive, tmp_path / "stage")
    assert root == tmp_path / "stage" / "tool-1"
    assert os.access(root / "bin" / "run", os.X_OK)
    assert (root / "bin" / "run").stat().st_mtime == time.mktime((2001, 9, 9, 1, 46, 40, 0, 0, -1))
    assert not (root / "lib" / "link").is_symlink() and (root / "lib" / "link").read_text() == "/etc/passwd"


def test_a_zip_member_through_a_file_it_holds_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("pkg/dir", "a file")
        zipped.writestr("pkg/dir/evil.txt", "x")
    with pytest.raises(ArchiveError, match=r"'pkg/dir/evil\.txt' would be written through a link or a file"):
        unpack(archive, tmp_path / "stage")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.zip"]  # nothing left, not even a temporary


def test_sources_are_unpacked_afresh_under_a_directory_only_the_user_may_write(tmp_path: Path) -> None:
    archive = tar_of(tmp_path / "good.tar.gz", ("file", "pkg/README", "hello"))
    (tmp_path / "stage").mkdir()
    (tmp_path / "stage" / "old").write_text("left by someone")
    with pytest.raises(ArchiveError, match="it exists; remove it first"):
        unpack(archive, tmp_path / "stage")
    assert (tmp_path / "stage" / "old").read_text() == "left by someone"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ArchiveError, match=r"shared may be written by others \(mode 777\)"):
        unpack(archive, shared / "stage")
    root = unpack(archive, tmp_path / "private")
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o700 and (root / "README").is_file()
