"""The one way a value enters a modulefile: as a Lua string literal or a Tcl quoted word.

Everything a template prints that is not its own fixed text goes through ``lua`` or ``tcl`` (Jinja filters
of the same names), so no value (a path, a description, a help text, an environment value) can end a
string and start a statement. Module and variable names are validated as well, since module systems also
read them as names, and control characters are refused outright (hpcdl.modules.render checks both).
"""

from __future__ import annotations

import re
from collections.abc import Callable

# One component of a module name (name, version, compiler): what Lmod and Environment Modules read as a
# plain word and what is safe as a directory name.
_MODULE_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_LUA_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n"}
_TCL_SPECIAL = set('\\"$[]{}')


def _quoted(value: object, escape: Callable[[str], str]) -> str:
    return '"' + "".join(escape(char) for char in str(value)) + '"'


def _lua_char(char: str) -> str:
    if char in _LUA_ESCAPES:
        return _LUA_ESCAPES[char]
    return f"\\{ord(char):03d}" if CONTROL.match(char) else char


def _tcl_char(char: str) -> str:
    if char in _TCL_SPECIAL:
        return "\\" + char
    return f"\\{ord(char):03o}" if CONTROL.match(char) else char


def lua(value: object) -> str:
    """`value` as a double-quoted Lua string literal: backslash and quote escaped, control characters as
    three-digit decimal escapes, so the literal always ends where it should."""
    return _quoted(value, _lua_char)


def tcl(value: object) -> str:
    """`value` as a double-quoted Tcl word with no substitution left in it: backslash, quote, $, brackets
    and braces escaped (an escaped brace does not count when Tcl matches the braces of a proc body),
    control characters as three-digit octal escapes."""
    return _quoted(value, _tcl_char)


def module_name_problem(name: str) -> str:
    """Why `name` (``NAME`` or ``NAME/VERSION``, as in depends_on) cannot be a module name ("" if it can)."""
    if all(_MODULE_WORD.match(part) for part in name.split("/")):
        return ""
    return (
        f"'{name}' is not a module name: each part of NAME/VERSION is letters, digits, '.', '_', '+' or "
        "'-', starting with a letter or digit"
    )
