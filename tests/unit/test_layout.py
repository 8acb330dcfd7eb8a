"""The house's layout (``design.md``): no import runs up the floors, no two modules import each other, and
a platform's facts are written in its own modules only.

Read from the source (``ast``), so nothing is imported: every ``import`` statement counts for the floors,
including those inside functions; a cycle counts the imports a module runs when it is loaded (those at
module level, ``if TYPE_CHECKING:`` blocks included), since an import inside a function is how a module
reaches one that loads after it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hpcdl import platforms

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hpcdl", "benchmarks")

# Rooms by floor: a module may import its own room and the rooms of its floor or below, except the arrows
# in FORBIDDEN. The longest prefix names a module's room.
FLOORS: dict[str, int] = {
    "hpcdl": 0,  # the package itself: its version only
    "hpcdl._version": 0,
    "hpcdl.errors": 0,
    "hpcdl.jobenv": 0,
    "hpcdl.platforms": 0,
    "hpcdl.common": 1,
    "hpcdl.diagnosis": 1,
    "hpcdl.checkpoint": 2,
    "hpcdl.torch": 2,
    "hpcdl.tensorflow": 2,
    "hpcdl._keras": 2,
    "hpcdl.keras": 2,
    "hpcdl.runner": 2,
    "hpcdl.schedulers": 2,
    "hpcdl.stack": 2,
    "hpcdl.modules": 2,
    "hpcdl.scaling": 3,
    "hpcdl.cli": 4,
    "hpcdl.__main__": 4,
    "benchmarks": 4,
}
_FRAMEWORKS = ("hpcdl.torch", "hpcdl.tensorflow", "hpcdl._keras", "hpcdl.keras")
_TOOLS = ("hpcdl.runner", "hpcdl.schedulers", "hpcdl.stack", "hpcdl.modules", "hpcdl.scaling", "hpcdl.cli")
FORBIDDEN: set[tuple[str, str]] = {
    *((framework, tool) for framework in _FRAMEWORKS for tool in _TOOLS),  # a framework API uses common only
    ("hpcdl.tensorflow", "hpcdl.torch"),  # TensorFlow's path never imports torch
    ("hpcdl._keras", "hpcdl.torch"),
    ("hpcdl.runner", "hpcdl.schedulers"),  # the runner renders no batch script
    ("hpcdl.schedulers", "hpcdl.runner"),  # a scheduler backend launches no ranks itself
    ("benchmarks", "hpcdl.cli"),  # nothing outside cli imports cli
}


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    loaded: bool  # run when the module loads (not inside a function)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _module_of(name: str) -> str:
    """The module a dotted name lives in (a name imported from a package is the package's)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _in_functions(tree: ast.Module) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside |= {id(child) for child in ast.walk(node) if child is not node}
    return inside


def _imports(module: str) -> Iterator[Import]:
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    lazy = _in_functions(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            target = _module_of(name) if name.split(".")[0] in PACKAGES else ""
            # Importing a module imports the packages above it: that is Python's doing, not an arrow.
            if target and target != module and not module.startswith(target + "."):
                yield Import(module, target, node.lineno, id(node) not in lazy)


IMPORTS = [imp for module in MODULES for imp in _imports(module)]


def _room(module: str) -> str:
    return max((room for room in FLOORS if module == room or module.startswith(room + ".")), key=len)


def test_every_module_has_a_room() -> None:
    assert [m for m in MODULES if not any(m == r or m.startswith(r + ".") for r in FLOORS)] == []


def test_no_import_runs_up_the_floors_or_across_a_forbidden_arrow() -> None:
    wrong = []
    for imp in IMPORTS:
        source, target = _room(imp.source), _room(imp.target)
        if source == target:
            continue
        if FLOORS[target] > FLOORS[source] or (source, target) in FORBIDDEN:
            wrong.append(f"{MODULES[imp.source].relative_to(ROOT)}:{imp.line} imports {imp.target}")
    assert wrong == []


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges.get(successor, ())))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_two_modules_import_each_other_when_they_load() -> None:
    edges: dict[str, set[str]] = {}
    for imp in IMPORTS:
        if imp.loaded:
            edges.setdefault(imp.source, set()).add(imp.target)
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _words(platform: platforms.Platform) -> set[str]:
    """What only the platform's modules may write: its name, its launchers' programs and its variables."""
    words = {platform.name, *platform.job_id_variables, *platform.job_tag_variables}
    words |= {launcher.program for launcher in platform.launchers}
    for task in platform.tasks:
        words |= {v for v in (task.rank, task.size, task.local_rank, task.local_size) if v}
    return words


def _strings(path: Path) -> Iterator[tuple[int, str]]:
    """The string constants of a file, docstrings left out (prose may name any platform)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_a_schedulers_facts_are_written_in_its_own_modules_only() -> None:
    """Its name, its launchers and its variables appear as strings only in ``hpcdl/platforms/NAME.py`` and
    its backend (variables a scheduler shares with another, such as PMI_SIZE, are read from the module that
    writes them)."""
    shared = {ROOT / "hpcdl" / "platforms" / "__init__.py", ROOT / "hpcdl" / "platforms" / "base.py"}
    # Words of the launchers that are no scheduler (PMI_SIZE), and mpiexec, the launcher of every MPI.
    common = {"mpiexec"}.union(*(_words(p) for p in platforms.platforms() if not p.scheduler))
    owners: dict[str, set[Path]] = {}
    for platform in platforms.platforms():
        if not platform.scheduler:
            continue
        own = {ROOT / "hpcdl" / "platforms" / f"{platform.name}.py"}
        own.add(ROOT / (platform.scheduler.partition(":")[0].replace(".", "/") + ".py"))
        for word in _words(platform) - common:
            owners.setdefault(word, set()).update(own)
    wrong = []
    for path in sorted((ROOT / "hpcdl").rglob("*.py")):
        if path in shared:
            continue
        for line, text in _strings(path):
            for word, own in owners.items():
                if path not in own and re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text):
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {word!r}")
    assert wrong == []
