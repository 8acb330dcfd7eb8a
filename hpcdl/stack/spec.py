"""Spack-style specs: ``name@versions+variant~variant`` and ``virtual=provider``.

Version ranges follow Spack and become `packaging` specifier sets:
``@12.4`` -> ``==12.4.*`` (any 12.4 release), ``@12.4:`` -> ``>=12.4``, ``@:12.4`` -> ``<12.5``,
``@12.1:12.4`` -> ``>=12.1,<12.5``. A range may also be written as specifiers: ``@>=2.5,<2.7``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from hpcdl.common.exceptions import HpcdlError
from hpcdl.stack.names import NAME_PATTERN, VARIANT_PATTERN, name_problem


class SpecError(HpcdlError):
    """A spec string could not be parsed."""


_SPEC = re.compile(
    rf"^(?P<name>{NAME_PATTERN})?(?:@(?P<versions>[^+~]+))?(?P<variants>(?:[+~]{VARIANT_PATTERN})*)$"
)
_VARIANT = re.compile(rf"([+~])({VARIANT_PATTERN})")
_VERSION = re.compile(r"^\d+(\.\d+)*$")


def _upper_bound(version: str) -> str:
    """The first version above every release that starts with `version` (12.4 -> 12.5)."""
    parts = version.split(".")
    parts[-1] = str(int(parts[-1]) + 1)
    return ".".join(parts)


def version_range(text: str) -> SpecifierSet:
    """Turn a Spack range or packaging specifiers into a SpecifierSet."""
    text = text.strip()
    if text and text[0] in "<>=!~":
        try:
            return SpecifierSet(text)
        except InvalidSpecifier as exc:
            raise SpecError(f"'{text}' is not a version range: {exc}") from None
    low, sep, high = text.partition(":")
    for part in (low, high):
        if part and not _VERSION.match(part):
            raise SpecError(
                f"'{text}' is not a version range; write e.g. 12.4, 12.4:, :12.4, 12.1:12.4 or >=12.1,<13"
            )
    if not sep:
        return SpecifierSet(f"=={low}.*") if low else SpecifierSet()
    specifiers = []
    if low:
        specifiers.append(f">={low}")
    if high:
        specifiers.append(f"<{_upper_bound(high)}")
    return SpecifierSet(",".join(specifiers))


def parse_version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise SpecError(f"'{text}' is not a version number") from None


@dataclass(frozen=True)
class Spec:
    """A constraint on one package: name (may be empty inside a recipe's `when`), versions, variants."""

    name: str = ""
    versions: SpecifierSet = field(default_factory=SpecifierSet)
    variants: tuple[tuple[str, bool], ...] = ()
    text: str = ""

    @property
    def variant_map(self) -> dict[str, bool]:
        return dict(self.variants)

    def matches(self, version: str, variants: dict[str, bool]) -> bool:
        """Whether a package at `version` with `variants` satisfies this spec (name not compared)."""
        if self.versions and not self.versions.contains(Version(version), prereleases=True):
            return False
        return all(variants.get(name) == wanted for name, wanted in self.variants)

    def __str__(self) -> str:
        return self.text or self.name


def parse_spec(text: str, allow_anonymous: bool = False) -> Spec:
    """Parse ``name@range+var~var``; with `allow_anonymous` the name may be left out (``+cuda``)."""
    compact = "".join(text.split())
    match = _SPEC.match(compact)
    if not match or not compact:
        raise SpecError(f"'{text}' is not a spec; write e.g. cuda@12.4, openmpi@4.1+cuda or pytorch~cuda")
    name = match.group("name") or ""
    if not name and not allow_anonymous:
        raise SpecError(f"'{text}' names no package; write e.g. cuda@12.4")
    variants: dict[str, bool] = {}
    for sign, variant in _VARIANT.findall(match.group("variants") or ""):
        if variant in variants and variants[variant] != (sign == "+"):
            raise SpecError(f"'{text}' asks for both +{variant} and ~{variant}")
        variants[variant] = sign == "+"
    versions = version_range(match.group("versions")) if match.group("versions") else SpecifierSet()
    return Spec(name, versions, tuple(sorted(variants.items())), compact)


@dataclass(frozen=True)
class Request:
    """What a user asked the resolver for: package specs and chosen providers of virtual packages."""

    specs: tuple[Spec, ...]
    providers: tuple[tuple[str, str], ...]  # (virtual, provider), e.g. ("mpi", "openmpi")

    @property
    def provider_map(self) -> dict[str, str]:
        return dict(self.providers)


def parse_request(items: list[str]) -> Request:
    """Parse command-line words such as ``cuda@12.4 pytorch@2.5 mpi=openmpi``."""
    specs: list[Spec] = []
    providers: dict[str, str] = {}
    for item in items:
        if "=" in item and not item.lstrip().startswith(("@", "=")) and "@" not in item.split("=")[0]:
            virtual, _, provider = item.partition("=")
            if name_problem(virtual) or name_problem(provider):
                raise SpecError(f"'{item}' is not a provider choice; write e.g. mpi=openmpi")
            providers[virtual] = provider
        else:
            specs.append(parse_spec(item))
    if not specs and not providers:
        raise SpecError("nothing to resolve; name packages, e.g. cuda@12.4 pytorch@2.5 mpi=openmpi")
    return Request(tuple(specs), tuple(sorted(providers.items())))


def parse_constraint(text: str) -> list[SpecifierSet]:
    """A table constraint: specifier sets joined by ``||`` (any one may hold)."""
    try:
        return [SpecifierSet(part.strip()) for part in text.split("||")]
    except InvalidSpecifier as exc:
        raise SpecError(f"'{text}' is not a version constraint: {exc}") from None


def satisfies_any(version: str, alternatives: list[SpecifierSet]) -> bool:
    parsed = Version(version)
    return any(alternative.contains(parsed, prereleases=True) for alternative in alternatives)
