"""Pick one consistent set of package versions for a request, newest first, explaining every rejection.

A backtracking search over the recipes' versions: requested specs first, then dependencies (a recipe's
`depends_on` whose `when` holds). A candidate is rejected when it breaks a requested range, a recipe
conflict, or a compatibility table (CUDA <-> driver, cuDNN/NCCL <-> CUDA, PyTorch <-> CUDA variants and
Python). When nothing fits, the error lists which constraints rejected which versions.
"""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass, field

from packaging.version import Version

from hpcdl.common.exceptions import HpcdlError
from hpcdl.stack.recipe import Recipe, virtual_providers
from hpcdl.stack.spec import Request, Spec
from hpcdl.stack.tables import Tables, major_minor


class ResolveError(HpcdlError):
    """No consistent set exists; the message says which constraints conflict."""


@dataclass(frozen=True)
class Node:
    """One chosen package."""

    name: str
    version: str
    variants: tuple[tuple[str, bool], ...] = ()

    @property
    def variant_map(self) -> dict[str, bool]:
        return dict(self.variants)

    def has(self, variant: str) -> bool:
        return self.variant_map.get(variant, False)

    def label(self) -> str:
        flags = "".join(("+" if on else "~") + name for name, on in self.variants)
        return f"{self.name}@{self.version}{flags}"


@dataclass(frozen=True)
class _Requirement:
    spec: Spec
    origin: str  # "request" or the package that depends on it


@dataclass
class Solution:
    """A consistent stack: packages in build order (dependencies first) with their dependency names."""

    nodes: list[Node]
    depends_on: dict[str, list[str]]
    request: list[str]
    driver: str | None
    python: str
    notes: list[str] = field(default_factory=list)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def hashes(self) -> dict[str, str]:
        """A short content hash per package: name, version, variants and its dependencies' hashes."""
        result: dict[str, str] = {}
        for node in self.nodes:  # dependencies come first
            text = node.label() + "|" + ",".join(result[d] for d in sorted(self.depends_on[node.name]))
            result[node.name] = hashlib.sha256(text.encode()).hexdigest()[:7]
        return result


@dataclass
class _State:
    chosen: dict[str, Node]
    virtuals: dict[str, str]
    edges: dict[str, set[str]]


