"""Generated modulefiles under real Lmod and Environment Modules: a stack of two MPIs and a package built
against each (through the real builder), the Core/Compiler/MPI hierarchy, the MPI family swap, depends_on /
prereq, unload; and hpcdl's own modulefile."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from module_systems import LMOD_SYNTAX_CHECK, envmod_root, lmod_missing, run_envmod, run_lmod
from stack_fixtures import MiniStack, new_test_stack

from hpcdl.modules.stack_modules import system_compiler, write_stack_modules
from hpcdl.stack.builder import Builder, BuildOptions, install_dir
from hpcdl.stack.lockfile import Lock, lock_from_solution
from hpcdl.stack.recipe import load_recipes
from hpcdl.stack.resolver import Resolver
from hpcdl.stack.spec import parse_request
from hpcdl.stack.tables import builtin_tables

pytestmark = pytest.mark.skipif(
    not (shutil.which("cc") and shutil.which("make")), reason="needs a C compiler and make (build-essential)"
)

MPI_BODY = """\
provides: [mpi]
module:
  level: compiler
  family: mpi
  env:
    setenv:
      MPI_HOME: ""
    prepend_path:
      PATH: bin
"""
PLAIN_PATH = "/usr/local/bin:/usr/bin:/bin"  # module systems drop duplicate PATH entries; start without any
TOOL_BODY = """\
depends_on:
  - mpi
  - greet
module:
  level: mpi
  env:
    setenv:
      MPITOOL_HOME: ""
    prepend_path:
      PATH: bin
