"""scripts/gpu-check.sh here, without a GPU: its dry mode runs every step on the CPU with the gloo stand-in
and prints the verdict table; a step out of time fails its row while the others still run; and its install
step builds hpcdl from the tree into a fresh virtual environment with pip cut off from any network, from a
folder of wheels prepared by scripts/gpu_check/prepare-wheels.sh."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check.sh"


def verdict_rows(out: Path) -> list[tuple[str, str, str]]:
    """(check, result, figure) of each row of the table in verdict.md."""
    rows = []
    for line in (out / "verdict.md").read_text().splitlines():
        if line.startswith("| ") and not line.startswith(("| check |", "| size |")):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            if len(cells) == 3:
                rows.append((cells[0], cells[1], cells[2]))
    return rows


def gpu_check(out: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("HPCDL_GPU_OPERATIONS", None)
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry", "--out", str(out), *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO,
    )  # fmt: skip


@pytest.mark.slow
def test_dry_mode_runs_every_step_on_the_cpu_and_prints_one_verdict_table(tmp_path: Path) -> None:
    done = gpu_check(tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "gpu-check: PASSED" in done.stdout
    rows = verdict_rows(tmp_path)
    by_check = {check: (result, figure) for check, result, figure in rows}
    assert by_check["gpu-marked tests (pytest -m gpu)"][0] == "skipped"
    one_rank = [r for r in rows if r[0].startswith("1 rank, gloo stand-in")]
    assert len(one_rank) == 1 and one_rank[0][1] == "pass" and one_rank[0][2].endswith(" cases")
    assert int(one_rank[0][2].split()[0]) > 500  # dtypes x layouts x collectives
    nvtx = by_check["NVTX ranges of the executor's batches (NVTX tool library)"]
    assert nvtx == ("skipped", "dry: the probe builds; NVTX ranges are opened on CUDA only")
    ranks = [r for r in rows if " ranks, " in r[0]]
    assert {r[0].split(" ranks")[0] for r in ranks} == {"2", "4"}
    assert all(r[1] == "pass" for r in ranks), ranks
    measured = [r for r in rows if r[1] == "measured"]
    assert [r[0].split(",")[0] for r in measured] == [
        "engine overhead",
        "fusion of ResNet-50's 161 gradients (102 MB)",
    ]
    assert "4 B: " in measured[0][2] and "1 MiB: " in measured[0][2]
    assert not [r for r in rows if r[1] == "FAIL"], rows
    sweep = (tmp_path / "verdict.md").read_text().split("Engine overhead by size (1 rank):")[1]
    assert sweep.count("\n| ") == 1 + 10  # the header, then 4 B .. 1 MiB
    for step in ("gpu_tests", "one_rank", "ranks", "gpu_overhead", "gpu_fusion"):
        assert (tmp_path / f"{step}.out").is_file(), step


def test_a_step_out_of_time_fails_its_row_and_the_next_step_still_runs(tmp_path: Path) -> None:
    done = gpu_check(tmp_path, "--only", "gpu_tests,one_rank", "--timeout", "gpu_tests=1", timeout=300)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    rows = verdict_rows(tmp_path)
    assert ("gpu-marked tests", "FAIL", "timed out after 1 s (see gpu_tests.out/.err)") in rows
    assert [r[1] for r in rows if r[0].startswith("1 rank, gloo stand-in")] == ["pass"]
    assert "gpu-check: FAILED" in done.stdout


def test_a_bad_argument_is_refused_with_the_steps_named(tmp_path: Path) -> None:
    done = gpu_check(tmp_path, "--only", "gpu_test", timeout=120)
    assert done.returncode == 2 and "--only: no step gpu_test" in done.stderr
    done = gpu_check(tmp_path, "--frobnicate", timeout=60)
    assert done.returncode == 2 and "unknown argument --frobnicate (see --help)" in done.stderr


def _tree_copy(to: Path) -> Path:
    """The repository's files (tracked, and new ones git does not ignore), as they would travel."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    return to


