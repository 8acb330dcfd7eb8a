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
