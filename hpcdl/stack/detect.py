"""What this machine has: NVIDIA driver, CUDA toolkits, cuDNN, NCCL, MPI implementations, mpi4py, PyTorch,
hpcdl's compiled runtime and the loaded modules. Every probe has a timeout and never raises."""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpcdl.common.build import built

PROBE_TIMEOUT_S = 30.0
_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class Found:
    """One installed thing: its version, where it is, and how it was recognised."""

    name: str
    version: str
    path: str
    how: str
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Detection:
    python: str
    driver: str | None
    gpus: list[str]
    cuda_toolkits: list[Found]
    cudnn: list[Found]
    nccl: list[Found]
    mpis: list[Found]
    default_mpirun: Found | None  # what a bare `mpirun` on PATH runs
    mpi4py: Found | None
    torch: Found | None
    hpcdl: dict
    loaded_modules: list[str]
    problems: list[str]  # probes that failed in a way the user should know about

    def to_dict(self) -> dict:
        return asdict(self)


def run_probe(command: list[str], timeout: float = PROBE_TIMEOUT_S, env: dict | None = None) -> str | None:
    """stdout+stderr of `command`, or None when it is missing, fails, or passes `timeout` seconds."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout + done.stderr if done.returncode == 0 else None


def detect_driver() -> tuple[str | None, list[str]]:
    """The NVIDIA driver version (nvidia-smi, else /proc/driver/nvidia/version) and the GPU names."""
    out = run_probe(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"])
    if out:
        rows = [line.split(",", 1) for line in out.strip().splitlines() if "," in line]
        if rows:
            return rows[0][0].strip(), [r[1].strip() for r in rows]
    proc = Path("/proc/driver/nvidia/version")
    if proc.is_file():
        match = re.search(r"Kernel Module\s+(\d+\.\d+(?:\.\d+)?)", proc.read_text(errors="replace"))
        if match:
            return match.group(1), []
    return None, []


def _cuda_roots() -> list[Path]:
    roots = [os.environ.get(v, "") for v in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parent.parent))
    roots += [*sorted(glob.glob("/usr/local/cuda*")), "/opt/cuda", "/usr/lib/cuda"]
    seen, result = set(), []
    for root in roots:
        if root and Path(root).is_dir() and Path(root).resolve() not in seen:
            seen.add(Path(root).resolve())
            result.append(Path(root).resolve())
    return result


def _cuda_version(root: Path) -> tuple[str, str] | None:
    version_json = root / "version.json"
    if version_json.is_file():
        try:
            return json.loads(version_json.read_text())["cuda"]["version"], "version.json"
        except (ValueError, KeyError):
            pass
    nvcc = root / "bin" / "nvcc"
    out = run_probe([str(nvcc), "--version"]) if nvcc.is_file() else None
    match = re.search(r"release \d+\.\d+, V(\d+\.\d+\.\d+)", out or "")
    if match:
        return match.group(1), "nvcc --version"
    header = root / "include" / "cuda_runtime_api.h"
    if header.is_file():
        match = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", header.read_text(errors="replace"))
        if match:
            number = int(match.group(1))
            return f"{number // 1000}.{number % 1000 // 10}", "CUDART_VERSION in cuda_runtime_api.h"
    return None


def _include_dirs() -> list[Path]:
    dirs = [root / "include" for root in _cuda_roots()]
    for var in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH"):
        dirs += [Path(p) for p in os.environ.get(var, "").split(os.pathsep) if p]
    for var in ("CUDNN_HOME", "NCCL_HOME", "HPCDL_NCCL_HOME"):
        if os.environ.get(var):
            dirs.append(Path(os.environ[var]) / "include")
    dirs += [Path("/usr/include"), Path("/usr/include/x86_64-linux-gnu"), Path("/usr/local/include")]
    return list(dict.fromkeys(d for d in dirs if d.is_dir()))


def _header_library(name: str, header: str, macros: tuple[str, str, str], lib: str) -> list[Found]:
    found = []
    for directory in _include_dirs():
        path = directory / header
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        parts = [re.search(rf"#define\s+{m}\s+(\d+)", text) for m in macros]
        if not all(parts):
            continue
        version = ".".join(p.group(1) for p in parts)  # type: ignore[union-attr]
        libs = sorted(
            str(p)
            for d in (directory.parent / "lib", directory.parent / "lib64", Path("/usr/lib/x86_64-linux-gnu"))
            for p in d.glob(f"{lib}.so*")
        )
        found.append(Found(name, version, str(path), f"{' '.join(macros)} in {header}", {"libraries": libs}))
    return found


def _classify_mpi(output: str) -> tuple[str, str] | None:
    if "Open MPI" in output or "OpenRTE" in output:
        match = re.search(r"\(Open(?:RTE| MPI)\) (\d+\.\d+\.\d+)", output) or _VERSION.search(output)
        return "openmpi", match.group(1) if match else ""
    if "HYDRA" in output:
        match = re.search(r"Version:\s+(\S+)", output)
        return "mpich", match.group(1) if match else ""
    if "Intel(R) MPI" in output:
        match = _VERSION.search(output)
        return "intel-mpi", match.group(1) if match else ""
    return None


def _openmpi_cuda() -> bool | None:
    out = run_probe(["ompi_info", "--parsable", "--all"])
    match = re.search(r"mpi_built_with_cuda_support:value:(\w+)", out or "")
    return None if not match else match.group(1) == "true"


def _mpich_info() -> dict:
    out = run_probe(["mpichversion"]) or ""
    configure = re.search(r"MPICH configure:\s*(.*)", out)
    device = re.search(r"MPICH Device:\s*(\S+)", out)
    return {
        "device": device.group(1) if device else "",
        "cuda_aware": ("--with-cuda" in configure.group(1)) if configure else None,
    }


_LAUNCHERS = (
    "mpirun.openmpi",
    "mpiexec.openmpi",
    "mpiexec.mpich",
    "mpirun.mpich",
    "mpiexec.hydra",
    "mpirun",
    "mpiexec",
)


def _mpis() -> tuple[list[Found], Found | None]:
    found: dict[str, Found] = {}
    default = None
    for launcher in _LAUNCHERS:
        path = shutil.which(launcher)
        if not path:
            continue
        out = run_probe([path, "--version"])
        kind = _classify_mpi(out or "")
        if kind is None:
            continue
        name, version = kind
        if launcher == "mpirun":
            default = Found(
                name, version, path, f"{launcher} --version", {"resolves_to": str(Path(path).resolve())}
            )
        if name not in found:
            detail: dict = {}
            if name == "openmpi":
                detail["cuda_aware"] = _openmpi_cuda()
            elif name == "mpich":
                detail.update(_mpich_info())
            found[name] = Found(name, version, path, f"{Path(path).name} --version", detail)
    return list(found.values()), default


_MPI4PY_PROBE = """
import json, mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
print(json.dumps({"version": mpi4py.__version__, "library": MPI.Get_library_version(),
                  "config": {k: str(v) for k, v in mpi4py.get_config().items()}, "path": mpi4py.__file__}))
