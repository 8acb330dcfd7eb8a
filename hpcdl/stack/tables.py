"""Compatibility tables (YAML under ``hpcdl/stack/tables/``), each naming its source.

Constraints in the tables are `packaging` specifier sets; ``||`` joins alternatives.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from hpcdl.stack.spec import SpecError, parse_constraint, satisfies_any
from hpcdl.stack.yamlfile import LineDict, StackFileError, load_yaml

TABLES_DIR = Path(__file__).parent / "tables"


def major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


@dataclass(frozen=True)
class TorchRelease:
    torch: str
    cuda_variants: tuple[str, ...] | None  # None: variants not recorded; only default_cuda is known
    default_cuda: str
    cudnn: str
    nccl: str
    requires_python: SpecifierSet
    wheels_python: tuple[str, ...]  # CPython X.Y with a Linux x86_64 wheel on PyPI

    @property
    def known_cuda(self) -> tuple[str, ...]:
        return self.cuda_variants if self.cuda_variants is not None else (self.default_cuda,)


@dataclass(frozen=True)
class Tables:
    cuda_driver: dict[str, str]  # toolkit release -> minimum driver
    minor_compat: dict[str, str]  # CUDA major -> minimum driver under minor-version compatibility
    cudnn_cuda: dict[str, list[SpecifierSet]]  # cuDNN X.Y.Z -> CUDA constraint
    nccl_cuda: dict[str, list[SpecifierSet]]
    torch: dict[str, TorchRelease]
    mpi_cuda: dict[str, dict[str, str]]
    providers: dict[str, list[str]]
    sources: dict[str, str]  # table name -> its source

    def min_driver(self, cuda: str) -> str | None:
        """Minimum driver for a toolkit release; unknown update levels take their minor's highest minimum."""
        if cuda in self.cuda_driver:
            return self.cuda_driver[cuda]
        same_minor = [d for c, d in self.cuda_driver.items() if major_minor(c) == major_minor(cuda)]
        return max(same_minor, key=Version) if same_minor else None

    def newest_cuda_for_driver(self, driver: str) -> str | None:
        fitting = [c for c, d in self.cuda_driver.items() if Version(d) <= Version(driver)]
        return max(fitting, key=Version) if fitting else None

    def cudnn_supports(self, cudnn: str, cuda: str) -> bool | None:
        """Whether cuDNN `cudnn` (e.g. 9.1.0.70) supports toolkit `cuda`; None when the table has no row."""
        row = self.cudnn_cuda.get(".".join(cudnn.split(".")[:3]))
        return None if row is None else satisfies_any(cuda, row)

    def nccl_supports(self, nccl: str, cuda: str) -> bool | None:
        row = self.nccl_cuda.get(".".join(nccl.split(".")[:3]))
        return None if row is None else satisfies_any(cuda, row)

    def torch_release(self, torch: str) -> TorchRelease | None:
        base = torch.split("+")[0]
        return self.torch.get(base) or next(
            (r for v, r in self.torch.items() if major_minor(v) == major_minor(base)), None
        )


def _rows(doc: LineDict, key: str, path: Path, fields: tuple[str, ...]) -> list[LineDict]:
    rows = doc.get(key)
    if not isinstance(rows, list):
        raise StackFileError(f"{path}:{doc.line}: missing list '{key}'")
    for row in rows:
        missing = [f for f in fields if not isinstance(row, dict) or f not in row]
        if missing:
            line = row.line if isinstance(row, LineDict) else doc.line_of(key)
            raise StackFileError(f"{path}:{line}: row needs {', '.join(missing)}")
    return rows


def _constraint(row: LineDict, key: str, path: Path) -> list[SpecifierSet]:
    try:
        return parse_constraint(str(row[key]))
    except SpecError as exc:
        raise StackFileError(f"{path}:{row.line_of(key)}: {exc}") from None


def _load(name: str, directory: Path) -> tuple[LineDict, Path]:
    path = directory / f"{name}.yaml"
    doc = load_yaml(path)
    if not isinstance(doc, LineDict) or not isinstance(doc.get("source"), str):
        raise StackFileError(f"{path}:1: a table is a mapping that names its 'source'")
    return doc, path


def load_tables(directory: Path = TABLES_DIR) -> Tables:
    sources: dict[str, str] = {}
    docs: dict[str, tuple[Any, Path]] = {}
    for name in ("cuda_driver", "cudnn_cuda", "nccl_cuda", "pytorch", "mpi_cuda", "preferences"):
        docs[name] = _load(name, directory)
        sources[name] = " ".join(docs[name][0]["source"].split())
    doc, path = docs["cuda_driver"]
    cuda_driver = {
        str(r["cuda"]): str(r["min_driver"]) for r in _rows(doc, "releases", path, ("cuda", "min_driver"))
    }
    minor = {
        str(r["cuda_major"]): str(r["min_driver"])
        for r in _rows(doc, "minor_version_compatibility", path, ("cuda_major", "min_driver"))
    }
    doc, path = docs["cudnn_cuda"]
    cudnn = {
        str(r["cudnn"]): _constraint(r, "cuda", path) for r in _rows(doc, "releases", path, ("cudnn", "cuda"))
    }
    doc, path = docs["nccl_cuda"]
    nccl = {
        str(r["nccl"]): _constraint(r, "cuda", path) for r in _rows(doc, "releases", path, ("nccl", "cuda"))
    }
    doc, path = docs["pytorch"]
    torch = {}
    fields = ("torch", "cuda_variants", "default_cuda", "cudnn", "nccl", "requires_python", "wheels_python")
    for r in _rows(doc, "releases", path, fields):
        variants = tuple(str(v) for v in r["cuda_variants"]) if r["cuda_variants"] is not None else None
        torch[str(r["torch"])] = TorchRelease(
            str(r["torch"]),
            variants,
            str(r["default_cuda"]),
            str(r["cudnn"]),
            str(r["nccl"]),
            _constraint(r, "requires_python", path)[0],
            tuple(str(v) for v in r["wheels_python"]),
        )
    doc, _ = docs["mpi_cuda"]
    mpi_cuda = {str(k): {str(a): str(b) for a, b in v.items()} for k, v in doc["implementations"].items()}
    doc, _ = docs["preferences"]
    providers = {str(k): [str(p) for p in v] for k, v in doc["providers"].items()}
    return Tables(cuda_driver, minor, cudnn, nccl, torch, mpi_cuda, providers, sources)


@functools.lru_cache(maxsize=1)
def builtin_tables() -> Tables:
    return load_tables()