class Resolver:
    def __init__(
        self, recipes: dict[str, Recipe], tables: Tables, driver: str | None = None, python: str | None = None
    ):
        self.recipes = recipes
        self.tables = tables
        self.driver = driver
        self.python = python or platform.python_version()
        self.providers = virtual_providers(recipes)
        self.rejections: dict[tuple[str, str], list[str]] = {}  # (package, reason) -> versions

    # -- public ---------------------------------------------------------------------------------------
    def resolve(self, request: Request) -> Solution:
        self._validate(request)
        self.request = request
        self.auto_on = {s.name for s in request.specs} | {
            variant for s in request.specs for variant, on in s.variants if on
        }
        pending = tuple(_Requirement(s, "request") for s in request.specs)
        pending += tuple(_Requirement(Spec(v), "request") for v, _ in request.providers)
        state = self._solve(_State({}, {}, {}), pending)
        if state is None:
            raise ResolveError(self._explain(request))
        return self._solution(state, request)

    def _validate(self, request: Request) -> None:
        known = sorted(set(self.recipes) | set(self.providers))
        for spec in request.specs:
            if spec.name not in known:
                raise ResolveError(
                    f"no recipe named '{spec.name}'; known: {', '.join(known)} (add one with --recipes DIR)"
                )
        for virtual, provider in request.providers:
            if virtual not in self.providers:
                raise ResolveError(
                    f"'{virtual}' is not a virtual package; "
                    f"virtual packages: {', '.join(sorted(self.providers))}"
                )
            if provider not in self.providers[virtual]:
                choices = ", ".join(self.providers[virtual])
                raise ResolveError(f"'{provider}' does not provide {virtual}; choose one of: {choices}")

    # -- search ---------------------------------------------------------------------------------------
    def _solve(self, state: _State, pending: tuple[_Requirement, ...]) -> _State | None:
        if not pending:
            return state
        req, rest = pending[0], pending[1:]
        if req.spec.name in self.providers:
            for provider in self._provider_order(req.spec.name, state):
                concrete = Spec(provider, req.spec.versions, req.spec.variants, req.spec.text)
                virtuals = {**state.virtuals, req.spec.name: provider}
                edges = self._with_edge(state.edges, req.origin, provider)
                found = self._solve(
                    _State(state.chosen, virtuals, edges), (_Requirement(concrete, req.origin), *rest)
                )
                if found is not None:
                    return found
            return None
        name = req.spec.name
        edges = self._with_edge(state.edges, req.origin, name)
        if name in state.chosen:
            node = state.chosen[name]
            if req.spec.matches(node.version, node.variant_map):
                return self._solve(_State(state.chosen, state.virtuals, edges), rest)
            self._reject(
                name, node.version, f"{req.spec} (needed by {req.origin}) does not match {node.label()}"
            )
            return None
        same = [r for r in pending if r.spec.name == name]
        variants = self._variants(self.recipes[name], same)
        if variants is None:
            return None
        matched = False
        for version in self._candidates(name, state.chosen):
            node = Node(name, version, variants)
            unmet = next((r for r in same if not r.spec.matches(node.version, node.variant_map)), None)
            if unmet is not None:
                continue
            matched = True
            reason = self._incompatible(node, state.chosen)
            if reason:
                self._reject(name, node.version, reason)
                continue
            chosen = {**state.chosen, name: node}
            deps = tuple(
                _Requirement(dep.spec, name)
                for dep in self.recipes[name].depends_on
                if dep.when is None or dep.when.matches(node.version, node.variant_map)
            )
            found = self._solve(
                _State(chosen, state.virtuals, {**edges, name: edges.get(name, set())}), rest + deps
            )
            if found is not None:
                return found
        if not matched:
            wanted = " and ".join(f"{r.spec} (from {r.origin})" for r in same)
            known = ", ".join(v.version for v in self.recipes[name].versions)
            self._reject(name, "-", f"no {name} version matches {wanted}; recipes know {known}")
        return None

    def _candidates(self, name: str, chosen: dict[str, Node]) -> list[str]:
        """Versions newest first; cuDNN and NCCL try the release a chosen CUDA PyTorch bundles first."""
        versions = [v.version for v in self.recipes[name].versions]
        torch = chosen.get("pytorch")
        release = self.tables.torch_release(torch.version) if torch and torch.has("cuda") else None
        pinned = {"cudnn": release.cudnn, "nccl": release.nccl}.get(name) if release else None
        if pinned:
            versions.sort(key=lambda v: not pinned.startswith(v) and not v.startswith(pinned))
        return versions

    def _variants(
        self, recipe: Recipe, requirements: list[_Requirement]
    ) -> tuple[tuple[str, bool], ...] | None:
        values: dict[str, bool] = {}
        for variant in recipe.variants:
            values[variant.name] = (
                variant.name in self.auto_on if variant.default == "auto" else bool(variant.default)
            )
        fixed: dict[str, _Requirement] = {}
        for req in requirements:
            for variant, on in req.spec.variants:
                if recipe.variant(variant) is None:
                    self._reject(
                        recipe.name,
                        "-",
                        f"{req.spec} (from {req.origin}): {recipe.name} has no variant '{variant}'",
                    )
                    return None
                if variant in fixed and values[variant] != on:
                    other = fixed[variant]
                    self._reject(
                        recipe.name,
                        "-",
                        f"{other.spec} (from {other.origin}) and {req.spec} (from {req.origin}) "
                        f"disagree on {variant}",
                    )
                    return None
                values[variant], fixed[variant] = on, req
        return tuple(sorted(values.items()))

    def _provider_order(self, virtual: str, state: _State) -> list[str]:
        if virtual in state.virtuals:
            return [state.virtuals[virtual]]
        if virtual in self.request.provider_map:
            return [self.request.provider_map[virtual]]
        preferred = self.tables.providers.get(virtual, [])
        available = self.providers[virtual]
        return [p for p in preferred if p in available] + sorted(p for p in available if p not in preferred)

    @staticmethod
    def _with_edge(edges: dict[str, set[str]], origin: str, name: str) -> dict[str, set[str]]:
        if origin == "request":
            return edges
        return {**edges, origin: edges.get(origin, set()) | {name}}

    def _reject(self, package: str, version: str, reason: str) -> None:
        versions = self.rejections.setdefault((package, reason), [])
        if version not in versions:
            versions.append(version)

    # -- compatibility ------------------------------------------------------------------------------------
    def _incompatible(self, node: Node, chosen: dict[str, Node]) -> str:
        reason = self._alone(node)
        if reason:
            return reason
        for other in chosen.values():
            reason = self._conflict(node, other) or self._conflict(other, node) or self._pair(node, other)
            if reason:
                return reason
        return ""

    def _conflict(self, owner: Node, other: Node) -> str:
        """A recipe conflict of `owner` triggered by `other` (or by `owner` itself)."""
        for conflict in self.recipes[owner.name].conflicts:
            if conflict.when and not conflict.when.matches(owner.version, owner.variant_map):
                continue
            target = owner if not conflict.spec.name else other
            if conflict.spec.name and conflict.spec.name != other.name:
                continue
            if conflict.spec.matches(target.version, target.variant_map):
                return f"{owner.label()} conflicts with {target.label()}: {conflict.message}"
        return ""

    def _alone(self, node: Node) -> str:
        t = self.tables
        if node.name == "cuda" and self.driver:
            needed = t.min_driver(node.version)
            if needed is None:
                return f"CUDA {node.version} has no minimum driver in tables/cuda_driver.yaml"
            if Version(needed) > Version(self.driver):
                return (
                    f"CUDA {node.version} needs driver >= {needed}; this driver is {self.driver} "
                    "(tables/cuda_driver.yaml)"
                )
        if node.name == "pytorch":
            release = t.torch_release(node.version)
            if release is None:
                return f"torch {node.version} has no row in tables/pytorch.yaml"
            wheels = f"wheels for Python {', '.join(release.wheels_python)} (PyPI, Linux x86_64)"
            if not release.requires_python.contains(Version(self.python), prereleases=True):
                return (
                    f"torch {node.version} requires Python {release.requires_python} and has {wheels}; "
                    f"this Python is {self.python}"
                )
            if major_minor(self.python) not in release.wheels_python:
                return (
                    f"torch {node.version} has {wheels}, none for Python {major_minor(self.python)} "
                    f"(tables/pytorch.yaml); this Python is {self.python}"
                )
        return ""

    def _pair(self, a: Node, b: Node) -> str:
        pair = {a.name: a, b.name: b}
        cuda = pair.get("cuda")
        if cuda is None:
            return ""
        t = self.tables
        if "pytorch" in pair and pair["pytorch"].has("cuda"):
            release = t.torch_release(pair["pytorch"].version)
            if release and major_minor(cuda.version) not in release.known_cuda:
                return (
                    f"torch {release.torch} has CUDA wheels for {', '.join(release.known_cuda)}, "
                    f"not for CUDA {major_minor(cuda.version)} (tables/pytorch.yaml)"
                )
        for lib, supports in (("cudnn", t.cudnn_supports), ("nccl", t.nccl_supports)):
            if lib in pair:
                ok = supports(pair[lib].version, cuda.version)
                if ok is None:
                    return f"{lib} {pair[lib].version} has no row in tables/{lib}_cuda.yaml"
                if not ok:
                    return (
                        f"{lib} {pair[lib].version} does not support CUDA {cuda.version} "
                        f"(tables/{lib}_cuda.yaml)"
                    )
        return ""

    # -- results --------------------------------------------------------------------------------------
    def _explain(self, request: Request) -> str:
        asked = " ".join([str(s) for s in request.specs] + [f"{v}={p}" for v, p in request.providers])
        lines = [f"no consistent stack for: {asked}", "these constraints rejected every candidate:"]
        for (package, reason), versions in self.rejections.items():
            shown = ", ".join(v for v in versions if v != "-")
            lines.append(f"  {package}{' ' + shown if shown else ''}: {reason}")
        if self.driver:
            newest = self.tables.newest_cuda_for_driver(self.driver)
            lines.append(f"the newest CUDA for driver {self.driver} is {newest or 'none in the table'}")
        lines.append(
            "relax a version (e.g. cuda@12 instead of cuda@12.8), or pass --driver and --python for another "
            "machine"
        )
        return "\n".join(lines)

    def _solution(self, state: _State, request: Request) -> Solution:
        depends = {name: sorted(state.edges.get(name, set())) for name in state.chosen}
        order: list[str] = []

        def visit(name: str) -> None:
            if name in order:
                return
            for dep in depends[name]:
                visit(dep)
            order.append(name)

        for name in state.chosen:
            visit(name)
        nodes = [state.chosen[n] for n in order]
        notes = self._notes(state.chosen)
        return Solution(
            nodes,
            depends,
            [str(s) for s in request.specs] + [f"{v}={p}" for v, p in request.providers],
            self.driver,
            self.python,
            notes,
        )

    def _notes(self, chosen: dict[str, Node]) -> list[str]:
        notes = []
        if "cuda" in chosen and not self.driver:
            notes.append(
                "no NVIDIA driver given or detected: CUDA was not limited by a driver (use --driver)"
            )
        torch = chosen.get("pytorch")
        if torch and torch.has("cuda"):
            release = self.tables.torch_release(torch.version)
            if release:
                notes.append(
                    f"torch {torch.version} wheels bundle cuDNN {release.cudnn} and NCCL {release.nccl} "
                    "(the default PyPI wheel's pins; hpcdl uses torch's NCCL)"
                )
                nccl = chosen.get("nccl")
                if nccl and major_minor(nccl.version) != major_minor(release.nccl):
                    notes.append(
                        f"the stack's NCCL {nccl.version} differs from torch's bundled NCCL {release.nccl}"
                    )
        return notes
