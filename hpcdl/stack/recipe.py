"""Spack-style package recipes: one YAML file per package, checked against a schema with line numbers.

A recipe names its versions (source URLs with sha256), variants, dependencies and conflicts (each with an
optional `when` spec about the package itself), how it is built, what virtual packages it provides and the
environment its modulefile sets. See ``hpcdl/stack/recipes/openmpi.yaml`` for a complete example.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union
from urllib.parse import urlparse

from packaging.version import Version

from hpcdl.stack.names import (
    file_name_problem,
    has_control_characters,
    name_problem,
    variant_problem,
    version_problem,
)
from hpcdl.stack.spec import Spec, SpecError, parse_spec
from hpcdl.stack.yamlfile import LineDict, LineList, StackFileError, load_yaml

BUILTIN_RECIPES = Path(__file__).parent / "recipes"
BUILD_SYSTEMS = ("autotools", "cmake", "make", "pip", "binary")
MODULE_LEVELS = ("core", "compiler", "mpi")
UNKNOWN_CHECKSUM = "unknown"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOP_KEYS = {
    "name",
    "description",
    "homepage",
    "spack_name",
    "provides",
    "versions",
    "variants",
    "depends_on",
    "conflicts",
    "build",
    "module",
}


class RecipeError(StackFileError):
    """One or more recipes are malformed; the message lists every problem as file:line: what."""


@dataclass(frozen=True)
class Source:
    url: str
    sha256: str  # 64 hex digits, or UNKNOWN_CHECKSUM (the builder then refuses without --no-verify)
    strip: str = ""  # directory inside the archive that becomes the package root ("" = the single top dir)

    @property
    def filename(self) -> str:
        return Path(urlparse(self.url).path).name


@dataclass(frozen=True)
class RecipeVersion:
    version: str
    sources: tuple[Source, ...] = ()
    checksum_source: str = ""


@dataclass(frozen=True)
class Variant:
    name: str
    default: Union[bool, str]  # True, False or "auto" (on when the package it is named after is requested)
    description: str = ""


@dataclass(frozen=True)
class Dependency:
    spec: Spec
    when: Spec | None = None


@dataclass(frozen=True)
class Conflict:
    spec: Spec  # anonymous: about the package itself; named: about another package of the stack
    when: Spec | None
    message: str


@dataclass(frozen=True)
class BuildArg:
    arg: str
    when: Spec | None = None


@dataclass(frozen=True)
class BuildSpec:
    system: str
    args: tuple[BuildArg, ...] = ()
    requirement: str = ""  # pip: what to install when the version has no source archive
    env: tuple[tuple[str, str], ...] = ()
    links: tuple[tuple[str, str], ...] = ()  # symlinks made in the install (path -> target), e.g. libfoo.so


@dataclass(frozen=True)
class ModuleSpec:
    level: str = "core"
    family: str = ""
    setenv: tuple[tuple[str, str], ...] = ()  # values relative to the install prefix ("" = the prefix)
    prepend_path: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    homepage: str
    build: BuildSpec
    module: ModuleSpec
    path: Path
    versions: tuple[RecipeVersion, ...] = ()  # newest first
    variants: tuple[Variant, ...] = ()
    depends_on: tuple[Dependency, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    provides: tuple[str, ...] = ()
    spack_name: str = ""

    def version(self, version: str) -> RecipeVersion:
        for entry in self.versions:
            if entry.version == version:
                return entry
        known = ", ".join(v.version for v in self.versions)
        raise RecipeError(f"{self.path}: {self.name} has no version {version}; it knows {known}")

    def variant(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)


@dataclass
class _Checker:
    """Collects every schema problem of one file before failing."""

    path: Path
    errors: list[str] = field(default_factory=list)

    def error(self, line: int, message: str) -> None:
        self.errors.append(f"{self.path}:{line}: {message}")

    def text(self, mapping: LineDict, key: str, required: bool = False) -> str:
        value = mapping.get(key)
        if value is None:
            if required:
                self.error(mapping.line, f"missing '{key}'")
            return ""
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            self.error(mapping.line_of(key), f"'{key}' must be a string")
            return ""
        if has_control_characters(str(value)):
            self.error(mapping.line_of(key), f"'{key}' must be one line without control characters")
            return ""
        return str(value)

    def mapping(self, parent: LineDict, key: str) -> LineDict:
        value = parent.get(key)
        if value is None:
            empty = LineDict()
            empty.line, empty.key_lines = parent.line_of(key), {}
            return empty
        if not isinstance(value, LineDict):
            self.error(parent.line_of(key), f"'{key}' must be a mapping")
            empty = LineDict()
            empty.line, empty.key_lines = parent.line_of(key), {}
            return empty
        return value

    def sequence(self, parent: LineDict, key: str) -> LineList:
        value = parent.get(key)
        if value is None:
            empty = LineList()
            empty.line, empty.item_lines = parent.line_of(key), []
            return empty
        if not isinstance(value, LineList):
            self.error(parent.line_of(key), f"'{key}' must be a list")
            empty = LineList()
            empty.line, empty.item_lines = parent.line_of(key), []
            return empty
        return value

    def spec(self, text: Any, line: int, anonymous: bool) -> Spec | None:
        if not isinstance(text, str):
            self.error(line, f"expected a spec string, got {text!r}")
            return None
        try:
            return parse_spec(text, allow_anonymous=anonymous)
        except SpecError as exc:
            self.error(line, str(exc))
            return None

    def unknown_keys(self, mapping: LineDict, allowed: Iterable[str], where: str) -> None:
        allowed = set(allowed)
        for key in mapping:
            if key not in allowed:
                self.error(
                    mapping.line_of(key),
                    f"unknown key '{key}' in {where}; allowed: {', '.join(sorted(allowed))}",
                )


def _sources(check: _Checker, entry: LineDict, version: str) -> tuple[Source, ...]:
    raw = [entry] if "url" in entry else list(check.sequence(entry, "sources"))
    lines = [entry.line] if "url" in entry else check.sequence(entry, "sources").item_lines
    sources = []
    for item, line in zip(raw, lines):
        if not isinstance(item, LineDict):
            check.error(line, f"version {version}: each source must be a mapping with url and sha256")
            continue
        url = check.text(item, "url", required=True)
        sha = check.text(item, "sha256", required=True).lower()
        if sha and sha != UNKNOWN_CHECKSUM and not _SHA256.match(sha):
            check.error(
                item.line_of("sha256"),
                f"version {version}: sha256 must be 64 hex digits or '{UNKNOWN_CHECKSUM}'",
            )
        if url and urlparse(url).scheme not in ("http", "https", "file", "ftp"):
            check.error(item.line_of("url"), f"version {version}: url must be http(s), ftp or file: {url}")
        elif url and file_name_problem(Source(url, sha).filename):
            problem = file_name_problem(Source(url, sha).filename)
            check.error(item.line_of("url"), f"version {version}: the url must end in a file name: {problem}")
        strip = check.text(item, "strip").strip("/")
        if ".." in Path(strip).parts or has_control_characters(strip):
            check.error(
                item.line_of("strip"), f"version {version}: strip names a directory inside the archive"
            )
        sources.append(Source(url, sha, strip))
    return tuple(sources)


def _versions(check: _Checker, doc: LineDict, system: str) -> tuple[RecipeVersion, ...]:
    versions_map = check.mapping(doc, "versions")
    if not versions_map:
        check.error(doc.line_of("versions"), "a recipe needs at least one version under 'versions'")
    versions = []
    for version, entry in versions_map.items():
        line = versions_map.line_of(version)
        if version_problem(version):
            check.error(line, version_problem(version))
            continue
        if entry is None or not isinstance(entry, LineDict):
            check.error(line, f"version {version} must be a mapping (use {{}} for pip-resolved versions)")
            continue
        check.unknown_keys(
            entry, {"url", "sha256", "strip", "sources", "checksum_source"}, f"version {version}"
        )
        sources = _sources(check, entry, version) if ("url" in entry or "sources" in entry) else ()
        if not sources and system != "pip":
            check.error(line, f"version {version} has no source; only pip-built recipes may leave it out")
        versions.append(RecipeVersion(version, sources, check.text(entry, "checksum_source")))
    return tuple(sorted(versions, key=lambda v: Version(v.version), reverse=True))


def _variants(check: _Checker, doc: LineDict) -> tuple[Variant, ...]:
    variants = []
    section = check.mapping(doc, "variants")
    for name, entry in section.items():
        line = section.line_of(name)
        if variant_problem(name):
            check.error(line, variant_problem(name))
            continue
        if not isinstance(entry, LineDict):
            check.error(line, f"variant '{name}' must be a mapping with default and description")
            continue
        check.unknown_keys(entry, {"default", "description"}, f"variant {name}")
        default = entry.get("default", False)
        if default not in (True, False, "auto"):
            check.error(entry.line_of("default"), f"variant '{name}': default must be true, false or auto")
            continue
        variants.append(Variant(name, default, check.text(entry, "description")))
    return tuple(variants)


def _when(check: _Checker, entry: LineDict) -> Spec | None:
    if "when" not in entry:
        return None
    return check.spec(entry["when"], entry.line_of("when"), anonymous=True)


def _dependencies(check: _Checker, doc: LineDict) -> tuple[Dependency, ...]:
    section = check.sequence(doc, "depends_on")
    deps = []
    for entry, line in zip(section, section.item_lines):
        if isinstance(entry, str):
            entry_map = LineDict(spec=entry)
            entry_map.line, entry_map.key_lines = line, {"spec": line}
            entry = entry_map
        if not isinstance(entry, LineDict):
            check.error(line, "each dependency must be a spec string or a mapping with spec and when")
            continue
        check.unknown_keys(entry, {"spec", "when"}, "a dependency")
        spec = check.spec(entry.get("spec"), entry.line_of("spec"), anonymous=False)
        if spec is not None:
            deps.append(Dependency(spec, _when(check, entry)))
    return tuple(deps)


def _conflicts(check: _Checker, doc: LineDict) -> tuple[Conflict, ...]:
    section = check.sequence(doc, "conflicts")
    conflicts = []
    for entry, line in zip(section, section.item_lines):
        if not isinstance(entry, LineDict):
            check.error(line, "each conflict must be a mapping with spec, when and message")
            continue
        check.unknown_keys(entry, {"spec", "when", "message"}, "a conflict")
        spec = check.spec(entry.get("spec"), entry.line_of("spec"), anonymous=True)
        message = check.text(entry, "message", required=True)
        if spec is not None:
            conflicts.append(Conflict(spec, _when(check, entry), message))
    return tuple(conflicts)


def _env_pairs(check: _Checker, section: LineDict, key: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    values = check.mapping(section, key)
    for name, value in values.items():
        if not _ENV_NAME.match(name):
            check.error(values.line_of(name), f"'{name}' is not an environment variable name")
        elif not isinstance(value, str) or has_control_characters(value):
            check.error(
                values.line_of(name), f"{key}.{name} must be a string (a path relative to the prefix)"
            )
        else:
            pairs.append((name, value))
    return tuple(pairs)


def _build(check: _Checker, doc: LineDict) -> BuildSpec:
    section = check.mapping(doc, "build")
    check.unknown_keys(section, {"system", "args", "requirement", "env", "links"}, "build")
    system = check.text(section, "system", required=True)
    if system and system not in BUILD_SYSTEMS:
        check.error(
            section.line_of("system"),
            f"build system '{system}' is unknown; use one of {', '.join(BUILD_SYSTEMS)}",
        )
    args = []
    raw_args = check.sequence(section, "args")
    for entry, line in zip(raw_args, raw_args.item_lines):
        if isinstance(entry, str):
            args.append(BuildArg(entry))
        elif isinstance(entry, LineDict) and isinstance(entry.get("arg"), str):
            check.unknown_keys(entry, {"arg", "when"}, "a build argument")
            args.append(BuildArg(entry["arg"], _when(check, entry)))
        else:
            check.error(line, "each build argument must be a string or a mapping with arg and when")
    links = []
    raw_links = check.mapping(section, "links")
    for path, target in raw_links.items():
        if not isinstance(target, str) or not _inside_install(path, target):
            check.error(
                raw_links.line_of(path),
                f"links.{path}: a relative path inside the install -> a target inside the install",
            )
        else:
            links.append((path, target))
    return BuildSpec(
        system,
        tuple(args),
        check.text(section, "requirement"),
        _env_pairs(check, section, "env"),
        tuple(links),
    )


def _inside_install(path: str, target: str) -> bool:
    """Whether a link at `path` (relative to the install) to `target` stays inside the install."""
    if has_control_characters(path + target) or Path(path).is_absolute() or Path(target).is_absolute():
        return False
    link = os.path.normpath(path)
    pointed = os.path.normpath(os.path.join(os.path.dirname(link), target))
    return link != "." and not any(p == ".." or p.startswith("../") for p in (link, pointed))


def _module(check: _Checker, doc: LineDict) -> ModuleSpec:
    section = check.mapping(doc, "module")
    check.unknown_keys(section, {"level", "family", "env"}, "module")
    level = check.text(section, "level") or "core"
    if level not in MODULE_LEVELS:
        check.error(
            section.line_of("level"),
            f"module level '{level}' is unknown; use one of {', '.join(MODULE_LEVELS)}",
        )
    env = check.mapping(section, "env")
    check.unknown_keys(env, {"setenv", "prepend_path"}, "module.env")
    family = check.text(section, "family")
    if family and name_problem(family):
        check.error(section.line_of("family"), f"module family: {name_problem(family)}")
    return ModuleSpec(
        level,
        family,
        _env_pairs(check, env, "setenv"),
        _env_pairs(check, env, "prepend_path"),
    )


def parse_recipe(path: Path) -> Recipe:
    """Load and check one recipe; every schema problem is reported at once, with its line."""
    doc = load_yaml(path)
    check = _Checker(path)
    if not isinstance(doc, LineDict):
        raise RecipeError(f"{path}:1: a recipe must be a YAML mapping (name, versions, build, ...)")
    check.unknown_keys(doc, _TOP_KEYS, "a recipe")
    name = check.text(doc, "name", required=True)
    if name and name_problem(name):
        check.error(doc.line_of("name"), name_problem(name))
    elif name and name != path.stem:
        check.error(doc.line_of("name"), f"recipe name '{name}' must match its file name '{path.stem}.yaml'")
    build = _build(check, doc)
    provides = check.sequence(doc, "provides")
    for item, line in zip(provides, provides.item_lines):
        if not isinstance(item, str):
            check.error(line, "provides lists virtual package names, e.g. [mpi]")
    recipe = Recipe(
        name=name,
        description=check.text(doc, "description", required=True),
        homepage=check.text(doc, "homepage"),
        build=build,
        module=_module(check, doc),
        path=path,
        versions=_versions(check, doc, build.system),
        variants=_variants(check, doc),
        depends_on=_dependencies(check, doc),
        conflicts=_conflicts(check, doc),
        provides=tuple(str(p) for p in provides if isinstance(p, str)),
        spack_name=check.text(doc, "spack_name"),
    )
    variant_names = {v.name for v in recipe.variants}
    for kind, items in (("dependency", recipe.depends_on), ("conflict", recipe.conflicts)):
        for item in items:
            for when_variant, _ in item.when.variants if item.when else ():
                if when_variant not in variant_names:
                    check.error(
                        doc.line,
                        f"a {kind} of {name} uses variant '{when_variant}' that the recipe does not declare",
                    )
    if check.errors:
        raise RecipeError("\n".join(check.errors))
    return recipe


def recipe_dirs(extra: Iterable[Path] = ()) -> list[Path]:
    """Built-in recipes, then HPCDL_RECIPES (':'-separated), then `extra`; later ones override earlier."""
    dirs = [BUILTIN_RECIPES]
    dirs += [Path(p) for p in os.environ.get("HPCDL_RECIPES", "").split(os.pathsep) if p]
    dirs += [Path(p) for p in extra]
    for directory in dirs[1:]:
        if not directory.is_dir():
            raise RecipeError(
                f"recipe directory {directory} does not exist (from --recipes or HPCDL_RECIPES)"
            )
    return dirs


def load_recipes(extra_dirs: Iterable[Path] = ()) -> dict[str, Recipe]:
    """Every recipe by name; all broken recipes are reported together."""
    recipes: dict[str, Recipe] = {}
    errors: list[str] = []
    for directory in recipe_dirs(extra_dirs):
        for path in sorted(directory.glob("*.yaml")):
            try:
                recipes[path.stem] = parse_recipe(path)
            except StackFileError as exc:
                errors.append(str(exc))
    if errors:
        raise RecipeError("broken recipes:\n" + "\n".join(errors))
    _check_references(recipes)
    return recipes


def virtual_providers(recipes: dict[str, Recipe]) -> dict[str, list[str]]:
    providers: dict[str, list[str]] = {}
    for recipe in recipes.values():
        for virtual in recipe.provides:
            providers.setdefault(virtual, []).append(recipe.name)
    return providers


def _check_references(recipes: dict[str, Recipe]) -> None:
    known = set(recipes) | set(virtual_providers(recipes))
    errors = [
        f"{recipe.path}: {recipe.name} depends on '{dep.spec.name}', which no recipe provides"
        for recipe in recipes.values()
        for dep in recipe.depends_on
        if dep.spec.name not in known
    ]
    if errors:
        raise RecipeError("\n".join(errors))
