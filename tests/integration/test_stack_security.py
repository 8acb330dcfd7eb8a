"""`hpcdl stack build` given a hostile lockfile, a prefix with planted links, a tampered download or an
oversized one, or a prefix another user may write while the build runs: it refuses with a message, and
writes (or with --force deletes) nothing outside the prefix, and builds nothing another user put there."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
import yaml
from other_user import OtherUser
from stack_fixtures import MiniStack, build, new_test_stack, resolve_lock, write_binary, write_pylib

from hpcdl.common.exceptions import HpcdlError
from hpcdl.stack.builder import Builder, BuildError, BuildOptions, BuildProgress, PackageStep
from hpcdl.stack.lockfile import load_lock
from hpcdl.stack.recipe import load_recipes

pytestmark = pytest.mark.skipif(
    not (shutil.which("cc") and shutil.which("make")), reason="needs a C compiler and make (build-essential)"
)


@pytest.fixture
def stack(tmp_path: Path) -> MiniStack:
    stack = new_test_stack(tmp_path)
    stack.write_greet("hello-stack")
    return stack


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """Another user's (or the same user's other) files, beside the prefix."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work")
    return victim


def lock_for(stack: MiniStack, tmp_path: Path) -> Path:
    return resolve_lock(stack, tmp_path, "greet")


def untouched(victim: Path) -> bool:
    return sorted(p.name for p in victim.iterdir()) == ["thesis.tex"]


@pytest.mark.parametrize(
    ("field", "value", "complaint"),
    [
        ("hash", "abcdef0/../../../victim", "is not a package hash"),
        ("version", "1.0/../../../victim", "is not a version number"),
        ("name", "../victim", "is not a package name"),
    ],
)
@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_a_lockfile_field_cannot_reach_outside_the_prefix(
    stack: MiniStack, tmp_path: Path, victim: Path, field: str, value: str, complaint: str, force: bool
) -> None:
    lock = lock_for(stack, tmp_path)
    doc = yaml.safe_load(lock.read_text())
    doc["packages"][0][field] = value
    lock.write_text(yaml.safe_dump(doc))
    prefix = tmp_path / "prefix"
    # what an earlier build of the same lockfile would have left, so that the path resolves
    (prefix / "greet" / "1.0-abcdef0").mkdir(parents=True)
    (prefix / "greet" / "1.0").mkdir(parents=True)
    done = build(lock, prefix, stack, *(["--force"] if force else []))
    assert done.returncode == 2, done.stderr
    assert complaint in done.stderr and "Traceback" not in done.stderr
    assert untouched(victim)


@pytest.mark.parametrize("planted", ["greet", ".hpcdl/stage", ".hpcdl/logs", ".hpcdl/cache"])
def test_a_link_planted_under_the_prefix_is_not_followed(
    stack: MiniStack, tmp_path: Path, victim: Path, planted: str
) -> None:
    lock = lock_for(stack, tmp_path)
    package = load_lock(lock).package("greet")
    prefix = tmp_path / "prefix"
    link = prefix / planted
    link.parent.mkdir(parents=True)
    link.symlink_to(victim)
    # under the link, what --force would delete: a directory named like the install or the stage
    for name in (package.install_name, f"greet-{package.install_name}"):
        (victim / name).mkdir()
        (victim / name / "data").write_text("someone's")
    done = build(lock, prefix, stack, "--force")
    assert done.returncode == 2, done.stderr
    assert "outside the prefix" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in victim.iterdir()) == sorted(
        ["thesis.tex", package.install_name, f"greet-{package.install_name}"]
    )
    assert all(
        (victim / name / "data").is_file() for name in (package.install_name, f"greet-{package.install_name}")
    )


def test_a_builder_given_a_bad_lock_in_code_refuses_before_touching_anything(
    stack: MiniStack, tmp_path: Path, victim: Path
) -> None:
    lock = load_lock(lock_for(stack, tmp_path))
    lock.packages[0] = dataclasses.replace(lock.packages[0], hash="x/../../../../victim")
    with pytest.raises(BuildError, match="is not a package hash"):
        Builder(lock, load_recipes([stack.recipes]), BuildOptions(tmp_path / "prefix", force=True))
    assert untouched(victim) and not (tmp_path / "prefix").exists()


