"""Modulefile rendering: the hierarchy placement, values quoted by one function per language, control
characters and non-names refused, no silent overwrite, and the shipped modulefiles staying what the
templates render."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.modules.own import render_own
from hpcdl.modules.quote import lua, tcl
from hpcdl.modules.render import ModuleWriteError, render, shipped_modulefiles, write_file
from hpcdl.modules.stack_modules import Compiler, parse_compiler, placement
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
    lua_text = render("package.lua.j2", **context())
    assert 'family("mpi")' in lua_text and 'depends_on("ucx/1.13.1")' in lua_text
    assert 'prepend_path("MODULEPATH", "/opt/mf/MPI/gcc/12/openmpi/4.1.4")' in lua_text
    assert 'whatis("Version: 4.1.4")' in lua_text
    assert 'help("Open MPI\\nHomepage: https://www.open-mpi.org' in lua_text
    tcl_text = render("package.tcl.j2", **context())
    assert tcl_text.startswith("#%Module1.0") and "proc ModulesHelp" in tcl_text
    assert 'family "mpi"' in tcl_text and 'prereq "ucx/1.13.1"' in tcl_text
    assert 'setenv MPI_HOME "/opt/stack/openmpi/4.1.4-abc"' in tcl_text


def test_lua_and_tcl_quoting_leave_nothing_to_interpret() -> None:
    assert lua('a"b\\c') == '"a\\"b\\\\c"'
    assert lua("two\nlines\x1b]") == '"two\\nlines\\027]"'
    assert lua("]] os.exit(1) --[[") == '"]] os.exit(1) --[["'  # not a long bracket: nothing to close
    assert tcl('$HOME [exec rm] {x} "q" \\') == '"\\$HOME \\[exec rm\\] \\{x\\} \\"q\\" \\\\"'
    assert tcl("a;b\nc\x01") == '"a;b\\012c\\001"'


@pytest.mark.parametrize("field", ["prefix", "description", "homepage", "spec", "origin"])
def test_control_characters_are_refused(field: str) -> None:
    with pytest.raises(ModuleWriteError, match=f"{field}: .*contains a control character"):
        render("package.lua.j2", **context(**{field: "/opt/a\nos.execute('id')"}))


@pytest.mark.parametrize(
    "changes",
    [
        {"name": "x$(id)"},
        {"version": "1.0;id"},
        {"family": 'mpi" os.execute("id'},
        {"depends_on": ["ucx/1.13.1 [exec id]"]},
        {"depends_on": ["../../etc"]},
    ],
)
def test_module_names_that_are_not_names_are_refused(changes: dict) -> None:
    with pytest.raises(ModuleWriteError, match="is not a module name"):
        render("package.tcl.j2", **context(**changes))


def test_environment_variable_names_are_checked() -> None:
    with pytest.raises(ModuleWriteError, match="'PATH;id' is not an environment variable name"):
        render("package.tcl.j2", **context(setenv=[("PATH;id", "/x")]))


def test_a_compiler_name_is_a_module_name() -> None:
    assert parse_compiler("gcc/12") == Compiler("gcc", "12")
    with pytest.raises(ModuleWriteError, match="not a compiler module name"):
        parse_compiler("gcc;id/12")


def test_write_file_never_overwrites_different_content(tmp_path: Path) -> None:
    path = tmp_path / "mf" / "openmpi" / "4.1.4.lua"
    assert write_file(path, "one", force=False).changed
    assert not write_file(path, "one", force=False).changed
    with pytest.raises(ModuleWriteError, match="pass --force"):
        write_file(path, "two", force=False)
    assert path.read_text() == "one"
    assert write_file(path, "two", force=True).changed and path.read_text() == "two"
