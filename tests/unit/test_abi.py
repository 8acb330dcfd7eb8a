"""hpcdl.common.abi against collectives/include/hpcdl/c_api.h: every function, argument, request field, enum
value and constant Python binds must be what the header declares (a drift corrupts memory instead of
failing to import)."""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hpcdl.common import abi

HEADER = Path(__file__).resolve().parents[2] / "collectives" / "include" / "hpcdl" / "c_api.h"

_SCALARS: dict[str, Any] = {
    "void": None,
    "char": ctypes.c_char,
    "int": ctypes.c_int,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "uint8_t": ctypes.c_uint8,
    "double": ctypes.c_double,
    "hpcdl_request": abi.Request,
}


@dataclass
class Header:
    functions: dict[str, tuple[Any, tuple[Any, ...]]] = field(default_factory=dict)
    enums: dict[str, dict[str, int]] = field(default_factory=dict)
    defines: dict[str, int] = field(default_factory=dict)
    request: list[tuple[str, Any]] = field(default_factory=list)


def _ctype(declared: str, aliases: dict[str, str]) -> Any:
    """The ctypes type of a C type as c_api.h writes it ("const int64_t*", "void**", "hpcdl_handle")."""
    text = declared.replace("const", " ").replace("*", " * ")
    words = text.split()
    stars = words.count("*")
    base = " ".join(w for w in words if w != "*")
    base = aliases.get(base, base)
    if base not in _SCALARS:
        raise ValueError(f"c_api.h uses a type this test does not know: {declared!r}")
    if stars == 0:
        return _SCALARS[base]
    if stars == 1 and base == "char":
        return ctypes.c_char_p
    if stars == 1 and base == "void":
        return ctypes.c_void_p
    if stars == 2 and base == "void":
        return ctypes.POINTER(ctypes.c_void_p)
    if stars == 1:
        return ctypes.POINTER(_SCALARS[base])
    raise ValueError(f"c_api.h uses a type this test does not know: {declared!r}")


def _split_declaration(text: str) -> tuple[str, str]:
    """("const int64_t*", "shape") from "const int64_t* shape"."""
    match = re.fullmatch(r"(.*?[\s\*])(\w+)", text.strip())
    if match is None:
        raise ValueError(f"cannot read the declaration {text!r}")
    return match.group(1).strip(), match.group(2)


def parse(text: str) -> Header:
    """What c_api.h declares: functions, enums, #defines and the request's fields."""
    code = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    code = re.sub(r"//[^\n]*", " ", code)
    header = Header()
    aliases = {m.group(2): m.group(1) for m in re.finditer(r"typedef\s+(\w+)\s+(\w+)\s*;", code)}
    for match in re.finditer(r"#define\s+(HPCDL_\w+)\s+(\d+)\b", code):
        header.defines[match.group(1)] = int(match.group(2))
    for match in re.finditer(r"typedef\s+enum\s*\{([^}]*)\}\s*(\w+)\s*;", code):
        members = {}
        for item in match.group(1).split(","):
            if item.strip():
                name, value = (part.strip() for part in item.split("="))
                members[name] = int(value)
        header.enums[match.group(2)] = members
    struct = re.search(r"typedef\s+struct\s*\{([^}]*)\}\s*hpcdl_request\s*;", code)
    assert struct is not None, "c_api.h declares no hpcdl_request"
    for statement in struct.group(1).split(";"):
        if not statement.strip():
            continue
        first, *more = statement.split(",")
        declared, name = _split_declaration(first)
        header.request.append((name, _ctype(declared, aliases)))
        base = declared.replace("*", "").strip()
        for extra in more:
            stars, extra_name = re.fullmatch(r"\s*(\**)\s*(\w+)\s*", extra).groups()  # type: ignore[union-attr]
            header.request.append((extra_name, _ctype(base + "*" * len(stars), aliases)))
    for match in re.finditer(r"HPCDL_API\s+([\w\s\*]+?)\s*\b(hpcdl_\w+)\s*\(([^)]*)\)\s*;", code):
        ret, name, args = match.groups()
        argtypes = []
        if args.strip() != "void":
            for arg in args.split(","):
                declared, _ = _split_declaration(arg)
                argtypes.append(_ctype(declared, aliases))
        header.functions[name] = (_ctype(ret, aliases), tuple(argtypes))
    return header


def _name(t: Any) -> str:
    return "void" if t is None else getattr(t, "__name__", repr(t))


