"""`hpcdl stack resolve` / `recipes` and `hpcdl module write` as a user types them (in-process), and how
`hpcdl stack build` draws its progress on a terminal."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from hpcdl.cli.main import app
from hpcdl.cli.stack import _BuildDisplay
from hpcdl.common import progress
from hpcdl.common.exceptions import HpcdlError
from hpcdl.common.sizes import parse_size
from hpcdl.stack.builder import PackageStep
from hpcdl.stack.fetch import Transfer
from hpcdl.stack.lockfile import load_lock

runner = CliRunner()


def test_resolve_writes_a_lockfile_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "stack.lock"
    args = ["stack", "resolve", "cuda@12.4", "pytorch@2.5", "mpi=openmpi", "--driver", "550.54.15"]
    done = runner.invoke(app, [*args, "--format", "lock", "-o", str(out)])
    assert done.exit_code == 0, done.output
    assert load_lock(out).package("pytorch").version == "2.5.1"
    again = runner.invoke(app, [*args, "--format", "lock", "-o", str(out)])
    assert again.exit_code == 2 and "--force" in again.output
    assert runner.invoke(app, [*args, "--format", "lock", "-o", str(out), "--force"]).exit_code == 0


def test_resolve_errors_are_messages_not_tracebacks() -> None:
    done = runner.invoke(app, ["stack", "resolve", "cuda@12.8", "pytorch@2.5", "--driver", "550.54.15"])
    assert done.exit_code == 2
    assert "hpcdl stack resolve: error: no consistent stack" in done.output
    assert "Traceback" not in done.output
    bad = runner.invoke(app, ["stack", "resolve", "cuda@twelve"])
    assert bad.exit_code == 2 and "is not a version range" in bad.output
    fmt = runner.invoke(app, ["stack", "resolve", "cuda", "--format", "xml"])
    assert fmt.exit_code == 2 and "choose table, lock or spack" in fmt.output


def test_recipes_lists_and_reports_broken_user_recipes(tmp_path: Path) -> None:
    listed = runner.invoke(app, ["stack", "recipes"])
    assert listed.exit_code == 0 and "openmpi" in listed.output and "autotools" in listed.output
    (tmp_path / "mine.yaml").write_text("name: mine\ndescription: x\nversions: {}\nbuild: {system: waf}\n")
    broken = runner.invoke(app, ["stack", "recipes", "--recipes", str(tmp_path)])
    assert broken.exit_code == 2
    assert f"{tmp_path / 'mine.yaml'}:4: build system 'waf' is unknown" in broken.output


def test_module_write_needs_an_installed_stack(tmp_path: Path) -> None:
    lock = tmp_path / "stack.lock"
    runner.invoke(
        app, ["stack", "resolve", "ucx", "--driver", "550.54.15", "--format", "lock", "-o", str(lock)]
    )
    done = runner.invoke(app, ["module", "write", str(lock), "--prefix", str(tmp_path / "nothing")])
    assert done.exit_code == 2 and "not installed under" in done.output and "hpcdl stack build" in done.output
    nohpcdl = runner.invoke(
        app, ["module", "write", "--prefix", str(tmp_path), "--root", str(tmp_path / "mf")]
    )
    assert nohpcdl.exit_code == 2 and "no hpcdl installed under" in nohpcdl.output


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_build_progress_on_a_terminal_shows_packages_bytes_and_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _Tty()
    monkeypatch.setattr(progress.sys, "stderr", out)
    monkeypatch.setattr(progress, "Console", lambda stderr: Console(file=out, force_terminal=True, width=150))
    with progress.bar("stack build", None) as bar:
        display = _BuildDisplay(bar)
        display.step(PackageStep(1, 2, "openmpi@4.1.6~cuda", "fetching", 0))
        display.transfer(
            Transfer("openmpi-4.1.6.tar.bz2", "http://m/o", 4_000_000, 10_000_000, 1_000_000, 1.5)
        )
        assert bar.description.endswith("openmpi-4.1.6.tar.bz2 4.0 MB/10.0 MB at 2.0 MB/s")
        display.transfer(
            Transfer("openmpi-4.1.6.tar.bz2", "http://m/o", 10_000_000, 10_000_000, 1_000_000, 3.0, True)
        )
        display.step(PackageStep(1, 2, "openmpi@4.1.6~cuda", "installed", 1))
    shown = out.getvalue()
    assert "[1/2] openmpi@4.1.6~cuda" in shown and "1/2" in shown
    assert "fetched openmpi-4.1.6.tar.bz2: 10.0 MB in 3.0 s (3.0 MB/s, resumed after 1.0 MB)" in shown


def test_max_download_sizes() -> None:
    assert [parse_size(s) for s in ("100", "100B", "8G", "8 GiB", "500m", "2k")] == [
        100,
        100,
        8 << 30,
        8 << 30,
        500 << 20,
        2048,
    ]
    with pytest.raises(HpcdlError, match=r"'8\.5G' is not a size"):
        parse_size("8.5G")
