"""Tiny real source packages for builder tests: an autotools-style C package (hand-written POSIX
`configure`, so autoconf is not needed), a CMake package linking against it, tarballs in a local mirror,
and recipes naming their real sha256; and `hpcdl` run as a user types it."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

CONFIGURE = """\
#!/bin/sh
# hand-written configure: --prefix=DIR and --with-greeting=TEXT, like autoconf's interface
prefix=/usr/local
greeting=hello
for arg in "$@"; do
  case "$arg" in
    --prefix=*) prefix="${arg#--prefix=}" ;;
    --with-greeting=*) greeting="${arg#--with-greeting=}" ;;
    *) echo "configure: error: unrecognized option: $arg" >&2; exit 1 ;;
  esac
done
sed -e "s|@prefix@|$prefix|g" -e "s|@greeting@|$greeting|g" Makefile.in > Makefile
echo "configure: prefix=$prefix greeting=$greeting"
"""

MAKEFILE_IN = """\
PREFIX = @prefix@
CC ?= cc
all: greet libgreet.a
libgreet.a: greet_lib.c greet.h
\t$(CC) -c -o greet_lib.o greet_lib.c -DGREETING='"@greeting@"'
\tar rcs libgreet.a greet_lib.o
greet: main.c libgreet.a
\t$(CC) -o greet main.c libgreet.a
install: all
\tmkdir -p $(PREFIX)/bin $(PREFIX)/lib $(PREFIX)/include
\tcp greet $(PREFIX)/bin/
\tcp libgreet.a $(PREFIX)/lib/
\tcp greet.h $(PREFIX)/include/
"""

GREET_H = "const char *greet_message(void);\n"
GREET_LIB = '#include "greet.h"\nconst char *greet_message(void) { return GREETING; }\n'
GREET_MAIN = '#include <stdio.h>\n#include "greet.h"\nint main(void) { puts(greet_message()); return 0; }\n'

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.13)
project(wave C)
add_executable(wave wave.c)
target_link_libraries(wave greet)
install(TARGETS wave DESTINATION bin)
"""
WAVE_C = (
    "#include <stdio.h>\n#include <greet.h>\n"
    'int main(void) { printf("%s from wave\\n", greet_message()); return 0; }\n'
)


def make_tarball(path: Path, top: str, files: dict[str, str], executable: tuple[str, ...] = ()) -> str:
    """Write a .tar.gz with `files` under `top/`; return its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            info.mode = 0o755 if name in executable else 0o644
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def greet_files(broken: bool = False) -> dict[str, str]:
    lib = (
        GREET_LIB.replace("return GREETING;", "return GREETING  /* missing semicolon */")
        if broken
        else GREET_LIB
    )
    return {
        "configure": CONFIGURE,
        "Makefile.in": MAKEFILE_IN,
        "greet.h": GREET_H,
        "greet_lib.c": lib,
        "main.c": GREET_MAIN,
    }


def recipe_text(name: str, version: str, url: str, sha256: str, body: str) -> str:
    head = f"""\
    name: {name}
    description: test package {name}
    versions:
      "{version}":
        url: {url}
        sha256: {sha256}
    """
    return textwrap.dedent(head) + textwrap.dedent(body)


@dataclass
class MiniStack:
    """A recipe directory, a mirror and an 'upstream' directory for greet (autotools) and wave (CMake)."""

    recipes: Path
    mirror: Path
    upstream: Path

    def write_autotools(self, name: str, version: str, greeting: str, body: str, broken: bool = False) -> str:
        """A greet-style package NAME@VERSION whose `greet` prints GREETING (which may use {deps...})."""
        tarball = self.upstream / f"{name}-{version}.tar.gz"
        sha = make_tarball(tarball, f"{name}-{version}", greet_files(broken), executable=("configure",))
        (self.mirror / tarball.name).write_bytes(tarball.read_bytes())
        build = f"""\
        build:
          system: autotools
          args:
            - --with-greeting={greeting}
        """
        text = recipe_text(name, version, tarball.as_uri(), sha, build) + textwrap.dedent(body)
        (self.recipes / f"{name}.yaml").write_text(text)
        return sha

    def write_greet(self, greeting: str = "hello", broken: bool = False) -> str:
        body = """\
        module:
          level: core
          env:
            setenv:
              GREET_HOME: ""
            prepend_path:
              PATH: bin
        """
        return self.write_autotools("greet", "1.0", greeting, body, broken)

    def write_wave(self, broken: bool = False) -> str:
        tarball = self.upstream / "wave-2.0.tar.gz"
        source = WAVE_C.replace("return 0;", "return 0") if broken else WAVE_C
        sha = make_tarball(tarball, "wave-2.0", {"CMakeLists.txt": CMAKELISTS, "wave.c": source})
        (self.mirror / tarball.name).write_bytes(tarball.read_bytes())
        body = """\
        depends_on:
          - greet
        build:
          system: cmake
        module:
          level: core
          env:
            prepend_path:
              PATH: bin
        """
        (self.recipes / "wave.yaml").write_text(recipe_text("wave", "2.0", tarball.as_uri(), sha, body))
        return sha


def new_test_stack(root: Path) -> MiniStack:
    stack = MiniStack(root / "recipes", root / "mirror", root / "upstream")
    for directory in (stack.recipes, stack.mirror, stack.upstream):
        directory.mkdir(parents=True)
    return stack


SETUP_PY = """\
import os
from pathlib import Path
from setuptools import setup

