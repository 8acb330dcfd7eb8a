"""The binary wheel (scripts/build-wheels.sh) on a machine without a compiler, headers or CMake.

The wheel is built once per run: CI builds it before the tests and names it in HPCDL_WHEEL; without that the
module builds it itself (a few minutes, most of them zig compiling its C++ runtime the first time). Then:
- its tag and its shared objects stay within the target (glibc 2.28, no libstdc++, no libmpi: MPI is
  loaded at run time), read from the ELF files themselves;
- every CPython it is tagged for can load its own accelerator and the one runtime;
- `hpcdl stack build` installs it into a stack's prefix (no compiler, no build), and under the stack's MPI
  module (`module load openmpi hpcdl`) its ranks load that module's libmpi;
- installed into a fresh virtual environment with pip allowed no source builds, with PATH holding no
  compiler or CMake and CC/CXX set to `false`, it runs 2-rank jobs under `hpcdl run`, under Open MPI's
  `mpirun` and under MPICH's `mpiexec` (each rank loading its launcher's own libmpi through the wheel's
  shim of that family), and `hpcdl check-build` names the MPI it found and why not the other.
(The interpreter's own headers stay on this machine; nothing can compile against them without a compiler.)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest
from module_systems import lmod_missing, run_lmod

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from wheel_check import check, read_elf  # noqa: E402

pytestmark = pytest.mark.slow

OPENMPI = "/usr/bin/mpirun.openmpi"
MPICH = "/usr/bin/mpiexec.mpich"
COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "clang++", "cmake", "zig", "x86_64-linux-gnu-gcc")
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"

RANK_PROGRAM = """
import json, pathlib
import numpy as np
import hpcdl.common as hc
from hpcdl.common import basics, engine, mpi_library
hc.init()
x = np.full(3, hc.rank() + 1, np.float32)
out = engine.synchronize(engine.allreduce_async(x, name="sum", op=hc.ReduceOp.SUM))
maps = open("/proc/self/maps").read()
# A file per rank: a launcher may join two ranks' stdout lines into one.
pathlib.Path(__file__).with_name(f"result.{hc.rank()}.json").write_text(json.dumps({
    "rank": hc.rank(), "size": hc.size(), "sum": out.tolist(), "mpi_enabled": hc.mpi_enabled(),
    "transport": basics.transport_name(True), "package": hc.__file__,
    "mpi": mpi_library.active().version if mpi_library.active() else "",
    "mpi_path": mpi_library.active().path if mpi_library.active() else "",
    "openmpi_mapped": "libmpi.so.40" in maps, "mpich_mapped": "libmpich.so.12" in maps,
}))
hc.shutdown()
"""


@pytest.fixture(scope="module")
def binary_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    named = os.environ.get("HPCDL_WHEEL")
    if named:
        assert Path(named).is_file(), f"HPCDL_WHEEL={named} is not a file"
        return Path(named).resolve()
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-wheels.sh")],
        capture_output=True, text=True, timeout=1500, env=dict(os.environ, OUT=str(out)), cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (wheel,) = out.glob("hpcdl-*.whl")
    return wheel


def _pythons_of(wheel: Path) -> list[str]:
    return wheel.name.split("-")[2].split(".")


def test_tag_and_shared_objects_stay_within_glibc_2_28(binary_wheel: Path) -> None:
    assert binary_wheel.name.endswith("-manylinux_2_28_x86_64.whl")
    pythons = _pythons_of(binary_wheel)
    assert {"cp39", "cp310", "cp311", "cp312", "cp313"} <= set(pythons)
    assert check(str(binary_wheel), "2.28", pythons) == []
    with zipfile.ZipFile(binary_wheel) as wheel:
        elves = {n: read_elf(wheel.read(n)) for n in wheel.namelist() if n.endswith(".so")}
    newest = max(
        tuple(int(x) for x in v[len("GLIBC_") :].split("."))
        for elf in elves.values()
        for versions in elf.versions.values()
        for v in versions
        if v.startswith("GLIBC_2")
    )
    assert newest <= (2, 28)
    for name, elf in elves.items():
        assert not [lib for lib in elf.needed if "stdc++" in lib or "gcc_s" in lib or "mpi" in lib], name
        assert not any(v.startswith(("GLIBCXX", "CXXABI")) for vs in elf.versions.values() for v in vs), name
    assert set(elves["hpcdl/_collectives.so"].exported) >= {"hpcdl_init", "hpcdl_build_info"}
    assert elves["hpcdl/_mpi_openmpi.so"].exported == ["hpcdl_mpi_shim_v1"]


def test_every_cpython_of_the_tag_loads_its_accelerator_and_the_runtime(
    binary_wheel: Path, tmp_path: Path
) -> None:
    with zipfile.ZipFile(binary_wheel) as wheel:
        wheel.extractall(tmp_path)
    tried = 0
    for tag in _pythons_of(binary_wheel):
        version = f"{tag[2]}.{tag[3:]}"
        found = [*sorted(PYENV.glob(f"{version}.*/bin/python{version}")), shutil.which(f"python{version}")]
        found = [Path(p) for p in found if p]
        if not found:
            continue
        hotpath = next((tmp_path / "hpcdl" / "common").glob(f"_hotpath.cpython-{tag[2:]}-*.so"))
        code = (
            "import ctypes, importlib.util, json, sys\n"
            f"spec = importlib.util.spec_from_file_location('hpcdl.common._hotpath', {str(hotpath)!r})\n"
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
            f"lib = ctypes.CDLL({str(tmp_path / 'hpcdl' / '_collectives.so')!r})\n"
            "lib.hpcdl_build_info.restype = ctypes.c_char_p\n"
            "info = json.loads(lib.hpcdl_build_info())\n"
            "print(sys.version_info[:2], module.HandleBase.__name__, info['mpi_shims'])\n"
        )
        done = subprocess.run([str(found[0]), "-I", "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{tag}: {done.stderr}"
        assert "HandleBase openmpi,mpich" in done.stdout, done.stdout
        tried += 1
    assert tried >= 2, "fewer than two of the wheel's CPythons are on this machine"


@pytest.fixture(scope="module")
def bare_machine(binary_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A fresh venv with the wheel, and an environment whose PATH has no compiler or CMake."""
    root = tmp_path_factory.mktemp("bare")
    tools = root / "tools"
    tools.mkdir()
    # What the launchers need: Open MPI looks for ssh even on one host, Hydra for its proxy beside itself.
    for tool in (OPENMPI, MPICH, "/usr/bin/hydra_pmi_proxy", "/bin/sh", "/usr/bin/env", "/usr/bin/ssh"):
        if Path(tool).exists():
            (tools / Path(tool).name).symlink_to(tool)
    python = next(iter(sorted(PYENV.glob("3.9.*/bin/python3.9"))), Path(sys.executable))
    venv = root / "venv"
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True, timeout=120)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HPCDL_", "OMPI_", "PMI_", "SLURM_", "VIRTUAL_ENV", "PYTHON"))
        and k not in ("MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD")
    }
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{tools}",
        CC="false",
        CXX="false",
        OMPI_MCA_btl_tcp_if_include="lo",
        OMPI_MCA_oob_tcp_if_include="lo",
    )
    for name in COMPILERS:
        assert shutil.which(name, path=env["PATH"]) is None, f"{name} is reachable"
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--only-binary", ":all:",
         "--disable-pip-version-check", str(binary_wheel)],
        capture_output=True, text=True, timeout=900, env=env, cwd=root,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    program = root / "ranks.py"
    program.write_text(RANK_PROGRAM)
    return {"venv": venv, "env": env, "program": program, "root": root}


