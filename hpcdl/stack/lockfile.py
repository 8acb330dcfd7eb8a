"""The resolver's output: a lockfile (input of ``hpcdl stack build``), a table, or a spack.yaml."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from hpcdl.stack.names import hash_problem, name_problem, variant_problem, version_problem
from hpcdl.stack.recipe import Recipe
from hpcdl.stack.resolver import Solution
from hpcdl.stack.yamlfile import LineDict, StackFileError, load_yaml

LOCK_FORMAT = 1


@dataclass(frozen=True)
class LockedPackage:
    name: str
    version: str
    variants: dict[str, bool]
    hash: str
    depends_on: list[str]

    @property
    def install_name(self) -> str:
        """The directory under PREFIX/<name>/ this package installs into."""
        return f"{self.version}-{self.hash}"

    def label(self) -> str:
        flags = "".join(("+" if on else "~") + name for name, on in sorted(self.variants.items()))
        return f"{self.name}@{self.version}{flags}"

    def problems(self) -> list[str]:
        """What is wrong with the fields that become paths under the prefix and module names."""
        found = [
            name_problem(self.name),
            version_problem(self.version),
            hash_problem(self.hash),
            *(variant_problem(v) for v in self.variants),
            *(name_problem(d) for d in self.depends_on),
        ]
        return [p for p in found if p]


@dataclass(frozen=True)
class Lock:
    packages: list[LockedPackage]  # dependencies first
    request: list[str]
    driver: str | None
    python: str

    def package(self, name: str) -> LockedPackage:
        return next(p for p in self.packages if p.name == name)


def lock_from_solution(solution: Solution) -> Lock:
    hashes = solution.hashes()
    packages = [
        LockedPackage(n.name, n.version, n.variant_map, hashes[n.name], solution.depends_on[n.name])
        for n in solution.nodes
    ]
    return Lock(packages, solution.request, solution.driver, solution.python)


def dump_lock(lock: Lock, notes: list[str] = ()) -> str:
    header = [
        "# hpcdl stack lockfile: build it with `hpcdl stack build THIS_FILE --prefix DIR`.",
        f"# request: {' '.join(lock.request)}",
        *[f"# note: {note}" for note in notes],
    ]
    body = {
        "hpcdl_stack_lock": LOCK_FORMAT,
        "request": lock.request,
        "driver": lock.driver,
        "python": lock.python,
        "packages": [
            {
                "name": p.name,
                "version": p.version,
                "variants": dict(sorted(p.variants.items())),
                "hash": p.hash,
                "depends_on": p.depends_on,
            }
            for p in lock.packages
        ],
    }
    return "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False, default_flow_style=None)


def _locked_package(path: Path, entry: LineDict, names: set[str]) -> LockedPackage:
    """One `packages` entry, every field checked: they become paths under the prefix and module names."""
    if not all(k in entry for k in ("name", "version", "hash")):
        raise StackFileError(f"{path}:{entry.line}: each package needs name, version and hash")
    variants = entry.get("variants") or {}
    deps = entry.get("depends_on") or []
    if not isinstance(variants, dict) or not isinstance(deps, list):
        raise StackFileError(f"{path}:{entry.line}: variants must be a mapping and depends_on a list")
    package = LockedPackage(
        str(entry["name"]),
        str(entry["version"]),
        {str(k): v for k, v in variants.items()},
        str(entry["hash"]),
        [str(d) for d in deps],
    )
    problems = package.problems()
    problems += [
        f"variant '{v}' must be true or false" for v, on in variants.items() if not isinstance(on, bool)
    ]
    if package.name in names:
        problems.append(f"{package.name} is listed twice")
    if problems:
        raise StackFileError(
            f"{path}:{entry.line}: " + "; ".join(problems) + " (write lockfiles with `hpcdl stack resolve`)"
        )
    missing = [d for d in package.depends_on if d not in names]
    if missing:
        raise StackFileError(
            f"{path}:{entry.line}: {package.name} depends on {', '.join(missing)}, "
            "which must be listed before it"
        )
    return package


def load_lock(path: Path) -> Lock:
    """Read and check a lockfile; a field that could name a path outside the prefix is an error."""
    doc = load_yaml(path)
    if not isinstance(doc, LineDict) or doc.get("hpcdl_stack_lock") != LOCK_FORMAT:
        raise StackFileError(
            f"{path}:1: not an hpcdl stack lockfile (format {LOCK_FORMAT}); write one with "
            "`hpcdl stack resolve ... --format lock -o FILE`"
        )
    packages = []
    names: set[str] = set()
    for entry in doc.get("packages") or []:
        if not isinstance(entry, LineDict):
            raise StackFileError(
                f"{path}:{doc.line_of('packages')}: each package needs name, version and hash"
            )
        packages.append(_locked_package(path, entry, names))
        names.add(packages[-1].name)
    if not packages:
        raise StackFileError(f"{path}:{doc.line}: the lockfile lists no packages")
    return Lock(
        packages, [str(r) for r in doc.get("request") or []], doc.get("driver"), str(doc.get("python", ""))
    )


def render_table(lock: Lock, notes: list[str] = ()) -> str:
    rows = [("package", "version", "variants", "hash", "depends on")]
    for p in lock.packages:
        flags = "".join(("+" if on else "~") + n for n, on in sorted(p.variants.items()))
        rows.append((p.name, p.version, flags, p.hash, " ".join(p.depends_on)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def render_spack(lock: Lock, recipes: dict[str, Recipe]) -> str:
    """A Spack environment (spack.yaml) pinning the same versions; packages Spack lacks become comments."""
    specs, skipped = [], []
    for p in lock.packages:
        recipe = recipes.get(p.name)
        if recipe is None or not recipe.spack_name:
            skipped.append(p.label())
            continue
        flags = "+cuda" if p.variants.get("cuda") else ("~cuda" if "cuda" in p.variants else "")
        specs.append(f"{recipe.spack_name}@={p.version}{flags}")
    env: dict = {"spack": {"specs": specs, "concretizer": {"unify": True}, "view": True}}
    mpi = [p.name for p in lock.packages if p.name in recipes and "mpi" in recipes[p.name].provides]
    if mpi:
        env["spack"]["packages"] = {"mpi": {"require": [mpi[0]]}}
    header = [
        "# Spack environment from `hpcdl stack resolve --format spack`; use: spack env create NAME spack.yaml"
    ]
    header += [f"# not in Spack, install separately: {label}" for label in skipped]
    return "\n".join(header) + "\n" + yaml.safe_dump(env, sort_keys=False)
