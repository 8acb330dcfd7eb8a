"""The one function through which hpcdl's Python writes files where the user points it
(hpcdl.common.output_file): new files only, the user's own replaced on request and atomically, nothing
written into another user's file or through a link another user could have planted (at the path or in a
directory on the way), and a message that says why."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from other_user import OtherUser

from hpcdl.common.output_file import OutputFileError, open_output_file, private_directory, write_output_file


def test_a_new_file_gets_the_mode_asked_for(tmp_path: Path) -> None:
    path = write_output_file(tmp_path / "lock.yaml", "lockfile", "a: 1\n")
    assert path.read_text() == "a: 1\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    shared = write_output_file(tmp_path / "module.lua", "modulefile", b"x", mode=0o644)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o644 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_users_file_is_replaced_only_when_asked_and_atomically(tmp_path: Path) -> None:
    path = tmp_path / "lock.yaml"
    path.write_text("the user's\n")
    with pytest.raises(
        OutputFileError, match=r"lock.yaml: the file already exists; pass --force to replace it"
    ):
        write_output_file(path, "lockfile", "new\n")
    assert path.read_text() == "the user's\n"
    with path.open() as held:  # whoever holds the old file keeps the old contents
        write_output_file(path, "lockfile", "new\n", replace=True)
        assert held.read() == "the user's\n"
    assert path.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock.yaml"]


def test_a_link_at_the_path_is_replaced_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    link = tmp_path / "out"
    link.symlink_to(victim)
    with pytest.raises(OutputFileError, match="the symbolic link already exists"):
        write_output_file(link, "script", "new\n")
    write_output_file(link, "script", "new\n", replace=True)
    assert not link.is_symlink() and link.read_text() == "new\n" and victim.read_text() == "keep\n"


def test_the_users_own_links_are_followed_and_parents_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "scratch").mkdir()
    (tmp_path / "runs").symlink_to(tmp_path / "scratch")  # absolute, in a directory only the user writes
    with open_output_file(tmp_path / "runs" / "a" / "b" / "log", "log", parents=True) as out:
        out.write("ok\n")
    assert (tmp_path / "scratch" / "a" / "b" / "log").read_text() == "ok\n"
    monkeypatch.chdir(tmp_path)
    write_output_file("runs/rel", "log", "ok\n")  # relative: walked from the working directory
    assert (tmp_path / "scratch" / "rel").read_text() == "ok\n"


def test_a_missing_directory_or_a_directory_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OutputFileError, match=r"the directory .*/missing does not exist; create it"):
        write_output_file(tmp_path / "missing" / "log", "log", "x")
    with pytest.raises(OutputFileError, match="names a directory"):
        write_output_file(f"{tmp_path}/", "log", "x")
    (tmp_path / "dir").mkdir()
    with pytest.raises(OutputFileError, match="is a directory"):
        write_output_file(tmp_path / "dir", "log", "x", replace=True)


def test_a_file_another_user_made_is_neither_written_into_nor_replaced(
    shared_dir: Path, other_user: OtherUser
) -> None:
    path = shared_dir / "lock.yaml"
    other_user.run(f"echo theirs > {path} && chmod 666 {path}")
    for replace in (False, True):
        with pytest.raises(OutputFileError, match=f"a file of user {other_user.name} .* is there") as err:
            write_output_file(path, "lockfile", "mine\n", replace=replace)
        assert "remove it (or have it removed) or choose another path" in str(err.value)
    assert path.read_text() == "theirs\n" and path.stat().st_uid == other_user.uid


def test_a_link_another_user_planted_is_not_followed_nor_replaced(
    shared_dir: Path, other_user: OtherUser, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    other_user.run(f"ln -s {victim} {shared_dir}/sub && ln -s {victim}/x {shared_dir}/out")
    with pytest.raises(OutputFileError, match="could have planted or replaced") as err:
        write_output_file(shared_dir / "sub" / "a" / "log", "log", "x", parents=True)
    assert f"{shared_dir}/sub is a symbolic link (to {victim})" in str(err.value)
    with pytest.raises(OutputFileError, match=f"a symbolic link of user {other_user.name}"):
        write_output_file(shared_dir / "out", "log", "x", replace=True)
    assert list(victim.iterdir()) == []


def test_in_a_sticky_directory_only_the_users_own_links_are_followed(
    shared_dir: Path, other_user: OtherUser, tmp_path: Path
) -> None:
    sticky = shared_dir.parent / "tmp"  # like /tmp: root's, everyone may add entries, not replace others'
    sticky.mkdir()
    sticky.chmod(0o1777)
    other_user.run(f"ln -s {tmp_path} {sticky}/theirs")
    (sticky / "mine").symlink_to(tmp_path)
    write_output_file(sticky / "mine" / "log", "log", "ok\n")
    assert (tmp_path / "log").read_text() == "ok\n"
    with pytest.raises(OutputFileError, match=f"belongs to user {other_user.name}"):
        write_output_file(sticky / "theirs" / "log2", "log", "x")
    assert not (tmp_path / "log2").exists()


def test_a_private_directory_is_made_or_narrowed_and_never_a_link(tmp_path: Path) -> None:
    made = private_directory(tmp_path / "a" / "cache", "download cache")
    assert stat.S_IMODE(made.st_mode) == 0o700 and made.st_ino == (tmp_path / "a" / "cache").stat().st_ino
    (tmp_path / "open").mkdir(mode=0o775)
    assert stat.S_IMODE(private_directory(tmp_path / "open", "stage").st_mode) == 0o700
    (tmp_path / "link").symlink_to(tmp_path / "open")
    with pytest.raises(OutputFileError, match=r"cannot make the stage .*/link: it is not a directory"):
        private_directory(tmp_path / "link", "stage")


def test_another_users_directory_is_not_taken_for_a_private_one(
    shared_dir: Path, other_user: OtherUser
) -> None:
    with pytest.raises(OutputFileError, match=f"it belongs to user {other_user.name}"):
        private_directory(shared_dir, "download cache")
    assert stat.S_IMODE(shared_dir.stat().st_mode) == 0o777