def _clear_results(machine: dict) -> None:
    for f in machine["program"].parent.glob("result.*.json"):
        f.unlink()


def _results(machine: dict, output: str) -> list[dict]:
    """What each of the two ranks wrote."""
    results = [json.loads(f.read_text()) for f in sorted(machine["program"].parent.glob("result.*.json"))]
    assert sorted(r["rank"] for r in results) == [0, 1], output
    return results


def _ranks(machine: dict, launcher: list[str], extra: dict | None = None) -> list[dict]:
    python = str(machine["venv"] / "bin" / "python")
    _clear_results(machine)
    done = subprocess.run(
        [*launcher, "-np", "2", python, str(machine["program"])],
        capture_output=True, text=True, timeout=120, cwd=machine["root"],
        env={**machine["env"], **(extra or {})},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = _results(machine, done.stdout + done.stderr)
    for r in results:
        assert r["size"] == 2 and r["sum"] == [3.0, 3.0, 3.0]
        assert r["package"].startswith(str(machine["venv"]))  # the wheel's hpcdl, not the source tree
    return results


def test_two_ranks_under_hpcdl_run(bare_machine: dict) -> None:
    results = _ranks(bare_machine, [str(bare_machine["venv"] / "bin" / "hpcdl"), "run"])
    assert not any(r["mpi_enabled"] or r["openmpi_mapped"] or r["mpich_mapped"] for r in results)


@pytest.mark.skipif(not Path(OPENMPI).exists(), reason="Open MPI is not installed")
def test_two_ranks_under_openmpi_mpirun_use_open_mpi(bare_machine: dict) -> None:
    launcher = ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe"]
    for transport in ("auto", "mpi"):
        results = _ranks(bare_machine, launcher, {"HPCDL_TRANSPORT": transport})
        for r in results:
            assert r["mpi_enabled"] and r["mpi"].startswith("Open MPI"), r
            assert r["openmpi_mapped"] and not r["mpich_mapped"], r
            assert r["transport"] == ("mpi" if transport == "mpi" else "shm")


@pytest.mark.skipif(not Path(MPICH).exists(), reason="MPICH is not installed")
def test_two_ranks_under_mpich_mpiexec_use_mpich(bare_machine: dict) -> None:
    for transport in ("auto", "mpi"):
        results = _ranks(bare_machine, ["mpiexec.mpich"], {"HPCDL_TRANSPORT": transport})
        for r in results:
            assert r["mpi_enabled"] and r["mpi"].startswith("MPICH"), r
            assert r["mpich_mapped"] and not r["openmpi_mapped"], r
            assert r["transport"] == ("mpi" if transport == "mpi" else "shm")


def test_check_build_names_the_mpi_found_at_run_time(bare_machine: dict) -> None:
    hpcdl = str(bare_machine["venv"] / "bin" / "hpcdl")
    done = subprocess.run(
        [hpcdl, "check-build", "--verbose"],
        capture_output=True, text=True, timeout=120, env=bare_machine["env"], cwd=bare_machine["root"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"runtime: {bare_machine['venv']}" in done.stdout
    mpi = [line for line in done.stdout.splitlines() if line.startswith("    [X] MPI (")]
    assert len(mpi) == 2, done.stdout  # controller and tensor operation
    assert "Open MPI v4" in mpi[0] and "libmpi.so.40" in mpi[0] and "found at run time" in mpi[0]
    assert "MPICH 4" in mpi[0] and "mpiexec" in mpi[0]  # the other family, and when it is used
    under_mpich = subprocess.run(
        ["mpiexec.mpich", "-np", "1", hpcdl, "check-build", "--json"],
        capture_output=True, text=True, timeout=120, env=bare_machine["env"], cwd=bare_machine["root"],
    )  # fmt: skip
    assert under_mpich.returncode == 0, under_mpich.stderr
    (controller,) = [c for c in json.loads(under_mpich.stdout)["controllers"] if c["name"] == "MPI"]
    assert controller["available"] and controller["detail"].startswith("MPICH 4"), controller
    assert "started by MPICH/PMI mpiexec" in controller["detail"]
    assert "Open MPI: not used, this process was started by MPICH/PMI mpiexec" in controller["detail"]


def _stand_in(recipes: Path, name: str, version: str, files: dict[str, Path], body: str) -> None:
    """A stack package made of files copied from this machine (a binary recipe), in the mirror beside."""
    archive = recipes.parent / "mirror" / f"{name}-{version}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for inside, source in files.items():
            tar.add(source.resolve(), arcname=f"{name}-{version}/{inside}")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    head = f"""\
    name: {name}
    description: stand-in for {name}
    versions:
      "{version}":
        url: {archive.as_uri()}
        sha256: {sha}
    build:
      system: binary
    """
    (recipes / f"{name}.yaml").write_text(textwrap.dedent(head) + textwrap.dedent(body))


@pytest.mark.skipif(bool(lmod_missing()), reason=lmod_missing())
@pytest.mark.skipif(not Path(OPENMPI).exists(), reason="Open MPI is not installed")
def test_the_stack_installs_hpcdl_from_the_wheel_and_its_mpi_module_is_found(
    binary_wheel: Path, bare_machine: dict, tmp_path: Path
) -> None:
    # The stack's Open MPI is this machine's libmpi in a prefix of its own (building Open MPI takes an hour),
    # PyTorch an empty stand-in; hpcdl is the real recipe, installed by pip from the wheel in the mirror.
    mirror, recipes, prefix = tmp_path / "mirror", tmp_path / "recipes", tmp_path / "stack"
    mirror.mkdir()
    recipes.mkdir()
    shutil.copy(binary_wheel, mirror)
    (libmpi,) = Path("/usr/lib").glob("*/libmpi.so.40")
    mpi_module = """\
    provides: [mpi]
    module:
      level: core
      family: mpi
      env:
        prepend_path:
          LD_LIBRARY_PATH: lib
    """
    _stand_in(recipes, "openmpi", "4.1.4", {"lib/libmpi.so.40": libmpi}, mpi_module)
    torch_module = """\
    variants:
      cuda: {default: false, description: stand-in}
    module:
      level: core
    """
    _stand_in(recipes, "pytorch", "2.5.1", {"README": REPO / "README.md"}, torch_module)
    env, hpcdl = bare_machine["env"], str(bare_machine["venv"] / "bin" / "hpcdl")
    lock = tmp_path / "stack.lock"
    for args in (
        ["resolve", "hpcdl", "mpi=openmpi", "--recipes", str(recipes), "--format", "lock", "-o", str(lock)],
        ["build", str(lock), "--prefix", str(prefix), "--mirror", str(mirror), "--recipes", str(recipes),
         "--compiler", "gcc/12", "--no-progress"],  # no compiler here to name the modules' Compiler level
    ):  # fmt: skip
        done = subprocess.run([hpcdl, "stack", *args], capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (installed,) = prefix.glob("hpcdl/0.1.0-*/lib/python*/site-packages/hpcdl")
    assert len(list((installed / "common").glob("_hotpath.cpython-*.so"))) >= 5  # the wheel's, not a build
    (stack_mpi,) = prefix.glob("openmpi/4.1.4-*/lib/libmpi.so.40")
    python, program = bare_machine["venv"] / "bin" / "python", bare_machine["program"]
    script = f"""
    module use {prefix}/modulefiles/lmod/Core
    module load gcc openmpi hpcdl
    mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 {python} {program}
    """
    # Lmod itself needs /usr/bin; hpcdl was installed without it.
    _clear_results(bare_machine)
    done = run_lmod(textwrap.dedent(script), env={**env, "PATH": env["PATH"] + os.pathsep + "/usr/bin"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for r in _results(bare_machine, done.stdout + done.stderr):
        assert r["sum"] == [3.0, 3.0, 3.0] and r["package"].startswith(str(installed)), r
        assert r["mpi_path"] == str(stack_mpi), r  # the module's libmpi, not the system's
