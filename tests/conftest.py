"""Suite-wide settings: every test in tests/parallel is `parallel`, in tests/integration `integration`."""

from __future__ import annotations

from pathlib import Path

import pytest

_DIR_MARKERS = {"parallel": pytest.mark.parallel, "integration": pytest.mark.integration}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for directory, marker in _DIR_MARKERS.items():
            if directory in parts:
                item.add_marker(marker)