"""


class Stack:
    def __init__(self, root: Path, stack: MiniStack, locks: dict[str, Lock]):
        self.root, self.stack, self.locks = root, stack, locks
        self.prefix = root / "prefix"
        self.modules = self.prefix / "modulefiles"
        self.compiler = system_compiler()

    def home(self, mpi: str, name: str) -> Path:
        return install_dir(self.prefix.resolve(), self.locks[mpi].package(name))


@pytest.fixture(scope="module")
def built_stack(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    """openmpi@9.1.0 and mpich@9.2.0 (test MPIs overriding the built-in recipes), greet, and mpitool built
    once against each MPI, installed into one prefix with one modulefile tree."""
    root = tmp_path_factory.mktemp("hierarchy")
    mini = new_test_stack(root)
    mini.write_greet("core-greet")
    mini.write_autotools("openmpi", "9.1.0", "openmpi-9.1.0", MPI_BODY)
    mini.write_autotools("mpich", "9.2.0", "mpich-9.2.0", MPI_BODY)
    mini.write_autotools("mpitool", "1.0", "mpitool-on-{deps.mpi.version}", TOOL_BODY)
    recipes = load_recipes([mini.recipes])
    locks = {}
    stack = Stack(root, mini, locks)
    for mpi in ("openmpi", "mpich"):
        solution = Resolver(recipes, builtin_tables()).resolve(parse_request(["mpitool", f"mpi={mpi}"]))
        locks[mpi] = lock_from_solution(solution)
        options = BuildOptions(stack.prefix, mirror=str(mini.mirror), jobs=2)
        Builder(locks[mpi], recipes, options).run()
        write_stack_modules(locks[mpi], recipes, stack.prefix, stack.modules)
    return stack


def check(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


# -- Lmod --------------------------------------------------------------------------------------------------
lmod = pytest.mark.skipif(bool(lmod_missing()), reason=lmod_missing() or "Lmod present")


@lmod
def test_lmod_tree_has_no_syntax_errors(built_stack: Stack) -> None:
    tree = built_stack.modules / "lmod"
    done = subprocess.run([str(LMOD_SYNTAX_CHECK), str(tree)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tree / "Core" / "gcc").is_dir() or (tree / "Core" / built_stack.compiler.name).is_dir()


@lmod
def test_lmod_hierarchy_load_and_family_swap(built_stack: Stack) -> None:
    cc = built_stack.compiler
    script = f"""
    module use {built_stack.modules}/lmod/Core
    module load {cc.name} openmpi mpitool
    echo "list: $(module -t list 2>&1 | tr '\\n' ' ')"
    echo "tool: $(greet)"
    echo "mpi_home: $MPI_HOME"
    module swap openmpi mpich
    echo "swapped: $(module -t list 2>&1 | tr '\\n' ' ')"
    echo "tool: $(greet)"
    echo "mpi_home: $MPI_HOME"
    echo "tool_home: $MPITOOL_HOME"
    """
    out = check(run_lmod(script)).splitlines()
    listed = out[0].split()[1:]
    assert listed[:2] == [f"{cc.name}/{cc.version}", "openmpi/9.1.0"]
    assert "greet/1.0" in listed and "mpitool/1.0" in listed  # depends_on pulled greet in
    assert out[1] == "tool: mpitool-on-9.1.0"
    assert out[2] == f"mpi_home: {built_stack.home('openmpi', 'openmpi')}"
    swapped = out[3].split()[1:]
    assert "mpich/9.2.0" in swapped and "openmpi/9.1.0" not in swapped and "mpitool/1.0" in swapped
    assert out[4] == "tool: mpitool-on-9.2.0"  # Lmod reloaded mpitool from the MPICH branch
    assert out[5] == f"mpi_home: {built_stack.home('mpich', 'mpich')}"
    assert out[6] == f"tool_home: {built_stack.home('mpich', 'mpitool')}"


@lmod
def test_lmod_family_replaces_mpi_and_unload_restores(built_stack: Stack) -> None:
    cc = built_stack.compiler
    script = f"""
    before="$PATH"
    module use {built_stack.modules}/lmod/Core
    module load {cc.name} openmpi
    module load mpich 2>/dev/null
    echo "list: $(module -t list 2>&1 | tr '\\n' ' ')"
    module load mpitool
    module unload mpitool mpich {cc.name}
    echo "left: $(module -t list 2>&1 | tr '\\n' ' ')"
    echo "mpi_home: ${{MPI_HOME:-unset}} tool: ${{MPITOOL_HOME:-unset}} greet: ${{GREET_HOME:-unset}}"
    [ "$PATH" = "$before" ] && echo "path restored"
    """
    out = check(run_lmod(script, env={"PATH": PLAIN_PATH})).splitlines()
    assert out[0].split()[1:] == [f"{cc.name}/{cc.version}", "mpich/9.2.0"]  # family("mpi") swapped
    assert out[1] == "left: No modules loaded "
    assert out[2] == "mpi_home: unset tool: unset greet: unset"
    assert out[3] == "path restored"


@lmod
def test_lmod_mpi_level_module_is_hidden_without_an_mpi(built_stack: Stack) -> None:
    done = run_lmod(f"module use {built_stack.modules}/lmod/Core; module load mpitool")
    assert done.returncode != 0
    assert "mpitool" in done.stderr


# -- Environment Modules ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def envmod_init() -> Path:
    init = envmod_root()
    if isinstance(init, str):
        pytest.skip(init)
    return init


def test_envmod_load_prereq_switch_and_unload(built_stack: Stack, envmod_init: Path) -> None:
    cc = built_stack.compiler
    script = f"""
    before="$PATH"
    module use {built_stack.modules}/tcl/Core
    module load {cc.name} openmpi 2>/dev/null
    module load mpitool 2>/dev/null
    echo "loaded: $LOADEDMODULES"
    echo "tool: $(greet)"
    module unload mpitool 2>/dev/null
    if module load mpich 2>/dev/null; then echo "family not enforced"; fi
    module switch openmpi mpich 2>/dev/null
    echo "switched: $LOADEDMODULES"
    echo "mpi_home: $MPI_HOME"
    module purge 2>/dev/null
    module unuse {built_stack.modules}/tcl/Core
    echo "after: ${{LOADEDMODULES:-none}} ${{MPI_HOME:-unset}}"
    [ "$PATH" = "$before" ] && echo "path restored"
    """
    out = check(run_envmod(envmod_init, script, env={"PATH": PLAIN_PATH})).splitlines()
    loaded = out[0].split(": ")[1].split(":")
    assert loaded[:2] == [f"{cc.name}/{cc.version}", "openmpi/9.1.0"]
    assert "greet/1.0" in loaded and loaded[-1] == "mpitool/1.0"  # prereq auto-loaded greet
    assert out[1] == "tool: mpitool-on-9.1.0"
    assert "family not enforced" not in out
    assert out[2].split(": ")[1].split(":") == [f"{cc.name}/{cc.version}", "mpich/9.2.0"]
    assert out[3] == f"mpi_home: {built_stack.home('mpich', 'mpich')}"
    assert out[4] == "after: none unset"
    assert out[5] == "path restored"


# -- hpcdl's own modulefile --------------------------------------------------------------------------------
def wheel_layout(prefix: Path) -> Path:
    """hpcdl laid out as its wheel installs it with `pip install --prefix PREFIX` (pyproject's
    wheel.packages: hpcdl/, templates/ and modulefiles/ inside the package, the console script in bin/)."""
    repo = Path(__file__).resolve().parents[2]
    site = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    package = site / "hpcdl"
    shutil.copytree(repo / "hpcdl", package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(repo / "templates", package / "templates")
    shutil.copytree(repo / "modulefiles", package / "modulefiles")
    dist_info = site / "hpcdl-0.1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: hpcdl\nVersion: 0.1.0\n")
    (prefix / "bin").mkdir(parents=True)
    script = prefix / "bin" / "hpcdl"
    script.write_text(
        f"#!{sys.executable} -S\nimport sys\nfrom hpcdl.cli.main import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    return package


def test_shipped_modulefile_finds_its_installation_under_both_module_systems(tmp_path: Path) -> None:
    package = wheel_layout(tmp_path / "prefix")
    probe = f'cd / && {sys.executable} -S -c "import hpcdl; print(hpcdl.__file__)"'
    script = f"""
    module use {package}/modulefiles
    module load hpcdl 2>/dev/null
    echo "home: $HPCDL_HOME"
    echo "cmd: $(command -v hpcdl)"
    echo "import: $({probe})"
    module unload hpcdl 2>/dev/null
    echo "after: ${{HPCDL_HOME:-unset}} ${{PYTHONPATH:-unset}}"
    """
    prefix = (tmp_path / "prefix").resolve()
    expected = [
        f"home: {prefix}",
        f"cmd: {prefix}/bin/hpcdl",
        f"import: {package.resolve()}/__init__.py",
        "after: unset unset",
    ]
    runs = []
    if not lmod_missing():
        runs.append(("lmod", run_lmod(script)))
    init = envmod_root()
    if isinstance(init, Path):
        runs.append(("envmod", run_envmod(init, script)))
    if not runs:
        pytest.skip("neither Lmod nor Environment Modules is available")
    for name, done in runs:
        assert check(done).splitlines() == expected, name


@lmod
def test_module_write_for_this_installation_gives_a_working_hpcdl(tmp_path: Path) -> None:
    root = tmp_path / "modulefiles"
    written = subprocess.run(
        [sys.executable, "-m", "hpcdl", "module", "write", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert written.returncode == 0, written.stderr
    again = subprocess.run(
        [sys.executable, "-m", "hpcdl", "module", "write", "--root", str(root), "--format", "lua"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0 and "unchanged" in again.stdout  # identical content is not a conflict
    (root / "hpcdl" / "0.1.0.lua").write_text((root / "hpcdl" / "0.1.0.lua").read_text() + "-- site edit\n")
    refused = subprocess.run(
        [sys.executable, "-m", "hpcdl", "module", "write", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 2 and "--force" in refused.stderr
    bindir = Path(sys.executable).parent
    out = check(
        run_lmod(
            f"module use {root}; module load hpcdl; command -v hpcdl; hpcdl --version",
            env={"PATH": PLAIN_PATH},
        )
    )
    assert out.splitlines() == [str(bindir / "hpcdl"), "hpcdl 0.1.0"]


@lmod
def test_module_write_for_a_prefix_install_sets_pythonpath(tmp_path: Path) -> None:
    package = wheel_layout(tmp_path / "prefix")
    root = tmp_path / "site-modules"
    args = [
        "module",
        "write",
        "--prefix",
        str(tmp_path / "prefix"),
        "--root",
        str(root),
        "--depends-on",
        "gcc",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl", *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    gcc = root / "gcc"
    gcc.mkdir()
    (gcc / "12.lua").write_text('setenv("FAKE_GCC", "12")\n')
    script = f"""
    module use {root}
    module load hpcdl
    echo "$FAKE_GCC $PYTHONPATH $(command -v hpcdl)"
    echo "import: $(cd / && {sys.executable} -S -c 'import hpcdl; print(hpcdl.__file__)')"
    """
    out = check(run_lmod(script, env={"PATH": PLAIN_PATH})).splitlines()
    prefix = (tmp_path / "prefix").resolve()
    assert out[0] == f"12 {package.resolve().parent} {prefix}/bin/hpcdl"  # depends_on loaded gcc first
    assert out[1] == f"import: {package.resolve()}/__init__.py"
