"""Suite-wide settings: every test in tests/parallel is `parallel`, in tests/integration `integration`."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import other_user as others
import pytest

# Subprocesses that run `hpcdl`, `python3` or `pytest` by name get the ones of the environment running
# the tests (a virtual environment's bin/ is not on PATH unless it was activated).
_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")

_DIR_MARKERS = {"parallel": pytest.mark.parallel, "integration": pytest.mark.integration}


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """The whole suite (no test named on the command line, no ``-n``) runs on one pytest-xdist worker per
    core where pytest-xdist is installed: most tests wait on processes they start, so a second worker uses
    the core the first leaves idle. Each test file runs whole on one worker (``--dist loadfile``), so a
    module's Slurm cluster or hosts start once. ``-n 0`` runs in this process."""
    option = config.option
    if getattr(option, "numprocesses", 0) is not None or hasattr(config, "workerinput"):
        return  # no pytest-xdist, -n given, or this is a worker
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS or option.collectonly or option.usepdb:
        return
    cores = len(os.sched_getaffinity(0))
    if cores > 1:
        option.numprocesses, option.dist = cores, "loadfile"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for directory, marker in _DIR_MARKERS.items():
            if directory in parts:
                item.add_marker(marker)


@pytest.fixture(scope="session")
def other_user() -> Iterator[others.OtherUser]:
    """An unprivileged second user (made for the session when the tests run as root; else skipped)."""
    why = others.why_not()
    if why:
        pytest.skip(why)
    with others.other_user() as user:
        yield user


@pytest.fixture
def shared_dir(other_user: others.OtherUser) -> Iterator[Path]:
    """A directory of the other user's that everyone may write (mode 0777, without the sticky bit)."""
    with others.shared_directory(other_user) as shared:
        yield shared
