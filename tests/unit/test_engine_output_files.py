"""Files the engine writes for the user (the timeline, the autotune log) in a directory others may write:
created 0600, never written through a symbolic link planted at the path or in a directory on the way,
never into another user's file; a rerun replaces the user's own file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from other_user import OtherUser

import hpcdl.common as hc


@pytest.fixture(autouse=True)
def alone(monkeypatch: pytest.MonkeyPatch):
    for var in ("HPCDL_RANK", "HPCDL_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(var, raising=False)
    yield
    hc.shutdown()


SETTINGS = {
    "timeline": lambda path: {"timeline": str(path)},
    "autotune log": lambda path: {"autotune": True, "autotune_log": str(path)},
}


@pytest.mark.parametrize("what", SETTINGS)
def test_a_link_planted_at_the_path_is_not_written_through(what: str, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("the user's data\n")
    planted = tmp_path / "output"
    planted.symlink_to(victim)
    with pytest.raises(hc.HpcdlConfigError, match="symbolic link") as err:
        hc.init(timeout=5, **SETTINGS[what](planted))
    assert f"the {what} to {planted}" in str(err.value)
    assert victim.read_text() == "the user's data\n"


@pytest.mark.parametrize("what", SETTINGS)
def test_written_only_for_the_user(what: str, tmp_path: Path) -> None:
    path = tmp_path / "output"
    old_mask = os.umask(0o022)
    try:
        hc.init(timeout=5, **SETTINGS[what](path))
    finally:
        os.umask(old_mask)
    hc.shutdown()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_size > 0


def test_an_unwritable_autotune_log_is_an_error_not_silence(tmp_path: Path) -> None:
    with pytest.raises(hc.HpcdlConfigError, match=r"cannot write the autotune log to .*No such file"):
        hc.init(timeout=5, autotune=True, autotune_log=str(tmp_path / "missing" / "log.csv"))


@pytest.mark.parametrize("what", SETTINGS)
def test_a_file_another_user_made_there_is_not_written_into(
    what: str, shared_dir: Path, other_user: OtherUser
) -> None:
    path = shared_dir / "output"
    other_user.run(f"touch {path} && chmod 666 {path}")
    with pytest.raises(hc.HpcdlConfigError, match=f"a file of user {other_user.name} .* is there") as err:
        hc.init(timeout=5, **SETTINGS[what](path))
    assert f"the {what} to {path}" in str(err.value)
    assert path.stat().st_size == 0 and path.stat().st_uid == other_user.uid


@pytest.mark.parametrize("what", SETTINGS)
def test_a_directory_link_another_user_planted_is_not_followed(
    what: str, shared_dir: Path, other_user: OtherUser, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "output").write_text("the user's data\n")
    other_user.run(f"ln -s {victim} {shared_dir}/sub")
    with pytest.raises(hc.HpcdlConfigError, match="another user could have planted") as err:
        hc.init(timeout=5, **SETTINGS[what](shared_dir / "sub" / "output"))
    assert f"{shared_dir}/sub is a symbolic link (to {victim})" in str(err.value)
    assert f"belongs to user {other_user.name}" in str(err.value)
    assert sorted(p.name for p in victim.iterdir()) == ["output"]
    assert (victim / "output").read_text() == "the user's data\n"


def test_the_users_own_links_are_followed_and_a_rerun_replaces_its_file(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "runs").symlink_to("real")  # a link of the user's, in a directory only the user may write
    path = tmp_path / "runs" / "timeline.json"
    for _ in range(2):
        hc.init(timeout=5, timeline=str(path))
        hc.shutdown()
    assert (tmp_path / "real" / "timeline.json").read_text().startswith("[")
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["timeline.json"]  # no file left beside
