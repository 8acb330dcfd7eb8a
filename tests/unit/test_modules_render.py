"""Modulefile rendering: the hierarchy placement, safe values, no silent overwrite, and the shipped
modulefiles staying what the templates render."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.modules.own import render_own
from hpcdl.modules.render import ModuleWriteError, render, shipped_modulefiles, write_file
from hpcdl.modules.stack_modules import Compiler, placement
from hpcdl.stack.lockfile import lock_from_solution
from hpcdl.stack.recipe import load_recipes
from hpcdl.stack.resolver import Resolver
from hpcdl.stack.spec import parse_request
from hpcdl.stack.tables import builtin_tables

GCC = Compiler("gcc", "12")


def test_shipped_modulefiles_match_the_templates() -> None:
    shipped = shipped_modulefiles() / "hpcdl"
    versions = {p.name.removesuffix(".lua") for p in shipped.iterdir()}
    assert len(versions) == 1, "one hpcdl version ships"
    version = versions.pop()
    assert (shipped / f"{version}.lua").read_text() == render_own("lua", None, [])
    assert (shipped / version).read_text() == render_own("tcl", None, [])


def test_hierarchy_placement() -> None:
    recipes = load_recipes()
    solution = Resolver(recipes, builtin_tables()).resolve(
        parse_request(["cuda@12.4", "hpcdl", "mpi4py", "mpi=mpich"])
    )
    lock = lock_from_solution(solution)
    place = {p.name: placement(p, lock, recipes, GCC) for p in lock.packages}
    assert place["cuda"].directory == ("Core", "cuda")
    assert place["mpich"].directory == ("Compiler", "gcc", "12", "mpich")
    assert place["mpich"].modulepath == ("MPI", "gcc", "12", "mpich", "4.0.2")
    assert place["hpcdl"].directory == ("MPI", "gcc", "12", "mpich", "4.0.2", "hpcdl")
    assert place["mpi4py"].directory == ("MPI", "gcc", "12", "mpich", "4.0.2", "mpi4py")


def context(**changes: object) -> dict:
    base = {
        "name": "openmpi",
        "version": "4.1.4",
        "description": "Open MPI",
        "homepage": "https://www.open-mpi.org",
        "prefix": "/opt/stack/openmpi/4.1.4-abc",
        "spec": "openmpi@4.1.4~cuda",
        "origin": "test",
        "family": "mpi",
        "depends_on": ["ucx/1.13.1"],
        "modulepath": ["/opt/mf/MPI/gcc/12/openmpi/4.1.4"],
        "setenv": [("MPI_HOME", "/opt/stack/openmpi/4.1.4-abc")],
        "prepend_path": [("PATH", "/opt/stack/openmpi/4.1.4-abc/bin")],
    }
    return {**base, **changes}


def test_lua_and_tcl_carry_family_dependencies_and_help() -> None:
    lua = render("package.lua.j2", **context())
    assert 'family("mpi")' in lua and 'depends_on("ucx/1.13.1")' in lua
    assert 'prepend_path("MODULEPATH", "/opt/mf/MPI/gcc/12/openmpi/4.1.4")' in lua
    assert 'whatis("Version: 4.1.4")' in lua and "help([[" in lua
    tcl = render("package.tcl.j2", **context())
    assert tcl.startswith("#%Module1.0") and "family mpi" in tcl and "prereq ucx/1.13.1" in tcl
    assert 'setenv MPI_HOME "/opt/stack/openmpi/4.1.4-abc"' in tcl and "proc ModulesHelp" in tcl


@pytest.mark.parametrize("bad", ['/opt/x"y', "/opt/$HOME", "/opt/[exec rm]", "/opt/a\nb"])
def test_values_a_modulefile_would_interpret_are_refused(bad: str) -> None:
    with pytest.raises(ModuleWriteError, match="install into a path without them"):
        render("package.lua.j2", **context(prefix=bad))


def test_write_file_never_overwrites_different_content(tmp_path: Path) -> None:
    path = tmp_path / "mf" / "openmpi" / "4.1.4.lua"
    assert write_file(path, "one", force=False).changed
    assert not write_file(path, "one", force=False).changed
    with pytest.raises(ModuleWriteError, match="pass --force"):
        write_file(path, "two", force=False)
    assert path.read_text() == "one"
    assert write_file(path, "two", force=True).changed and path.read_text() == "two"
