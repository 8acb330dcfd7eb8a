"""Real module systems for tests: Lmod (Debian 'lmod') and Environment Modules (Debian
'environment-modules', which conflicts with lmod, so its .deb is unpacked beside it and relocated)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
LMOD_SYNTAX_CHECK = Path("/usr/share/lmod/lmod/libexec/check_module_tree_syntax")
ENVMOD_CACHE = Path(os.environ.get("HPCDL_TEST_CACHE", "/tmp/hpcdl-test-cache")) / "environment-modules"
SHELL_TIMEOUT_S = 120

# Variables a surrounding module system may have set; each test shell starts without them.
_MODULE_VARS = (
    "LOADEDMODULES", "_LMFILES_", "MODULEPATH", "BASH_ENV", "MODULESHOME", "LMOD_CMD", "LMOD_DIR",
    "__LMOD_REF_COUNT_PATH", "__LMOD_REF_COUNT_MODULEPATH", "_ModuleTable001_", "_ModuleTable_Sz_",
    "__MODULES_LMALTNAME", "__MODULES_LMPREREQ", "__MODULES_LMCONFLICT", "__MODULES_SHARE_PATH",
    "MODULES_CMD", "ENV", "PYTHONPATH", "HPCDL_HOME",
)  # fmt: skip


def lmod_missing() -> str:
    return "" if LMOD_INIT.is_file() else f"Lmod is not installed ({LMOD_INIT} missing): apt install lmod"


def _clean_env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _MODULE_VARS and not k.startswith("__LMOD")}
    env.update(extra or {})
    return env


def _bash(init: str, script: str, env: dict[str, str] | None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f"{init}\nset -eu\n{script}"],
        capture_output=True,
        text=True,
        env=_clean_env(env),
        timeout=SHELL_TIMEOUT_S,
        check=False,
    )


def run_lmod(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `script` in a clean non-interactive bash with Lmod initialised."""
    return _bash(f"source {LMOD_INIT}", script, env)


def envmod_root() -> Path | str:
    """Environment Modules unpacked from its Debian package (cached); a reason string when impossible."""
    init = ENVMOD_CACHE / "root" / "usr/share/modules/init/bash"
    if (ENVMOD_CACHE / "root" / ".relocated").is_file():
        return init
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        return "apt-get/dpkg-deb not available to fetch environment-modules"
    if not shutil.which("tclsh"):
        return "tclsh is missing (apt install tcl8.6): Environment Modules needs it"
    ENVMOD_CACHE.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(ENVMOD_CACHE / "root", ignore_errors=True)
    for deb in ENVMOD_CACHE.glob("*.deb"):
        deb.unlink()
    download = ["apt-get", "download", "environment-modules"]
    done = subprocess.run(
        download, cwd=ENVMOD_CACHE, capture_output=True, text=True, timeout=300, check=False
    )
    debs = list(ENVMOD_CACHE.glob("environment-modules_*.deb"))
    if done.returncode != 0 or not debs:
        return f"apt-get download environment-modules failed: {done.stderr.strip()[-300:]}"
    root = ENVMOD_CACHE / "root"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(root)], check=True, timeout=120)
    replacements = {
        "/usr/share/modules": f"{root}/usr/share/modules",
        "/etc/environment-modules": f"{root}/etc/environment-modules",
        "/usr/lib/x86_64-linux-gnu": f"{root}/usr/lib/x86_64-linux-gnu",
    }
    for path in root.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if b"\0" in data[:4096]:
            continue
        text = data.decode(errors="surrogateescape")
        changed = text
        for old, new in replacements.items():
            changed = changed.replace(old, new)
        if changed != text:
            path.write_bytes(changed.encode(errors="surrogateescape"))
    (root / ".relocated").touch()
    return init


def run_envmod(init: Path, script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `script` in a clean non-interactive bash with Environment Modules initialised."""
    return _bash(f"source {init}", script, env)
