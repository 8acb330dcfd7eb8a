"""The resolver against the real recipes and compatibility tables, and its lockfile/table/spack output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from hpcdl.stack.lockfile import dump_lock, load_lock, lock_from_solution, render_spack, render_table
from hpcdl.stack.recipe import BUILTIN_RECIPES, load_recipes
from hpcdl.stack.resolver import ResolveError, Resolver, Solution
from hpcdl.stack.spec import parse_request
from hpcdl.stack.tables import builtin_tables
from hpcdl.stack.yamlfile import StackFileError


def resolve(*specs: str, driver: str | None = None, python: str = "3.11.7", recipes=None) -> Solution:
    return Resolver(recipes or load_recipes(), builtin_tables(), driver, python).resolve(
        parse_request(list(specs))
    )


def labels(solution: Solution) -> dict[str, str]:
    return {n.name: n.label() for n in solution.nodes}


def test_issue_example_picks_a_matching_cuda_wheel_and_mpi() -> None:
    found = labels(resolve("cuda@12.4", "pytorch@2.5", "mpi=openmpi", "hpcdl"))
    assert found["cuda"] == "cuda@12.4.1"
    assert found["pytorch"] == "pytorch@2.5.1+cuda"  # auto: on, because cuda was asked for
    assert found["openmpi"].startswith("openmpi@4.1.4")
    assert found["hpcdl"] == "hpcdl@0.1.0+cuda+mpi"


@pytest.mark.parametrize(
    ("driver", "cuda", "torch"),
    [
        ("570.124.06", "12.8.1", "2.11.0"),
        ("560.35.03", "12.6.2", "2.12.1"),
        ("550.54.15", "12.4.1", "2.6.0"),
        ("530.30.02", "12.1.1", "2.5.1"),
    ],
)
def test_newest_cuda_that_fits_the_driver(driver: str, cuda: str, torch: str) -> None:
    solution = resolve("cuda", "pytorch", driver=driver)
    assert solution.node("cuda").version == cuda
    assert solution.node("pytorch").version == torch


def test_cudnn_and_nccl_prefer_what_torch_bundles() -> None:
    solution = resolve("cuda", "pytorch", "nccl", "cudnn", driver="550.54.15")
    release = builtin_tables().torch_release(solution.node("pytorch").version)
    assert release.nccl.startswith(solution.node("nccl").version)
    assert release.cudnn.startswith(solution.node("cudnn").version)


def test_cpu_stack_needs_no_cuda_and_respects_python() -> None:
    solution = resolve("pytorch", "mpi4py", "mpi=mpich", python="3.10.12")
    assert {n.name for n in solution.nodes} == {"pytorch", "mpi4py", "mpich"}
    assert solution.node("pytorch").label() == "pytorch@2.14.1~cuda"  # 2.15 needs Python >= 3.11
    assert solution.depends_on["mpi4py"] == ["mpich"]


def test_conflicting_requests_are_explained() -> None:
    with pytest.raises(ResolveError) as caught:
        resolve("cuda@12.8", "pytorch@2.5")
    assert "torch 2.5.1 has CUDA wheels for 11.8, 12.1, 12.4, not for CUDA 12.8" in str(caught.value)
    with pytest.raises(ResolveError) as caught:
        resolve("cuda@12.8", driver="550.54.15")
    assert "CUDA 12.8.1 needs driver >= 570.124.06; this driver is 550.54.15" in str(caught.value)
    assert "the newest CUDA for driver 550.54.15 is 12.4.1" in str(caught.value)
    with pytest.raises(ResolveError, match=re.escape("nccl 2.21.5 does not support CUDA 12.1.1")):
        resolve("nccl@2.21", "cuda@12.1")
    with pytest.raises(ResolveError, match=re.escape("requires Python >=3.11 and has wheels for Python 3.1")):
        resolve("pytorch@2.15", python="3.10.12")
    with pytest.raises(ResolveError, match=r"pytorch~cuda \(from request\) and pytorch\+cuda \(from hpcdl\)"):
        resolve("hpcdl+cuda", "pytorch~cuda")
    with pytest.raises(ResolveError, match=re.escape("no pytorch version matches pytorch@2.3")):
        resolve("pytorch@2.3")


def test_both_python_bounds_are_checked_and_the_wheels_named() -> None:
    """torch 2.5 says requires-python >=3.8, but has wheels for 3.9 to 3.13 only: Python 3.14 (and 3.8) get
    no wheel, and the lockfile would fail at install."""
    for python in ("3.14.0", "3.8.18"):
        with pytest.raises(ResolveError) as caught:
            resolve("pytorch@2.5", python=python)
        assert (
            f"torch 2.5.1 has wheels for Python 3.9, 3.10, 3.11, 3.12, 3.13 (PyPI, Linux x86_64), none for "
            f"Python {python[:4].rstrip('.')}" in str(caught.value)
        )
    assert resolve("pytorch", python="3.14.0").node("pytorch").version == "2.15.0"
    assert resolve("pytorch@2.5", python="3.13.1").node("pytorch").version == "2.5.1"


def test_bad_names_and_providers() -> None:
    with pytest.raises(ResolveError, match="no recipe named 'tensorflow'"):
        resolve("tensorflow")
    with pytest.raises(ResolveError, match="'ucx' does not provide mpi; choose one of: mpich, openmpi"):
        resolve("mpi4py", "mpi=ucx")


def test_recipe_conflict_with_when(tmp_path: Path) -> None:
    text = (BUILTIN_RECIPES / "mpich.yaml").read_text()
    old = '  "4.0.2":'
    digest = "0" * 64  # test data: never fetched
    extra = f'  "3.4.3":\n    url: https://example.org/mpich-3.4.3.tar.gz\n    sha256: "{digest}"\n'
    text = text.replace(old, extra + old)
    (tmp_path / "mpich.yaml").write_text(text)
    recipes = load_recipes([tmp_path])
    assert resolve("mpich+cuda", "cuda@12.4", recipes=recipes).node("mpich").version == "4.0.2"
    assert resolve("mpich@3", recipes=recipes).node("mpich").version == "3.4.3"
    with pytest.raises(ResolveError, match=r"MPICH has GPU support \(yaksa\) only from 4.0"):
        resolve("mpich@3+cuda", "cuda@12.4", recipes=recipes)


def test_lockfile_round_trip_and_hashes(tmp_path: Path) -> None:
    solution = resolve("cuda@12.4", "pytorch@2.5", "mpi=openmpi", "mpi4py")
    lock = lock_from_solution(solution)
    path = tmp_path / "stack.lock"
    path.write_text(dump_lock(lock, solution.notes))
    loaded = load_lock(path)
    assert loaded == lock
    names = [p.name for p in loaded.packages]
    assert names.index("openmpi") < names.index("mpi4py") and names.index("cuda") < names.index("pytorch")
    cpu = lock_from_solution(resolve("pytorch@2.5~cuda"))
    assert cpu.package("pytorch").hash != lock.package("pytorch").hash  # variants change the install hash
    assert "openmpi" in render_table(lock) and "note: " in render_table(lock, solution.notes)


def test_spack_environment_output() -> None:
    lock = lock_from_solution(resolve("cuda@12.4", "pytorch@2.5", "mpi=openmpi", "hpcdl"))
    env = yaml.safe_load(render_spack(lock, load_recipes()))["spack"]
    assert "py-torch@=2.5.1+cuda" in env["specs"] and "cuda@=12.4.1" in env["specs"]
    assert env["packages"]["mpi"]["require"] == ["openmpi"]
    assert "# not in Spack, install separately: hpcdl@0.1.0+cuda+mpi" in render_spack(lock, load_recipes())


def test_broken_lockfiles_are_reported_with_lines(tmp_path: Path) -> None:
    path = tmp_path / "bad.lock"
    path.write_text(
        "hpcdl_stack_lock: 1\npackages:\n  - {name: a, version: '1', hash: abcdef0, depends_on: [b]}\n"
    )
    with pytest.raises(StackFileError, match=rf"{path}:3: a depends on b, which must be listed before it"):
        load_lock(path)
    path.write_text("something: else\n")
    with pytest.raises(StackFileError, match="not an hpcdl stack lockfile"):
        load_lock(path)


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ("{name: a, version: '1.0', hash: x/../../..}", "'x/../../..' is not a package hash"),
        ("{name: a, version: '1.0', hash: ABCDEF0}", "is not a package hash"),
        ("{name: a, version: '1.0/../..', hash: abcdef0}", "'1.0/../..' is not a version number"),
        ("{name: a, version: '1.0\\n', hash: abcdef0}", "is not a version number"),
        ("{name: ../a, version: '1.0', hash: abcdef0}", "'../a' is not a package name"),
        ("{name: a, version: '1.0', hash: abcdef0, variants: {'x y': true}}", "'x y' is not a variant name"),
        ("{name: a, version: '1.0', hash: abcdef0, variants: {cuda: maybe}}", "must be true or false"),
        ("{name: a, version: '1.0', hash: abcdef0, depends_on: [../b]}", "'../b' is not a package name"),
    ],
)
def test_lockfile_fields_that_could_leave_the_prefix_are_refused(
    tmp_path: Path, entry: str, complaint: str
) -> None:
    path = tmp_path / "shared.lock"
    path.write_text(f"hpcdl_stack_lock: 1\npackages:\n  - {entry}\n")
    with pytest.raises(StackFileError, match=re.escape(f"{path}:3: ") + ".*" + re.escape(complaint)):
        load_lock(path)


def test_a_package_listed_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "twice.lock"
    entry = "{name: a, version: '1.0', hash: abcdef0}"
    path.write_text(f"hpcdl_stack_lock: 1\npackages:\n  - {entry}\n  - {entry}\n")
    with pytest.raises(StackFileError, match="a is listed twice"):
        load_lock(path)
