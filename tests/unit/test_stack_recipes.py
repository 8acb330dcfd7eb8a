"""Recipes: the built-in ones are complete and sourced; broken ones are reported with file:line."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from hpcdl.stack.recipe import (
    BUILTIN_RECIPES,
    UNKNOWN_CHECKSUM,
    RecipeError,
    load_recipes,
    parse_recipe,
    virtual_providers,
)

EXPECTED = {"openmpi", "mpich", "ucx", "cuda", "cudnn", "nccl", "pytorch", "mpi4py", "hpcdl"}


def test_builtin_recipes_are_complete_and_checksummed() -> None:
    recipes = load_recipes()
    assert set(recipes) == EXPECTED
    assert virtual_providers(recipes) == {"mpi": ["mpich", "openmpi"]}
    for recipe in recipes.values():
        assert recipe.description and recipe.build.system
        for version in recipe.versions:
            for source in version.sources:
                # every listed source names a real digest and where it came from; none is left unknown
                assert re.fullmatch(r"[0-9a-f]{64}", source.sha256), (recipe.name, version.version)
                assert source.url.startswith(("https://", "http://deb.debian.org/")), source.url
                assert version.checksum_source, (recipe.name, version.version)
            if not version.sources:
                assert recipe.build.system == "pip"  # pip verifies against its index


def test_recipes_cover_the_features_the_schema_offers() -> None:
    recipes = load_recipes()
    openmpi = recipes["openmpi"]
    assert openmpi.module.family == "mpi" and openmpi.module.level == "compiler"
    cuda_dep = next(d for d in openmpi.depends_on if d.spec.name == "cuda")
    assert cuda_dep.when is not None and cuda_dep.when.variant_map == {"cuda": True}
    assert any(a.arg.startswith("--with-cuda=") and a.when for a in openmpi.build.args)
    assert recipes["mpich"].conflicts[0].message
    assert {r.build.system for r in recipes.values()} == {"autotools", "pip", "binary"}
    assert recipes["cuda"].versions[0].sources[0].strip == "nvidia/cuda_runtime"


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_schema_errors_name_file_and_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "broken",
        """\
        name: broken
        description: a broken recipe
        versions:
          "1.0":
            url: https://example.org/broken-1.0.tar.gz
            sha256: not-a-digest
          "one.two": {url: https://example.org/x.tar.gz, sha256: unknown}
        variants:
          cuda: {default: maybe}
        depends_on:
          - spec: "cuda@@12"
        build:
          system: scons
        colour: blue
        module:
          level: galaxy
        """,
    )
    with pytest.raises(RecipeError) as caught:
        parse_recipe(path)
    message = str(caught.value)
    for line, what in [
        (6, "sha256 must be 64 hex digits"),
        (7, "'one.two' is not a version number"),
        (9, "default must be true, false or auto"),
        (11, "is not a version range"),
        (13, "build system 'scons' is unknown"),
        (14, "unknown key 'colour'"),
        (16, "module level 'galaxy' is unknown"),
    ]:
        assert f"{path}:{line}: " in message and what in message, (line, what, message)


def test_yaml_syntax_error_and_name_mismatch(tmp_path: Path) -> None:
    bad = write(tmp_path, "syntax", "name: syntax\nversions: [\n")
    with pytest.raises(RecipeError, match=rf"{bad}:\d+: YAML syntax error"):
        load_recipes([tmp_path])
    bad.unlink()
    other = write(tmp_path, "other", "name: something\ndescription: x\nversions: {}\nbuild: {system: pip}\n")
    with pytest.raises(RecipeError) as caught:
        parse_recipe(other)
    assert f"{other}:1: recipe name 'something' must match its file name" in str(caught.value)
    assert "at least one version" in str(caught.value)


def test_unknown_checksum_is_allowed_but_marked(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "vendor",
        """\
        name: vendor
        description: a vendor tarball without a published digest
        versions:
          "2.0": {url: https://example.org/vendor-2.0.tar.gz, sha256: unknown}
        build: {system: binary}
        """,
    )
    assert parse_recipe(path).versions[0].sources[0].sha256 == UNKNOWN_CHECKSUM


def test_user_directories_override_builtin_recipes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (
        (BUILTIN_RECIPES / "ucx.yaml")
        .read_text()
        .replace("description: Unified", "description: Site UCX, unified")
    )
    site, user = tmp_path / "site", tmp_path / "user"
    site.mkdir()
    user.mkdir()
    (site / "ucx.yaml").write_text(text)
    monkeypatch.setenv("HPCDL_RECIPES", str(site))
    assert load_recipes()["ucx"].description.startswith("Site UCX")
    (user / "ucx.yaml").write_text(text.replace("Site UCX", "User UCX"))
    assert load_recipes([user])["ucx"].description.startswith("User UCX")
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipes([tmp_path / "missing"])


def test_dependency_on_an_unknown_package_is_reported(tmp_path: Path) -> None:
    write(
        tmp_path,
        "lonely",
        """\
        name: lonely
        description: depends on nothing that exists
        versions: {"1.0": {}}
        depends_on: [nosuchthing]
        build: {system: pip, requirement: "lonely=={version}"}
        """,
    )
    with pytest.raises(RecipeError, match="depends on 'nosuchthing', which no recipe provides"):
        load_recipes([tmp_path])


@pytest.mark.parametrize(
    ("versions", "build", "complaint"),
    [
        (
            '"1.0": {url: "https://example.org/dl/..", sha256: unknown}',
            "{system: make}",
            "is not a plain file name",
        ),
        (
            '"1.0": {url: "https://example.org/p.tar.gz", sha256: unknown, strip: ../..}',
            "{system: make}",
            "strip names a directory inside the archive",
        ),
        ('"1.0/../..": {}', "{system: pip}", "'1.0/../..' is not a version number"),
        ('"1.0": {}', "{system: pip, links: {lib/x: ../../../etc/passwd}}", "a target inside the install"),
        ('"1.0": {}', "{system: pip, links: {../x: y}}", "a target inside the install"),
    ],
)
def test_recipe_fields_that_could_leave_the_install_are_refused(
    tmp_path: Path, versions: str, build: str, complaint: str
) -> None:
    path = write(tmp_path, "pkg", f"name: pkg\ndescription: d\nversions:\n  {versions}\nbuild: {build}\n")
    with pytest.raises(RecipeError, match=re.escape(complaint)):
        parse_recipe(path)


def test_recipe_text_that_would_end_up_in_a_modulefile_is_one_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "pkg",
        """\
        name: pkg
        description: "two\\nlines"
        versions: {"1.0": {}}
        build: {system: pip}
        module: {family: "mpi;id"}
        """,
    )
    with pytest.raises(RecipeError) as caught:
        parse_recipe(path)
    assert "pkg.yaml:2: 'description' must be one line without control characters" in str(caught.value)
    assert "pkg.yaml:5: module family: 'mpi;id' is not a package name" in str(caught.value)
