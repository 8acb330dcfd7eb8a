"""docs/horovod-conformance.md is reproducible from the page alone: the alias package it shows, made by its
own commands, makes ``import horovod.torch`` load hpcdl.torch and gives the runner helper the tests use."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "horovod-conformance.md"

CHECK = """
import threading
import horovod.torch as hvd
import hpcdl.torch
from horovod.runner.util.threads import in_thread

assert hvd is hpcdl.torch
done = threading.Event()
thread = in_thread(target=done.set)
thread.join(10)
assert done.is_set() and thread.daemon
print("alias ok")
"""


def test_the_alias_package_made_as_the_page_says_serves_horovods_tests(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    text = DOC.read_text()
    making = text[text.index("An alias package") :]
    block = re.search(r"```console\n(.*?)```", making, re.DOTALL)
    assert block, "the page shows how to make the alias package"
    script = re.sub(r"^\$ ", "", block.group(1), flags=re.MULTILINE)
    subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, check=True, timeout=60)
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "alias"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "alias ok", done.stderr