def test_pip_installs_only_the_archive_the_recipe_pins(stack: MiniStack, tmp_path: Path) -> None:
    """The cached archive is replaced after fetch verified it (another process, a shared cache): pip,
    given the recipe's sha256 with --require-hashes, refuses it."""
    write_pylib(stack)
    recipes = load_recipes([stack.recipes])
    lock_path = resolve_lock(stack, tmp_path, "pylib")
    prefix = (tmp_path / "prefix").resolve()
    cached = prefix / ".hpcdl" / "cache" / "pylib-0.3.tar.gz"

    def tamper(step: PackageStep) -> None:
        if step.label.startswith("pylib") and step.phase == "building":
            cached.write_bytes(stack.upstream.joinpath("greet-1.0.tar.gz").read_bytes())

    options = BuildOptions(prefix, mirror=str(stack.mirror), jobs=2)
    with pytest.raises(BuildError) as caught:
        Builder(load_lock(lock_path), recipes, options, BuildProgress(step=tamper)).run()
    assert "pylib@0.3 failed at" in str(caught.value) and "--require-hashes" in str(caught.value)
    assert "DO NOT MATCH THE HASHES" in str(caught.value)


@pytest.mark.parametrize("how", ["option", "environment"])
def test_the_download_cap_refuses_a_larger_file(stack: MiniStack, tmp_path: Path, how: str) -> None:
    lock = lock_for(stack, tmp_path)
    env = None
    extra: tuple[str, ...] = ("--max-download", "100")
    if how == "environment":
        env = {**os.environ, "HPCDL_STACK_MAX_DOWNLOAD": "100B"}
        extra = ()
    done = build(lock, tmp_path / "prefix", stack, *extra, env=env)
    assert done.returncode == 2, done.stderr
    assert "larger than the download cap of 100 bytes" in done.stderr
    assert "--max-download (HPCDL_STACK_MAX_DOWNLOAD)" in done.stderr
    assert not list((tmp_path / "prefix" / ".hpcdl" / "cache").iterdir())


def test_a_bad_size_is_a_message(stack: MiniStack, tmp_path: Path) -> None:
    done = build(lock_for(stack, tmp_path), tmp_path / "prefix", stack, "--max-download", "lots")
    assert done.returncode == 2
    assert "'lots' is not a size; write a number of bytes or one with a unit" in done.stderr


# What another user who may write the prefix does while the build downloads (`stage`: the build's stage).
STAGE_ATTACKS = {
    "a link planted as the stage": "mkdir -p {prefix}/.hpcdl/stage && ln -s {victim} {stage}",
    "the build directory replaced": (
        "mv {prefix}/.hpcdl {prefix}/.old && mkdir -p {prefix}/.hpcdl/stage && ln -s {victim} {stage}"
    ),
}


@pytest.mark.parametrize("attack", STAGE_ATTACKS)
@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_another_user_who_may_write_the_prefix_cannot_redirect_the_stage(
    stack: MiniStack,
    tmp_path: Path,
    victim: Path,
    shared_dir: Path,
    other_user: OtherUser,
    kind: str,
    attack: str,
) -> None:
    """A prefix others may write (mode 0777, and a umask that lets them write what the build makes, as in a
    project directory shared too widely): while the archive downloads, another user plants a link where
    the sources are unpacked. Nothing is unpacked through it: the build's own directories are private, and
    one replaced meanwhile is refused."""
    name = "greet" if kind == "tar" else "tool"
    if kind == "zip":
        write_binary(stack)
    lock = load_lock(resolve_lock(stack, tmp_path, name))
    prefix = shared_dir.parent / "prefix"
    prefix.mkdir()
    prefix.chmod(0o777)
    stage = prefix / ".hpcdl" / "stage" / f"{name}-{lock.package(name).install_name}"
    script = STAGE_ATTACKS[attack].format(victim=victim, stage=stage, prefix=prefix)
    attempts: list[str] = []

    def meanwhile(step: PackageStep) -> None:
        if step.phase == "fetching" and not attempts:
            attempts.append(other_user.run(script, check=False).stderr)

    builder = Builder(
        lock,
        load_recipes([stack.recipes]),
        BuildOptions(prefix, mirror=str(stack.mirror)),
        BuildProgress(step=meanwhile),
    )
    old_mask = os.umask(0)
    try:
        builder.run()
        refusal = ""
    except HpcdlError as exc:
        refusal = str(exc)
    finally:
        os.umask(old_mask)
    assert attempts and untouched(victim)
    if attack == "a link planted as the stage":  # the build's directories are private: no link is made
        assert "Permission denied" in attempts[0] and not refusal
        assert (prefix / name / lock.package(name).install_name / ".hpcdl" / "install.json").is_file()
    else:
        assert f"{stage} is a link or not a directory" in refusal
