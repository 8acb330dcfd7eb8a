"""`hpcdl stack build` for real: an autotools and a CMake package from a local file mirror, in dependency
order, with checksum failure, build failure with its log, resume, dry run, refusal to overwrite, progress
per package and per download, and a download resumed from its part through an HTTP mirror."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from http_mirror import http_mirror
from stack_fixtures import MiniStack, build, new_test_stack, resolve_lock, write_binary, write_pylib

from hpcdl.stack.builder import Builder, BuildOptions, BuildProgress, PackageStep, site_packages
from hpcdl.stack.fetch import Transfer
from hpcdl.stack.lockfile import load_lock
from hpcdl.stack.recipe import load_recipes

pytestmark = pytest.mark.skipif(
    not (shutil.which("cc") and shutil.which("make") and shutil.which("cmake")),
    reason="needs a C compiler, make and cmake (apt install build-essential cmake)",
)


@pytest.fixture
def stack(tmp_path: Path) -> MiniStack:
    stack = new_test_stack(tmp_path)
    stack.write_greet("hello-stack")
    stack.write_wave()
    return stack


def installed(prefix: Path, lock: Path, name: str) -> Path:
    package = load_lock(lock).package(name)
    return prefix / name / package.install_name


def test_build_in_dependency_order_then_resume_skips_installed(stack: MiniStack, tmp_path: Path) -> None:
    lock = resolve_lock(stack, tmp_path, "wave")
    prefix = tmp_path / "prefix"
    done = build(lock, prefix, stack)
    assert done.returncode == 0, done.stderr
    greet, wave = installed(prefix, lock, "greet"), installed(prefix, lock, "wave")
    assert done.stderr.index("greet@1.0") < done.stderr.index("wave@2.0")
    # the CMake package found the autotools package's header and library through the build environment
    run = subprocess.run([str(wave / "bin" / "wave")], capture_output=True, text=True, timeout=30, check=True)
    assert run.stdout.strip() == "hello-stack from wave"
    run = subprocess.run(
        [str(greet / "bin" / "greet")], capture_output=True, text=True, timeout=30, check=True
    )
    assert run.stdout.strip() == "hello-stack"
    logs = sorted((prefix / ".hpcdl" / "logs").iterdir())
    assert [log.name.split("-")[0] for log in logs] == ["greet", "wave"]
    assert "configure: prefix=" + str(greet) in logs[0].read_text()
    assert (greet / ".hpcdl" / "install.json").is_file()
    lua = prefix / "modulefiles" / "lmod" / "Core" / "wave" / "2.0.lua"
    assert 'depends_on("greet/1.0")' in lua.read_text()
    assert (prefix / "modulefiles" / "tcl" / "Core" / "greet" / "1.0").read_text().startswith("#%Module")

    stamp = (wave / "bin" / "wave").stat().st_mtime_ns
    again = build(lock, prefix, stack)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("already installed") == 2
    assert (wave / "bin" / "wave").stat().st_mtime_ns == stamp


def test_dry_run_shows_commands_and_changes_nothing(stack: MiniStack, tmp_path: Path) -> None:
    lock = resolve_lock(stack, tmp_path, "wave")
    prefix = tmp_path / "prefix"
    done = build(lock, prefix, stack, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert f"./configure --prefix={prefix.resolve() / 'greet'}" in done.stderr
    assert "--with-greeting=hello-stack" in done.stderr
    assert "cmake -S . -B" in done.stderr
    assert not prefix.exists()


def test_checksum_mismatch_in_mirror_is_refused(stack: MiniStack, tmp_path: Path) -> None:
    lock = resolve_lock(stack, tmp_path, "greet")
    tarball = stack.mirror / "greet-1.0.tar.gz"
    tarball.write_bytes(tarball.read_bytes() + b"tampered")
    prefix = tmp_path / "prefix"
    done = build(lock, prefix, stack)
    assert done.returncode == 2
    assert "checksum mismatch for greet-1.0.tar.gz" in done.stderr
    assert "expected sha256" in done.stderr
    assert not (installed(prefix, lock, "greet") / ".hpcdl" / "install.json").exists()
    assert not (prefix / "greet" / installed(prefix, lock, "greet").name / "bin").exists()


def test_build_failure_keeps_log_and_the_rerun_resumes(stack: MiniStack, tmp_path: Path) -> None:
    stack.write_wave(broken=True)
    lock = resolve_lock(stack, tmp_path, "wave")
    prefix = tmp_path / "prefix"
    failed = build(lock, prefix, stack)
    assert failed.returncode == 2
    assert "wave@2.0 failed at `cmake --build" in failed.stderr
    log = prefix / ".hpcdl" / "logs" / f"wave-{installed(prefix, lock, 'wave').name}.log"
    assert f"log: {log}" in failed.stderr
    assert "error" in log.read_text()  # the compiler's message is kept
    assert (installed(prefix, lock, "greet") / ".hpcdl" / "install.json").is_file()

    stack.write_wave(broken=False)  # the upstream fix: a new tarball, a new checksum in the recipe
    resumed = build(lock, prefix, stack)
    assert resumed.returncode == 0, resumed.stderr
    assert "greet@1.0" in resumed.stderr and "already installed" in resumed.stderr
    assert (installed(prefix, lock, "wave") / "bin" / "wave").is_file()


def test_existing_foreign_directory_is_left_alone_without_force(stack: MiniStack, tmp_path: Path) -> None:
    lock = resolve_lock(stack, tmp_path, "greet")
    prefix = tmp_path / "prefix"
    target = installed(prefix, lock, "greet")
    target.mkdir(parents=True)
    (target / "site-notes.txt").write_text("someone's files")
    refused = build(lock, prefix, stack)
    assert refused.returncode == 2
    assert "was not made by this builder" in refused.stderr and "--force" in refused.stderr
    assert (target / "site-notes.txt").read_text() == "someone's files"
    forced = build(lock, prefix, stack, "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (target / "site-notes.txt").exists()
    assert (target / "bin" / "greet").is_file()


def test_unknown_checksum_needs_no_verify(stack: MiniStack, tmp_path: Path) -> None:
    recipe = stack.recipes / "greet.yaml"
    text = recipe.read_text()
    sha = text.split("sha256: ")[1].split()[0]
    recipe.write_text(text.replace(sha, "unknown"))
    lock = resolve_lock(stack, tmp_path, "greet")
    prefix = tmp_path / "prefix"
    refused = build(lock, prefix, stack)
    assert refused.returncode == 2
    assert "no sha256" in refused.stderr and "--no-verify" in refused.stderr
    accepted = build(lock, prefix, stack, "--no-verify")
    assert accepted.returncode == 0, accepted.stderr


def test_binary_and_pip_packages(stack: MiniStack, tmp_path: Path) -> None:
    write_binary(stack)
    write_pylib(stack)
    lock = resolve_lock(stack, tmp_path, "tool", "pylib")
    prefix = tmp_path / "prefix"
    done = build(lock, prefix, stack)
    assert done.returncode == 0, done.stderr
    tool = installed(prefix, lock, "tool")
    run = subprocess.run([str(tool / "bin" / "tool")], capture_output=True, text=True, timeout=30, check=True)
    assert run.stdout.strip() == "tool 0.5"  # stripped to the package root, executable bit kept
    assert (tool / "include" / "tool.h").is_file()
    assert (tool / "lib" / "libtool.so").readlink() == Path("libtool.so.0")  # the recipe's links
    pylib = installed(prefix, lock, "pylib")
    site = site_packages(pylib)
    probe = [sys.executable, "-c", "import pylib; print(pylib.__file__); print(pylib.GREET_PREFIX)"]
    out = subprocess.run(
        probe,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
    ).stdout.split()
    assert out == [str(site / "pylib" / "__init__.py"), str(installed(prefix.resolve(), lock, "greet"))]
    lua = (prefix / "modulefiles" / "lmod" / "Core" / "pylib" / "0.3.lua").read_text()
    assert f'prepend_path("PYTHONPATH", "{site}")' in lua


def test_a_second_build_in_the_same_prefix_is_refused(stack: MiniStack, tmp_path: Path) -> None:
    lock = resolve_lock(stack, tmp_path, "greet")
    prefix = tmp_path / "prefix"
    (prefix / ".hpcdl").mkdir(parents=True)
    with (prefix / ".hpcdl" / "build.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # what a running build holds
        done = build(lock, prefix, stack)
    assert done.returncode == 2 and "another `hpcdl stack build` is running" in done.stderr
    assert not (prefix / "greet").exists()


def test_progress_reports_each_package_and_download(stack: MiniStack, tmp_path: Path) -> None:
    lock = load_lock(resolve_lock(stack, tmp_path, "wave"))
    recipes = load_recipes([stack.recipes])
    options = BuildOptions(tmp_path / "prefix", mirror=str(stack.mirror), jobs=2)
    steps: list[PackageStep] = []
    transfers: list[Transfer] = []
    Builder(lock, recipes, options, BuildProgress(step=steps.append, transfer=transfers.append)).run()
    assert [(s.index, s.total, s.phase, s.finished) for s in steps] == [
        (1, 2, "fetching", 0),
        (1, 2, "building", 0),
        (1, 2, "installed", 1),
        (2, 2, "fetching", 1),
        (2, 2, "building", 1),
        (2, 2, "installed", 2),
    ]
    assert [s.label for s in steps[::3]] == ["greet@1.0", "wave@2.0"]
    done = [t for t in transfers if t.finished]
    assert [t.filename for t in done] == ["greet-1.0.tar.gz", "wave-2.0.tar.gz"]
    assert all(t.received == t.total == (stack.mirror / t.filename).stat().st_size for t in done)
    steps.clear()
    Builder(lock, recipes, options, BuildProgress(step=steps.append)).run()
    assert [(s.phase, s.finished) for s in steps] == [("installed already", 1), ("installed already", 2)]


def test_a_download_resumes_from_its_part_through_an_http_mirror(stack: MiniStack, tmp_path: Path) -> None:
    lock = resolve_lock(stack, tmp_path, "greet")
    prefix = tmp_path / "prefix"
    cache = prefix / ".hpcdl" / "cache"
    cache.mkdir(parents=True)
    tarball = (stack.mirror / "greet-1.0.tar.gz").read_bytes()
    (cache / "greet-1.0.tar.gz.part").write_bytes(tarball[:500])  # what an interrupted build left
    with http_mirror(stack.mirror) as (base, server):
        done = build(lock, prefix, stack, mirror=base)
    assert done.returncode == 0, done.stderr
    assert ("/greet-1.0.tar.gz", "bytes=500-") in server.requests
    assert server.body_bytes == len(tarball) - 500
    size, rate = len(tarball), r"[\d.]+ \S*B/s"
    line = rf"fetched greet-1\.0\.tar\.gz: {size} bytes in [\d.]+ s \({rate}, resumed after 500 bytes\)"
    assert re.search(line, done.stderr), done.stderr
    assert (installed(prefix, lock, "greet") / "bin" / "greet").is_file()