def _offline(command: list[str]) -> list[str]:
    """``command`` in a network namespace of its own with only loopback up: no route to any index."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("needs unshare and ip (util-linux, iproute2: scripts/setup.sh installs them)")
    script = 'ip link set lo up && exec "$@"'
    return [
        "unshare",
        "--net",
        *([] if os.geteuid() == 0 else ["--map-root-user"]),
        "sh",
        "-c",
        script,
        "sh",
        *command,
    ]


def _imports(python: Path, *modules: str) -> dict[str, str]:
    code = "import importlib, sys\nfor m in sys.argv[1:]: print(m, importlib.import_module(m).__file__)"
    done = subprocess.run(
        [str(python), "-c", code, *modules], capture_output=True, text=True, cwd="/", check=True
    )
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


def _system_python_first() -> dict[str, str]:
    """The environment without this test's venv on PATH: ``python3`` is the system's, and a venv made from
    it starts empty."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if p != str(Path(sys.executable).parent)
    )
    return env


def _runtime(venv: Path) -> str:
    """The compiled runtime that venv's hpcdl loads (it must load)."""
    code = "import hpcdl.common as hc; b = hc.built(); print(b.library if b.loaded else 'NOT LOADED')"
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.slow
def test_install_step_builds_hpcdl_into_a_fresh_venv_with_pip_cut_off(tmp_path: Path) -> None:
    tree = _tree_copy(tmp_path / "tree")
    wheels = tmp_path / "wheels"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    prepared = subprocess.run(
        ["bash", str(tree / "scripts/gpu_check/prepare-wheels.sh"), "--python-version", version, str(wheels)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHON=sys.executable),
    )  # fmt: skip
    assert prepared.returncode == 0, prepared.stdout[-3000:] + prepared.stderr[-3000:]
    assert any(w.name.startswith("numpy-") for w in wheels.iterdir())
    assert any(w.name.startswith("scikit_build_core-") for w in wheels.iterdir())

    # A fresh venv: every dependency and the build backend come from the folder; the C++ runtime is built.
    fresh = tmp_path / "fresh"
    install = ["bash", str(tree / "scripts/gpu_check/install.sh")]
    env = _system_python_first()
    done = subprocess.run(
        _offline([*install, str(fresh), str(wheels)]), capture_output=True, text=True, timeout=900, env=env
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-5000:]
    assert "Looking in links: " + str(wheels) in log and "Looking in indexes" not in log
    assert "cmake version" in log and "==> built and installed in" in log
    found = _imports(fresh / "bin" / "python", "hpcdl", "numpy", "typer", "jinja2")
    assert found.pop("hpcdl") == str(tree / "hpcdl" / "__init__.py")  # editable, as setup.sh installs it
    assert all(path.startswith(str(fresh)) for path in found.values()), found
    assert _runtime(fresh).startswith(str(fresh)), "the runtime built here is not the one loaded"

    # Layered over that venv, as over a GPU machine's Python: nothing comes from an (empty) folder, the
    # base's packages are used, and hpcdl is the layer's own.
    layered = tmp_path / "layered"
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run(
        _offline([*install, "--over", str(fresh / "bin" / "python"), str(layered), str(empty)]),
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    found = _imports(layered / "bin" / "python", "hpcdl", "numpy")
    assert found["hpcdl"] == str(tree / "hpcdl" / "__init__.py") and found["numpy"].startswith(str(fresh))
    assert _runtime(layered).startswith(str(layered))


def test_install_without_the_wheel_folder_says_how_to_make_it(tmp_path: Path) -> None:
    """A fresh venv lacks the build backend: with no folder the install fails, naming the preparation."""
    install = ["bash", str(REPO / "scripts/gpu_check/install.sh"), str(tmp_path / "v"), str(tmp_path / "no")]
    done = subprocess.run(
        _offline(install), capture_output=True, text=True, timeout=300, env=_system_python_first()
    )
    assert done.returncode != 0
    assert f"no wheel folder {tmp_path / 'no'}: only packages already installed can be used" in done.stderr
    assert (
        "install: failed; if a package was missing, prepare it where pip reaches an index with" in done.stderr
    )
    assert "scikit-build-core" in done.stdout + done.stderr  # what was missing
