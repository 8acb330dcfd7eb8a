"""Suite-wide settings: every test in tests/parallel is `parallel`, in tests/integration `integration`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
