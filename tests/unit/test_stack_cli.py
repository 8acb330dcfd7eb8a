"""`hpcdl stack resolve` / `recipes` and `hpcdl module write` as a user types them (in-process)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from hpcdl.cli.main import app
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
