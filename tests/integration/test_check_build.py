"""``hpcdl check-build`` as a user runs it: nothing but its matrix on the terminal, the same answer at
once as after importing every framework (--verbose), and what a broken install looks like in each."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path


def hpcdl(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcdl", *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, **env},
    )  # fmt: skip


def test_check_build_prints_its_matrix_and_nothing_else_at_both_depths() -> None:
    """No TensorFlow start-up lines (cpu_feature_guard, absl::InitializeLog) before the matrix, and the
    default (installed facts, no framework imported) says what importing every framework says."""
    quick = hpcdl("check-build")
    deep = hpcdl("check-build", "--verbose")
    for done in (quick, deep):
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert done.stdout.startswith("hpcdl v")
    rows = [line for line in deep.stdout.splitlines() if line.startswith("    [")]
    assert [line for line in quick.stdout.splitlines() if line.startswith("    [")] == [
        re.sub(r"( \(.*\)|: .*)$", "", line) for line in rows
    ]
    for line in rows:  # --verbose says why each missing item is missing
        if line.startswith("    [ ]"):
            name, _, reason = line[8:].partition(": ")
            assert reason, f"no reason given for missing {name!r}"


FAKE_TENSORFLOW = "raise ImportError('libcudart.so.12: cannot open shared object file')\n"


def _fake_tensorflow(site: Path, requires: str) -> None:
    (site / "tensorflow").mkdir(parents=True)
    (site / "tensorflow" / "__init__.py").write_text(FAKE_TENSORFLOW)
    info = site / "tensorflow-2.99.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorflow\nVersion: 2.99.0\n{requires}")
    (info / "top_level.txt").write_text("tensorflow\n")


def test_a_tensorflow_whose_requirements_are_not_installed_is_not_usable(tmp_path: Path) -> None:
    _fake_tensorflow(tmp_path, "Requires-Dist: numpy<1.0\n")
    done = hpcdl("check-build", "--json", PYTHONPATH=str(tmp_path), KERAS_BACKEND="tensorflow")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    frameworks = {row["name"]: row for row in json.loads(done.stdout)["frameworks"]}
    assert not frameworks["TensorFlow"]["available"] and not frameworks["Keras"]["available"]
    assert frameworks["TensorFlow"]["reason"].startswith(
        "tensorflow 2.99.0 is installed but requires numpy<1.0, but numpy "
    )
    assert "runs on the tensorflow backend: tensorflow 2.99.0" in frameworks["Keras"]["reason"]


def test_a_tensorflow_that_fails_to_import_is_shown_with_its_error_by_verbose(tmp_path: Path) -> None:
    _fake_tensorflow(tmp_path, "")
    quick = hpcdl("check-build", PYTHONPATH=str(tmp_path), KERAS_BACKEND="tensorflow")
    assert "    [X] TensorFlow" in quick.stdout  # installed, with what it requires: the quick answer
    done = hpcdl("check-build", "--verbose", PYTHONPATH=str(tmp_path), KERAS_BACKEND="tensorflow")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (
        "[ ] TensorFlow: tensorflow 2.99.0 is installed, but importing it with hpcdl's API fails: "
        "ImportError: libcudart.so.12: cannot open shared object file"
    ) in done.stdout
    assert "[ ] Keras: keras " in done.stdout
