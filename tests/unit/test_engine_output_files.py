"""Files the engine writes for the user (the timeline, the autotune log) in a directory others may write:
created 0600 and never written through a symbolic link planted at the path."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

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
