"""Spec strings and Spack-style version ranges."""

from __future__ import annotations

import pytest

from hpcdl.stack.spec import SpecError, parse_request, parse_spec, version_range


@pytest.mark.parametrize(
    ("text", "inside", "outside"),
    [
        ("12.4", ["12.4.0", "12.4.1"], ["12.40.0", "12.5.0", "12.3.2"]),
        ("12.4:", ["12.4.0", "13.0.2"], ["12.3.2"]),
        (":12.4", ["11.8.0", "12.4.1"], ["12.5.0"]),
        ("12.1:12.4", ["12.1.1", "12.4.1"], ["12.0.1", "12.5.0"]),
        (">=2.5,<2.7", ["2.5.1", "2.6.0"], ["2.7.1"]),
    ],
)
def test_version_ranges(text: str, inside: list[str], outside: list[str]) -> None:
    spec = version_range(text)
    assert all(spec.contains(v) for v in inside)
    assert not any(spec.contains(v) for v in outside)


def test_spec_with_variants() -> None:
    spec = parse_spec("openmpi@4.1:+cuda~ucx")
    assert spec.name == "openmpi"
    assert spec.variant_map == {"cuda": True, "ucx": False}
    assert spec.matches("4.1.4", {"cuda": True, "ucx": False})
    assert not spec.matches("4.1.4", {"cuda": False, "ucx": False})
    assert not spec.matches("4.0.7", {"cuda": True, "ucx": False})


def test_anonymous_when_spec() -> None:
    spec = parse_spec("@:3", allow_anonymous=True)
    assert spec.name == "" and spec.matches("3.4.3", {}) and not spec.matches("4.0.2", {})
    with pytest.raises(SpecError, match="names no package"):
        parse_spec("+cuda")


@pytest.mark.parametrize("bad", ["cuda@12.x", "openmpi+cuda~cuda", "@", "cuda@>=abc", "1cuda"])
def test_bad_specs_say_how_to_write_them(bad: str) -> None:
    with pytest.raises(SpecError):
        parse_spec(bad)


def test_request_splits_specs_and_providers() -> None:
    request = parse_request(["cuda@12.4", "pytorch@2.5", "mpi=openmpi", "torch@>=2.5,<2.7"])
    assert [s.name for s in request.specs] == ["cuda", "pytorch", "torch"]
    assert request.provider_map == {"mpi": "openmpi"}
    with pytest.raises(SpecError, match="nothing to resolve"):
        parse_request([])