def differences(text: str) -> list[str]:
    """Every way hpcdl.common.abi differs from the header `text` (empty: they agree)."""
    header = parse(text)
    found = []
    for name in sorted(header.functions.keys() - abi.FUNCTIONS.keys()):
        found.append(f"{name} is declared in c_api.h but not bound in hpcdl.common.abi")
    for name in sorted(abi.FUNCTIONS.keys() - header.functions.keys()):
        found.append(f"{name} is bound in hpcdl.common.abi but c_api.h does not declare it")
    for name, (restype, argtypes) in header.functions.items():
        if name not in abi.FUNCTIONS:
            continue
        bound_res, bound_args = abi.FUNCTIONS[name]
        if bound_res is not restype:
            found.append(
                f"{name} returns {_name(restype)} in c_api.h, {_name(bound_res)} in hpcdl.common.abi"
            )
        if len(bound_args) != len(argtypes):
            found.append(
                f"{name} takes {len(argtypes)} arguments in c_api.h, {len(bound_args)} in hpcdl.common.abi"
            )
            continue
        for i, (declared, bound) in enumerate(zip(argtypes, bound_args)):
            if declared is not bound:
                found.append(
                    f"{name} argument {i} is {_name(declared)} in c_api.h, {_name(bound)} in hpcdl.common.abi"
                )
    for typename, members in header.enums.items():
        if typename not in abi.ENUMS:
            found.append(f"enum {typename} of c_api.h has no class in hpcdl.common.abi")
            continue
        cls, prefix = abi.ENUMS[typename]
        bound = {prefix + m.name: int(m) for m in cls}  # type: ignore[attr-defined]
        if bound != members:
            found.append(f"enum {typename} is {members} in c_api.h, {bound} in hpcdl.common.abi")
    for typename in abi.ENUMS.keys() - header.enums.keys():
        found.append(f"enum {typename} of hpcdl.common.abi is not in c_api.h")
    if header.defines != abi.DEFINES:
        found.append(f"the #defines are {header.defines} in c_api.h, {abi.DEFINES} in hpcdl.common.abi")
    bound_fields = [(name, ctype) for name, ctype in abi.Request._fields_]
    if [(n, _name(t)) for n, t in header.request] != [(n, _name(t)) for n, t in bound_fields]:
        found.append(
            f"hpcdl_request is {[(n, _name(t)) for n, t in header.request]} in c_api.h, "
            f"{[(n, _name(t)) for n, t in bound_fields]} in hpcdl.common.abi"
        )
    for name in abi.HOTPATH:
        if name not in header.functions:
            found.append(f"_hotpath binds {name}, which c_api.h does not declare")
    return found


def test_the_binding_is_what_c_api_h_declares() -> None:
    text = HEADER.read_text()
    assert len(parse(text).functions) >= 45
    assert differences(text) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("int hpcdl_barrier(int process_set);", "int hpcdl_barrier(int64_t process_set);"),
            "hpcdl_barrier argument 0",
        ),
        (
            ("int hpcdl_poll(hpcdl_handle handle);", "int hpcdl_poll(hpcdl_handle handle, int flags);"),
            "hpcdl_poll takes 2",
        ),
        (("HPCDL_API double hpcdl_get_knob(const char* name);", ""), "hpcdl_get_knob is bound"),
        (("HPCDL_FLOAT32 = 7,", "HPCDL_FLOAT32 = 8,"), "enum hpcdl_dtype"),
        (("  int32_t dtype;              /* hpcdl_dtype */", "  int64_t dtype;"), "hpcdl_request is"),
        (("double prescale, postscale;", "double prescale, *postscale;"), "hpcdl_request is"),
        (("#define HPCDL_DEVICE_HEADER_WORDS 13", "#define HPCDL_DEVICE_HEADER_WORDS 14"), "#defines"),
        (
            (
                "HPCDL_API int hpcdl_stop_timeline(void);",
                "HPCDL_API int hpcdl_stop_timeline(void);\nHPCDL_API int hpcdl_new(void);",
            ),
            "hpcdl_new is declared",
        ),
    ],
)
def test_a_declaration_changed_in_c_api_h_is_caught(change: tuple[str, str], expected: str) -> None:
    old, new = change
    text = HEADER.read_text()
    assert old in text, f"the test's anchor {old!r} is no longer in c_api.h"
    found = differences(text.replace(old, new))
    assert any(expected in line for line in found), found


def test_a_binding_changed_in_python_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    functions = dict(abi.FUNCTIONS)
    functions["hpcdl_wait"] = (ctypes.c_int, (ctypes.c_int64, ctypes.c_float))
    monkeypatch.setattr(abi, "FUNCTIONS", functions)
    assert differences(HEADER.read_text()) == [
        "hpcdl_wait argument 1 is c_double in c_api.h, c_float in hpcdl.common.abi"
    ]
