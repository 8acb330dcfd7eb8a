"""What package names, versions, variants, hashes and file names may look like.

They become directory and file names under the install prefix (``PREFIX/<name>/<version>-<hash>``), module
names and words in modulefiles, so a lockfile or recipe from someone else (a shared project directory, a
download) must not be able to smuggle a ``/``, a ``..`` or a control character into any of them.
"""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

NAME_PATTERN = r"[A-Za-z][A-Za-z0-9_.-]*"  # also the name part of a spec (hpcdl.stack.spec)
VARIANT_PATTERN = r"[A-Za-z][A-Za-z0-9_-]*"
_NAME = re.compile(rf"^{NAME_PATTERN}$")
_VARIANT = re.compile(rf"^{VARIANT_PATTERN}$")
_VERSION_CHARS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_HASH = re.compile(r"^[0-9a-f]{7,64}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def name_problem(name: str) -> str:
    """Why `name` cannot be a package name ("" when it can)."""
    if _NAME.match(name):
        return ""
    return f"'{name}' is not a package name (a letter, then letters, digits, '_', '.' or '-')"


def version_problem(version: str) -> str:
    """Why `version` cannot be a package version ("" when it can): PEP 440 syntax, in plain characters."""
    try:
        Version(version)
    except InvalidVersion:
        return f"'{version}' is not a version number (e.g. 4.1.6 or 2.5.1)"
    if not _VERSION_CHARS.match(version):
        return f"'{version}' is not a version number (letters, digits, '.', '+', '_' or '-' only)"
    return ""


def variant_problem(variant: str) -> str:
    """Why `variant` cannot be a variant name ("" when it can)."""
    if _VARIANT.match(variant):
        return ""
    return f"'{variant}' is not a variant name (a letter, then letters, digits, '_' or '-')"


def hash_problem(value: str) -> str:
    """Why `value` cannot be a lockfile hash ("" when it can): 7 to 64 lowercase hex digits."""
    if _HASH.match(value):
        return ""
    return f"'{value}' is not a package hash (7 to 64 lowercase hex digits, as `hpcdl stack resolve` writes)"


def file_name_problem(name: str) -> str:
    """Why `name` cannot be a downloaded file's name ("" when it can): one plain path component."""
    if name in ("", ".", "..") or "/" in name or "\\" in name or _CONTROL.search(name):
        return f"'{name}' is not a plain file name"
    return ""


def has_control_characters(text: str) -> bool:
    return bool(_CONTROL.search(text))