# the builder's environment names the dependency's prefix (recipe build.env)
Path("pylib/_built_with.py").write_text(f"GREET_PREFIX = {os.environ['GREET_PREFIX']!r}\\n")
setup(name="pylib", version="0.3", packages=["pylib"])
"""


def write_binary(stack: MiniStack) -> str:
    """A wheel-like zip whose payload sits under vendor/tool/ (the recipe strips it), with an executable."""
    archive = stack.upstream / "tool-0.5-py3-none-any.whl"
    with zipfile.ZipFile(archive, "w") as zipped:
        script = zipfile.ZipInfo("vendor/tool/bin/tool")
        script.external_attr = 0o755 << 16
        zipped.writestr(script, "#!/bin/sh\necho tool 0.5\n")
        zipped.writestr("vendor/tool/include/tool.h", "int tool(void);\n")
        zipped.writestr("vendor/tool/lib/libtool.so.0", "not really a library\n")
    (stack.mirror / archive.name).write_bytes(archive.read_bytes())
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    text = f"""\
    name: tool
    description: a binary redistributable
    versions:
      "0.5":
        sources:
          - url: {archive.as_uri()}
            sha256: {sha}
            strip: vendor/tool
    build:
      system: binary
      links:
        lib/libtool.so: libtool.so.0
    """
    (stack.recipes / "tool.yaml").write_text(textwrap.dedent(text))
    return sha


def write_pylib(stack: MiniStack) -> str:
    """A setuptools sdist installed by pip into the prefix, built with an environment naming a dependency."""
    tarball = stack.upstream / "pylib-0.3.tar.gz"
    files = {"setup.py": SETUP_PY, "pylib/__init__.py": "from pylib._built_with import GREET_PREFIX\n"}
    sha = make_tarball(tarball, "pylib-0.3", files)
    (stack.mirror / tarball.name).write_bytes(tarball.read_bytes())
    body = """\
    depends_on: [greet]
    build:
      system: pip
      args: [--no-deps, --no-build-isolation]
      env:
        GREET_PREFIX: "{deps.greet.prefix}"
    module:
      env:
        prepend_path:
          PYTHONPATH: "{site_packages}"
    """
    (stack.recipes / "pylib.yaml").write_text(recipe_text("pylib", "0.3", tarball.as_uri(), sha, body))
    return sha


def hpcdl(*args: str, env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess:
    """`hpcdl ARGS...` in a subprocess, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "hpcdl", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )


def resolve_lock(stack: MiniStack, directory: Path, *specs: str) -> Path:
    """DIRECTORY/stack.lock from `hpcdl stack resolve SPECS --format lock` over the stack's recipes."""
    lock = directory / "stack.lock"
    done = hpcdl(
        "stack", "resolve", *specs, "--recipes", str(stack.recipes), "--format", "lock", "-o", str(lock)
    )
    assert done.returncode == 0, done.stderr
    return lock


def build(
    lock: Path,
    prefix: Path,
    stack: MiniStack,
    *extra: str,
    mirror: Optional[str] = None,
    env: Optional[dict[str, str]] = None,
) -> subprocess.CompletedProcess:
    """`hpcdl stack build LOCK --prefix PREFIX` from the stack's mirror (or `mirror`) and recipes, 2 jobs."""
    args = ["--prefix", str(prefix), "--mirror", mirror or str(stack.mirror), "--recipes", str(stack.recipes)]
    return hpcdl("stack", "build", str(lock), *args, "--jobs", "2", *extra, env=env)
