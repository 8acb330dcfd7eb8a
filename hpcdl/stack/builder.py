"""``hpcdl stack build``: fetch, verify, unpack, build and install a lockfile's packages in dependency order.

Layout under PREFIX: ``<name>/<version>-<hash>/`` per package (``.hpcdl/install.json`` inside marks a
finished install), ``.hpcdl/cache/`` for verified downloads, ``.hpcdl/stage/`` for unpacked sources and
``.hpcdl/logs/<name>-<version>-<hash>.log`` for every command's output. A failed package leaves its log
and stage; running the build again skips what is installed and retries the rest (and resumes a download
that broke off). An install directory this builder did not start is never touched without ``force``.

A lockfile may come from someone else: its names, versions and hashes are checked, and every directory the
builder writes or deletes must resolve inside the prefix, so that no field (``hash: x/../../..``) and no
link planted under the prefix can make it write, or with ``force`` delete, anything outside.

A prefix may be shared with other users: ``.hpcdl/`` is kept private (mode 0700, the user's, not a link),
so nobody else can change a verified download or the unpacked sources. Each build gets a new stage
directory; archives are unpacked into fresh private directories renamed into place
(:func:`hpcdl.stack.archive.unpack`), and before the build commands run the stage is checked again (the
user's, private, no link, the very directory made for this build) and the commands run in the directory so
checked (by descriptor, not by name).
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from hpcdl.common.exceptions import HpcdlError
from hpcdl.common.output_file import OutputFileError, open_output_file, private_directory, write_output_file
from hpcdl.stack.archive import unpack
from hpcdl.stack.fetch import DEFAULT_MAX_DOWNLOAD_BYTES, Transfer, fetch
from hpcdl.stack.lockfile import Lock, LockedPackage
from hpcdl.stack.recipe import UNKNOWN_CHECKSUM, Recipe, Source

STEP_TIMEOUT_S = 4 * 3600.0
MARKER_DIR = ".hpcdl"
INSTALLED = "install.json"
BUILDING = "building"


class BuildError(HpcdlError):
    """A package failed to build; the message names the step, the log and its last lines."""


def site_packages(prefix: Path) -> Path:
    """Where `pip install --prefix PREFIX` puts pure-Python packages for this interpreter."""
    scheme = "posix_prefix" if os.name == "posix" else "nt"
    return Path(sysconfig.get_path("purelib", scheme, vars={"base": str(prefix), "platbase": str(prefix)}))


@dataclass(frozen=True)
class BuildOptions:
    prefix: Path
    mirror: str | None = None
    jobs: int = 1
    dry_run: bool = False
    force: bool = False
    verify: bool = True
    step_timeout: float = STEP_TIMEOUT_S
    max_download_bytes: int = DEFAULT_MAX_DOWNLOAD_BYTES


@dataclass(frozen=True)
class PackageStep:
    """A package entering a phase of the build, for progress displays."""

    index: int  # 1-based place in the build order
    total: int  # packages in the lockfile
    label: str  # name@version+variants
    phase: str  # "installed already", "fetching", "building", "installed", or "would build" (dry run)
    finished: int  # packages done so far, this one included once it is installed or skipped


def _ignore(_: object) -> None:
    return None


@dataclass(frozen=True)
class BuildProgress:
    """How a build reports; the CLI draws it, a library user may pass only what it wants."""

    message: Callable[[str], None] = _ignore  # a line for the user: what happens, where the log is
    step: Callable[[PackageStep], None] = _ignore
    transfer: Callable[[Transfer], None] = _ignore  # a download's bytes, as they arrive


@dataclass
class PackagePlan:
    package: LockedPackage
    recipe: Recipe
    install_dir: Path
    log: Path
    stage: Path
    state: str  # "installed" (nothing to do) or "build"
    commands: list[list[str]] = field(default_factory=list)


@dataclass
class BuildReport:
    built: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    plans: list[PackagePlan] = field(default_factory=list)


class _Deps(SimpleNamespace):
    """`{deps.NAME.prefix}` in recipes; a missing NAME is a recipe error, not a KeyError."""

    def __getattr__(self, name: str) -> SimpleNamespace:
        raise BuildError(f"the recipe refers to deps.{name}, which is not a dependency in the lockfile")


def install_dir(prefix: Path, package: LockedPackage) -> Path:
    return prefix / package.name / package.install_name


def _within(path: Path, prefix: Path) -> bool:
    """Whether `path`, with every link in it resolved, is strictly inside the resolved `prefix`."""
    real = os.path.realpath(path)
    return real.startswith(str(prefix) + os.sep)


def is_installed(directory: Path) -> bool:
    return (directory / MARKER_DIR / INSTALLED).is_file()


class Builder:
    def __init__(
        self,
        lock: Lock,
        recipes: dict[str, Recipe],
        options: BuildOptions,
        progress: BuildProgress | None = None,
    ):
        problems = [f"{p.label()}: {problem}" for p in lock.packages for problem in p.problems()]
        if problems:
            raise BuildError("the lockfile cannot be built: " + "; ".join(problems))
        missing = [p.name for p in lock.packages if p.name not in recipes]
        if missing:
            raise BuildError(f"no recipe for {', '.join(missing)}; add a recipe directory with --recipes DIR")
        self.lock = lock
        self.recipes = recipes
        self.options = options
        self.prefix = options.prefix.resolve()
        self._cache = self.prefix / MARKER_DIR / "cache"  # verified downloads, kept for rebuilds
        self.progress = progress or BuildProgress()

    def _inside(self, path: Path, what: str, package: LockedPackage) -> Path:
        if not _within(path, self.prefix):
            raise BuildError(
                f"{package.label()}: its {what} {path} resolves to {os.path.realpath(path)}, outside the "
                f"prefix {self.prefix}; a link under the prefix leads out of it: remove that link"
            )
        return path

    # -- planning ------------------------------------------------------------------------------------------
    def plan(self) -> list[PackagePlan]:
        plans = []
        for package in self.lock.packages:
            directory = self._inside(install_dir(self.prefix, package), "install directory", package)
            tag = f"{package.name}-{package.install_name}"
            if directory.is_symlink():
                raise BuildError(
                    f"{directory} is a link; the builder installs only into directories it makes"
                )
            state = "installed" if is_installed(directory) and not self.options.force else "build"
            foreign = directory.exists() and not (directory / MARKER_DIR / BUILDING).exists()
            if state == "build" and foreign and not self.options.force:
                raise BuildError(
                    f"{directory} exists and was not made by this builder; move it away or pass --force "
                    "to replace it"
                )
            plan = PackagePlan(
                package,
                self.recipes[package.name],
                directory,
                self._inside(self.prefix / MARKER_DIR / "logs" / f"{tag}.log", "log", package),
                self._inside(self.prefix / MARKER_DIR / "stage" / tag, "stage", package),
                state,
            )
            plan.commands = self._commands(plan, source_root=plan.stage / "src0")
            plans.append(plan)
        return plans

    def _context(self, plan: PackagePlan) -> dict:
        deps = _Deps()
        for name in self._closure(plan.package):
            dep = self.lock.package(name)
            version = dep.version
            info = SimpleNamespace(
                prefix=str(install_dir(self.prefix, dep)),
                version=version,
                nodot="".join(version.split(".")[:2]),
            )
            setattr(deps, name, info)
            for virtual in self.recipes[name].provides:
                setattr(deps, virtual, info)
        return {
            "prefix": str(plan.install_dir),
            "version": plan.package.version,
            "jobs": self.options.jobs,
            "deps": deps,
            "site_packages": str(site_packages(plan.install_dir)),
        }

    def _format(self, text: str, plan: PackagePlan) -> str:
        try:
            return text.format(**self._context(plan))
        except (KeyError, AttributeError, IndexError) as exc:
            raise BuildError(f"{plan.recipe.path}: cannot fill in '{text}': {exc}") from None

    def _args(self, plan: PackagePlan) -> list[str]:
        variants = plan.package.variants
        return [
            self._format(arg.arg, plan)
            for arg in plan.recipe.build.args
            if arg.when is None or arg.when.matches(plan.package.version, variants)
        ]

    def _commands(self, plan: PackagePlan, source_root: Path) -> list[list[str]]:
        system, args, jobs = plan.recipe.build.system, self._args(plan), str(self.options.jobs)
        target = str(plan.install_dir)
        if system == "autotools":
            commands = (
                []
                if (source_root / "configure").exists() or self.options.dry_run
                else [["autoreconf", "-fi"]]
            )
            return [
                *commands,
                ["./configure", f"--prefix={target}", *args],
                ["make", f"-j{jobs}"],
                ["make", "install"],
            ]
        if system == "cmake":
            build = str(plan.stage / "build")
            return [
                [
                    "cmake",
                    "-S",
                    ".",
                    "-B",
                    build,
                    f"-DCMAKE_INSTALL_PREFIX={target}",
                    "-DCMAKE_BUILD_TYPE=Release",
                    *args,
                ],
                ["cmake", "--build", build, "--parallel", jobs],
                ["cmake", "--install", build],
            ]
        if system == "make":
            return [
                ["make", f"-j{jobs}", f"PREFIX={target}", *args],
                ["make", "install", f"PREFIX={target}", *args],
            ]
        if system == "pip":
            command = [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--prefix",
                target,
                "--no-warn-script-location",
            ]
            if self.options.mirror and "://" not in self.options.mirror:
                command += ["--find-links", str(Path(self.options.mirror).resolve())]
            return [[*command, *args, *self._pip_what(plan)]]
        return [["copy", "<unpacked sources>", target]]

    def _pinned_source(self, plan: PackagePlan) -> Source | None:
        """The archive pip installs, when the recipe names one with a sha256 and checks are on."""
        sources = self.recipes[plan.package.name].version(plan.package.version).sources
        if sources and self.options.verify and sources[0].sha256 != UNKNOWN_CHECKSUM:
            return sources[0]
        return None

    def _pip_what(self, plan: PackagePlan) -> list[str]:
        """What pip installs: the recipe's archive pinned to its sha256 (pip checks it again as it
        installs), the unverified archive (--no-verify), or the recipe's requirement, resolved by pip
        from its index and not hash-pinned by the recipe."""
        if self._pinned_source(plan) is not None:
            return ["--require-hashes", "-r", str(plan.stage / "requirements.txt")]
        sources = self.recipes[plan.package.name].version(plan.package.version).sources
        if sources:
            return [str(self._cache / sources[0].filename)]
        return [self._format(plan.recipe.build.requirement, plan)]

    def _write_pip_requirements(self, plan: PackagePlan) -> None:
        source = self._pinned_source(plan)
        if source is not None:
            archive = (self._cache / source.filename).as_uri()
            text = f"{archive} --hash=sha256:{source.sha256}\n"
            write_output_file(plan.stage / "requirements.txt", "pip requirements", text, replace=True)

    def _closure(self, package: LockedPackage) -> list[str]:
        seen: list[str] = []
        stack = list(package.depends_on)
        while stack:
            name = stack.pop()
            if name not in seen:
                seen.append(name)
                stack += self.lock.package(name).depends_on
        return seen

    # -- building --------------------------------------------------------------------------------------------
    def run(self) -> BuildReport:
        plans = self.plan()
        if self.options.dry_run:
            return self._walk(plans)
        self._private(self.prefix / MARKER_DIR, "build directory")
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC  # one file: not replaced, not truncated
        with os.fdopen(os.open(self.prefix / MARKER_DIR / "build.lock", flags, 0o600), "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise BuildError(
                    f"another `hpcdl stack build` is running in {self.prefix}; wait for it to finish"
                ) from None
            return self._walk(plans)

    def _walk(self, plans: list[PackagePlan]) -> BuildReport:
        report = BuildReport(plans=plans)
        total = len(plans)
        for index, plan in enumerate(plans, 1):
            head = f"[{index}/{total}] {plan.package.label()} ({plan.package.hash})"
            done = len(report.built) + len(report.skipped)

            def step(phase: str, finished: int = done, index: int = index, plan: PackagePlan = plan) -> None:
                self.progress.step(PackageStep(index, total, plan.package.label(), phase, finished))

            if plan.state == "installed":
                self.progress.message(f"{head}: already installed in {plan.install_dir}")
                report.skipped.append(plan.package.name)
                step("installed already", done + 1)
                continue
            if self.options.dry_run:
                step("would build")
                self._describe(head, plan)
                continue
            self._build(head, plan, step)
            report.built.append(plan.package.name)
            step("installed", done + 1)
        return report

    def _describe(self, head: str, plan: PackagePlan) -> None:
        self.progress.message(f"{head}: would build with {plan.recipe.build.system} into {plan.install_dir}")
        for source in self.recipes[plan.package.name].version(plan.package.version).sources:
            self.progress.message(
                f"    fetch {source.filename} (sha256 {source.sha256[:16]}...) from {source.url}"
            )
        for command in plan.commands:
            self.progress.message(f"    $ {shlex.join(command)}")

    def _build(self, head: str, plan: PackagePlan, step: Callable[[str], None]) -> None:
        if plan.install_dir.exists():  # our own unfinished attempt, or --force
            shutil.rmtree(plan.install_dir)
        made = self._fresh_stage(plan)
        (plan.install_dir / MARKER_DIR).mkdir(parents=True)
        write_output_file(
            plan.install_dir / MARKER_DIR / BUILDING, "build marker", plan.package.label() + "\n"
        )
        with open_output_file(plan.log, "build log", replace=True, parents=True, mode=0o666) as log:
            log.write(f"# {plan.package.label()} ({plan.package.hash}) into {plan.install_dir}\n")
            roots = self._fetch_and_unpack(head, plan, log, step)
            source_root = roots[0] if roots else plan.stage
            plan.commands = self._commands(plan, source_root)
            step("building")
            stage = self._checked_stage(plan, made)
            opened = [self._open_under(stage, plan, root) for root in roots or [plan.stage]]
            try:
                if plan.recipe.build.system == "binary":
                    self.progress.message(f"{head}: installing")
                    for fd in opened:
                        shutil.copytree(
                            f"/proc/self/fd/{fd}", plan.install_dir, dirs_exist_ok=True, symlinks=True
                        )
                else:
                    if plan.recipe.build.system == "pip":
                        self._write_pip_requirements(plan)
                    env = self._environment(plan)
                    for command in plan.commands:
                        self.progress.message(f"{head}: {shlex.join(command[:3])} ...")
                        self._run(command, f"/proc/self/fd/{opened[0]}", env, log, plan)
            finally:
                for fd in [stage, *opened]:
                    os.close(fd)
        for path, target in plan.recipe.build.links:
            link = plan.install_dir / path
            if not link.exists() and not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(target)
        (plan.install_dir / MARKER_DIR / BUILDING).unlink()
        record = {
            "name": plan.package.name,
            "version": plan.package.version,
            "hash": plan.package.hash,
            "variants": plan.package.variants,
            "depends_on": plan.package.depends_on,
        }
        text = json.dumps(record, indent=2) + "\n"
        write_output_file(plan.install_dir / MARKER_DIR / INSTALLED, "install record", text, mode=0o666)
        shutil.rmtree(plan.stage, ignore_errors=True)
        self.progress.message(f"{head}: installed in {plan.install_dir} (log {plan.log})")

    def _private(self, path: Path, what: str) -> os.stat_result:
        try:
            return private_directory(path, what)
        except OutputFileError as exc:
            raise BuildError(str(exc)) from None

    def _fresh_stage(self, plan: PackagePlan) -> os.stat_result:
        """A new, empty, private stage directory for this build (what was there before is removed)."""
        self._private(plan.stage.parent, "stage directory")
        if plan.stage.is_symlink() or (os.path.lexists(plan.stage) and not plan.stage.is_dir()):
            plan.stage.unlink()
        elif plan.stage.exists():
            shutil.rmtree(plan.stage)
        os.mkdir(plan.stage, 0o700)
        return os.lstat(plan.stage)

    def _checked_stage(self, plan: PackagePlan, made: os.stat_result) -> int:
        """A descriptor of the stage, checked again before its sources are built: the prefix's private
        directories and the stage are still the user's, private and no links, and the stage is the very
        directory made for this build."""
        for path in (self.prefix / MARKER_DIR, plan.stage.parent, plan.stage):
            there = os.lstat(path)
            problem = ""
            if stat.S_ISLNK(there.st_mode) or not stat.S_ISDIR(there.st_mode):
                problem = "it is no longer a directory"
            elif there.st_uid != os.geteuid():
                problem = f"it belongs to uid {there.st_uid}"
            elif stat.S_IMODE(there.st_mode) & 0o077:
                problem = f"others may use it (mode {stat.S_IMODE(there.st_mode):o})"
            if problem:
                raise BuildError(
                    f"{plan.package.label()}: {path} changed after the sources were unpacked ({problem}): "
                    "another user may have replaced them, so they are not built; build into a prefix only "
                    "you may write"
                )
        fd = os.open(plan.stage, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (made.st_dev, made.st_ino):
            os.close(fd)
            raise BuildError(
                f"{plan.package.label()}: {plan.stage} was replaced after the sources were unpacked: another "
                "user may have swapped them, so they are not built; build into a prefix only you may write"
            )
        return fd

    @staticmethod
    def _open_under(stage: int, plan: PackagePlan, root: Path) -> int:
        """A descriptor of `root`, opened from the checked stage without following links."""
        fd = os.dup(stage)
        for part in root.relative_to(plan.stage).parts:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            finally:
                os.close(fd)
            fd = inner
        return fd

    def _fetch_and_unpack(self, head: str, plan: PackagePlan, log, step: Callable[[str], None]) -> list[Path]:
        roots = []
        sources = self.recipes[plan.package.name].version(plan.package.version).sources
        for number, source in enumerate(sources):
            step("fetching")
            self.progress.message(f"{head}: fetching {source.filename}")
            archive = fetch(
                source,
                plan.package.name,
                self._inside(self._cache, "download cache", plan.package),
                self.options.mirror,
                self.options.verify,
                self.options.max_download_bytes,
                self.progress.transfer,
            )
            log.write(f"# fetched {archive} (sha256 verified: {self.options.verify})\n")
            if plan.recipe.build.system != "pip":
                roots.append(unpack(archive, plan.stage / f"src{number}", source.strip))
        return roots

    def _environment(self, plan: PackagePlan) -> dict[str, str]:
        env = dict(os.environ)
        for name in reversed(self._closure(plan.package)):
            root = install_dir(self.prefix, self.lock.package(name))
            for var, sub in (
                ("PATH", "bin"),
                ("LD_LIBRARY_PATH", "lib"),
                ("LIBRARY_PATH", "lib"),
                ("CPATH", "include"),
                ("PKG_CONFIG_PATH", "lib/pkgconfig"),
                ("CMAKE_PREFIX_PATH", ""),
            ):
                path = root / sub if sub else root
                if path.exists():
                    env[var] = os.pathsep.join(p for p in (str(path), env.get(var, "")) if p)
            site = site_packages(root)
            if site.is_dir():
                env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
        for name, value in plan.recipe.build.env:
            env[name] = self._format(value, plan)
        return env

    def _run(self, command: list[str], cwd: str, env: dict[str, str], log, plan: PackagePlan) -> None:
        log.write(f"\n$ {shlex.join(command)}\n")
        log.flush()
        try:
            done = subprocess.run(
                command,
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=self.options.step_timeout,
                check=False,
            )
            code = done.returncode
        except FileNotFoundError:
            code = 127
            log.write(f"{command[0]}: command not found\n")
        except subprocess.TimeoutExpired:
            code = -1
            log.write(f"timed out after {self.options.step_timeout:.0f}s\n")
        if code == 0:
            return
        log.flush()
        tail = plan.log.read_text(errors="replace").splitlines()[-20:]
        raise BuildError(
            f"{plan.package.label()} failed at `{shlex.join(command)}` (exit {code}).\n"
            f"log: {plan.log}\nsources kept in: {plan.stage}\n--- last lines of the log ---\n"
            + "\n".join(tail)
            + "\n--- fix the cause and run the same build again: finished packages are kept ---"
        )