"""

_TORCH_PROBE = """
import json, torch
info = {"version": torch.__version__, "cuda": torch.version.cuda, "path": torch.__file__,
        "cudnn": None, "nccl": None, "cuda_available": False}
try:
    v = torch.backends.cudnn.version()
    if v:
        info["cudnn"] = f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 10000 else str(v)
except Exception:
    pass
try:
    import torch.distributed as dist
    if dist.is_available() and dist.is_nccl_available():
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception:
    pass
info["cuda_available"] = bool(torch.cuda.is_available())
print(json.dumps(info))
"""


def _python_probe(script: str) -> dict | None:
    out = run_probe([sys.executable, "-c", script], timeout=120.0)
    if not out:
        return None
    for line in reversed(out.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def _mpi4py() -> Found | None:
    info = _python_probe(_MPI4PY_PROBE)
    if info is None:
        return None
    kind = _classify_mpi(info["library"].replace("MPICH Version:", "HYDRA Version:"))
    name, version = kind if kind else ("unknown", "")
    detail = {
        "mpi": name,
        "mpi_version": version,
        "library": info["library"].replace("\x00", "").strip().splitlines()[0],
        "mpicc": info["config"].get("mpicc", ""),
    }
    return Found("mpi4py", info["version"], info["path"], "import mpi4py; MPI.Get_library_version()", detail)


def _torch() -> Found | None:
    info = _python_probe(_TORCH_PROBE)
    if info is None:
        return None
    detail = {k: info[k] for k in ("cuda", "cudnn", "nccl", "cuda_available")}
    return Found("torch", info["version"], info["path"], "import torch", detail)


def _hpcdl() -> dict:
    try:
        runtime = built()
    except Exception as exc:  # a runtime that does not match its Python side is a finding, not a crash
        return {
            "version": "",
            "library": "",
            "loaded": False,
            "load_error": f"{type(exc).__name__}: {exc}",
            "features": {},
            "mpi": False,
            "mpi_detail": "",
            "mpi_reason": "",
        }
    return {
        "version": runtime.version,
        "library": runtime.library,
        "loaded": runtime.loaded,
        "load_error": runtime.load_error,
        "features": {cap.name: cap.available for cap in (runtime.shm, runtime.tcp, runtime.mpi)},
        "mpi": runtime.mpi.available,
        "mpi_detail": runtime.mpi.detail,
        "mpi_reason": runtime.mpi.reason,
    }


def detect() -> Detection:
    driver, gpus = detect_driver()
    toolkits = []
    for root in _cuda_roots():
        version = _cuda_version(root) if (root / "include" / "cuda_runtime_api.h").is_file() else None
        if version:
            toolkits.append(Found("cuda", version[0], str(root), version[1]))
    mpis, default = _mpis()
    problems = []
    if shutil.which("nvidia-smi") and driver is None:
        problems.append("nvidia-smi is installed but did not answer (driver not loaded?)")
    return Detection(
        python=platform.python_version(),
        driver=driver,
        gpus=gpus,
        cuda_toolkits=toolkits,
        cudnn=_header_library(
            "cudnn", "cudnn_version.h", ("CUDNN_MAJOR", "CUDNN_MINOR", "CUDNN_PATCHLEVEL"), "libcudnn"
        ),
        nccl=_header_library("nccl", "nccl.h", ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"), "libnccl"),
        mpis=mpis,
        default_mpirun=default,
        mpi4py=_mpi4py(),
        torch=_torch(),
        hpcdl=_hpcdl(),
        loaded_modules=[m for m in os.environ.get("LOADEDMODULES", "").split(":") if m],
        problems=problems,
    )
