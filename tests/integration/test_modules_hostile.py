"""Modulefiles written from hostile values (paths, descriptions, help text, environment values) and loaded by
the real Lmod and the real Environment Modules: nothing in them runs (a canary file stays absent), `module
help`/`whatis` print them literally and every variable holds exactly the value given. Module names that are
not names are refused before anything is written, by `hpcdl module write` too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from module_systems import envmod_root, lmod_missing, run_envmod, run_lmod

from hpcdl.modules.render import render, write_file


def hostile_values(canary: Path) -> list[str]:
    """Each tries to end its string (Lua, Tcl, shell) and run `touch CANARY`."""
    touch = f"touch {canary}"
    return [
        f"$({touch})",
        f"`{touch}`",
        f'"); os.execute("{touch}") --',
        f']] os.execute("{touch}") --[[',
        f"[exec {touch}]",
        f"}} ; exec {touch} ; proc after {{ }} {{",
        f"'; {touch}; '",
        f'" ; {touch} ; "',
        f";{touch};",
        "${HOME} $HOME %s %n",
        "ends in a backslash \\",
        '\\" still quoted',
    ]


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """(modulefile root with lmod/ and tcl/ trees of module evil/1.0, canary path, the hostile values)."""
    canary = tmp_path / "canary"
    values = hostile_values(canary)
    prefix = f'{tmp_path}/opt/$({"touch " + str(canary)})/[exec x]/}}/"q"/evil'
    context = {
        "name": "evil",
        "version": "1.0",
        "description": " | ".join(values),
        "homepage": values[4],
        "prefix": prefix,
        "spec": values[5],
        "origin": values[2],
        "family": "",
        "depends_on": [],
        "modulepath": [],
        "setenv": [(f"HOSTILE_{i}", value) for i, value in enumerate(values)],
        "prepend_path": [("HOSTILE_PATH", prefix + "/bin")],
    }
    root = tmp_path / "modulefiles"
    write_file(root / "lmod" / "evil" / "1.0.lua", render("package.lua.j2", **context), force=False)
    write_file(root / "tcl" / "evil" / "1.0", render("package.tcl.j2", **context), force=False)
    return root, canary, values


def script(tree_dir: Path, count: int) -> str:
    shows = "\n".join(f'printf "%s\\n" "HOSTILE_{i}=$HOSTILE_{i}"' for i in range(count))
    return f"""
    module use {tree_dir}
    module load evil 2>&1
    {shows}
    printf "%s\\n" "HOSTILE_PATH=$HOSTILE_PATH"
    echo "--- help"
    module help evil 2>&1
    echo "--- whatis"
    module whatis evil 2>&1
    module unload evil 2>&1
    echo "after: ${{HOSTILE_0:-unset}}"
    """


def check_loaded(done: subprocess.CompletedProcess, canary: Path, values: list[str]) -> None:
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert not canary.exists(), "a value in the modulefile ran a command"
    lines = done.stdout.splitlines()
    for i, value in enumerate(values):
        assert f"HOSTILE_{i}={value}" in lines, (value, done.stdout)
    assert any(line.startswith("HOSTILE_PATH=") and line.endswith('/}/"q"/evil/bin') for line in lines)
    help_text = done.stdout.split("--- help")[1].split("--- whatis")[0]
    whatis = done.stdout.split("--- whatis")[1]
    assert values[4] in help_text and values[5] in help_text  # [exec ...] and } ... printed, not run
    assert " | ".join(values[:3]) in whatis
    assert lines[-1] == "after: unset"


@pytest.mark.skipif(bool(lmod_missing()), reason=lmod_missing() or "Lmod present")
def test_hostile_values_under_lmod(tree: tuple[Path, Path, list[str]]) -> None:
    root, canary, values = tree
    check_loaded(run_lmod(script(root / "lmod", len(values))), canary, values)


def test_hostile_values_under_environment_modules(tree: tuple[Path, Path, list[str]]) -> None:
    init = envmod_root()
    if isinstance(init, str):
        pytest.skip(init)
    root, canary, values = tree
    check_loaded(run_envmod(init, script(root / "tcl", len(values))), canary, values)


@pytest.mark.parametrize("bad", ["gcc;touch x", "$(touch x)", "a b", "gcc/12/../../x"])
def test_module_write_refuses_a_dependency_that_is_not_a_module_name(tmp_path: Path, bad: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", "module", "write", "--root", str(tmp_path), "--depends-on", bad],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "is not a module name" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []
