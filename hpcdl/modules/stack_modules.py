"""Modulefiles for an installed stack, in the Lmod Core / Compiler / MPI hierarchy.

Under ROOT/lmod (Lua) and ROOT/tcl (Environment Modules)::

    Core/<compiler>/<version>                      family("compiler"); adds Compiler/<compiler>/<version>
    Core/<name>/<version>                          packages built once (CUDA, cuDNN, NCCL, PyTorch)
    Compiler/<cc>/<ccver>/<name>/<version>         libraries and MPIs; an MPI adds MPI/.../<mpi>/<ver>
    MPI/<cc>/<ccver>/<mpi>/<mpiver>/<name>/<ver>   packages built against one MPI (mpi4py, hpcdl)

so ``module use ROOT/lmod/Core; module load gcc openmpi hpcdl`` works and ``module swap openmpi mpich``
reloads hpcdl from the MPICH branch.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hpcdl.modules.quote import module_name_problem
from hpcdl.modules.render import FORMATS, ModuleWriteError, Written, render, write_file
from hpcdl.stack.builder import install_dir, is_installed, site_packages
from hpcdl.stack.lockfile import Lock, LockedPackage
from hpcdl.stack.recipe import Recipe

TREES = {"lua": "lmod", "tcl": "tcl"}  # ROOT/<tree> per modulefile format


@dataclass(frozen=True)
class Compiler:
    name: str
    version: str


def system_compiler() -> Compiler:
    """The compiler the builder uses (`cc`), named as a module: gcc/12, clang/15, ..."""
    for name in ("gcc", "clang"):
        try:
            out = subprocess.run(
                [name, "-dumpversion"], capture_output=True, text=True, timeout=30, check=True
            )
        except (OSError, subprocess.SubprocessError):
            continue
        major = out.stdout.strip().split(".")[0]
        if re.fullmatch(r"\d+", major):
            return Compiler(name, major)
    raise ModuleWriteError("no gcc or clang found to name the Compiler level; pass --compiler NAME/VERSION")


def parse_compiler(text: str) -> Compiler:
    name, _, version = text.partition("/")
    if not name or not version or module_name_problem(text):
        raise ModuleWriteError(f"'{text}' is not a compiler module name; write e.g. gcc/12")
    return Compiler(name, version)


@dataclass(frozen=True)
class ModulePlacement:
    directory: tuple[str, ...]  # path under ROOT/<format> of the module's name directory
    modulepath: tuple[str, ...]  # hierarchy branch this module opens (relative to ROOT/<format>)


def _mpi_provider(package: LockedPackage, lock: Lock, recipes: dict[str, Recipe]) -> LockedPackage | None:
    for name in package.depends_on:
        if "mpi" in recipes[name].provides:
            return lock.package(name)
    return None


def placement(
    package: LockedPackage, lock: Lock, recipes: dict[str, Recipe], cc: Compiler
) -> ModulePlacement:
    recipe = recipes[package.name]
    level = recipe.module.level
    opens: tuple[str, ...] = ()
    if "mpi" in recipe.provides:
        opens = ("MPI", cc.name, cc.version, package.name, package.version)
    if level == "core":
        return ModulePlacement(("Core", package.name), opens)
    if level == "compiler":
        return ModulePlacement(("Compiler", cc.name, cc.version, package.name), opens)
    mpi = _mpi_provider(package, lock, recipes)
    if mpi is None:
        raise ModuleWriteError(f"{package.name} has module level 'mpi' but depends on no MPI in the lockfile")
    return ModulePlacement(("MPI", cc.name, cc.version, mpi.name, mpi.version, package.name), opens)


def _context(
    package: LockedPackage, lock: Lock, recipes: dict[str, Recipe], prefix: Path, root: Path, cc: Compiler
):
    recipe = recipes[package.name]
    where = install_dir(prefix, package)
    site = str(site_packages(where))
    place = placement(package, lock, recipes, cc)
    mpi = _mpi_provider(package, lock, recipes) if recipe.module.level == "mpi" else None
    depends = [
        f"{dep}/{lock.package(dep).version}"
        for dep in package.depends_on
        if not (mpi and dep == mpi.name) and recipes[dep].module.level != "mpi"
    ]
    return {
        "name": package.name,
        "version": package.version,
        "description": recipe.description,
        "homepage": recipe.homepage,
        "prefix": str(where),
        "spec": f"{package.label()} ({package.hash})",
        "origin": f"recipe {package.name}, lockfile hash {package.hash}",
        "family": recipe.module.family,
        "depends_on": depends,
        "modulepath": [str(root.joinpath(*place.modulepath))] if place.modulepath else [],
        "setenv": [
            (k, str(where / v.format(site_packages=site)) if v else str(where))
            for k, v in recipe.module.setenv
        ],
        "prepend_path": [
            (k, str(where / v.format(site_packages=site))) for k, v in recipe.module.prepend_path
        ],
    }


def write_stack_modules(
    lock: Lock,
    recipes: dict[str, Recipe],
    prefix: Path,
    root: Path,
    formats: tuple[str, ...] = FORMATS,
    force: bool = False,
    compiler: Compiler | None = None,
) -> list[Written]:
    """Write modulefiles for every installed package of `lock`; refuses packages that are not installed."""
    prefix, root = prefix.resolve(), root.resolve()
    missing = [p.label() for p in lock.packages if not is_installed(install_dir(prefix, p))]
    if missing:
        raise ModuleWriteError(
            f"not installed under {prefix}: {', '.join(missing)}; "
            f"run `hpcdl stack build LOCKFILE --prefix {prefix}` first"
        )
    cc = compiler or system_compiler()
    written = []
    for fmt in formats:
        tree = root / TREES[fmt]
        needs_compiler = any(recipes[p.name].module.level != "core" for p in lock.packages)
        if needs_compiler:
            text = render(
                f"package.{fmt}.j2",
                name=cc.name,
                version=cc.version,
                description=f"the system {cc.name} {cc.version}: opens the modules built with it",
                homepage="",
                prefix="(system compiler)",
                spec="",
                origin="compiler level of the hierarchy",
                family="compiler",
                depends_on=[],
                modulepath=[str(tree / "Compiler" / cc.name / cc.version)],
                setenv=[],
                prepend_path=[],
            )
            written.append(write_file(_file(tree / "Core" / cc.name, cc.version, fmt), text, force))
        for package in lock.packages:
            context = _context(package, lock, recipes, prefix, tree, cc)
            place = placement(package, lock, recipes, cc)
            path = _file(tree.joinpath(*place.directory), package.version, fmt)
            written.append(write_file(path, render(f"package.{fmt}.j2", **context), force))
    return written


def _file(directory: Path, version: str, fmt: str) -> Path:
    return directory / (f"{version}.lua" if fmt == "lua" else version)
