"""The check-build matrix (``hpcdl check-build``): what this installation can really do.

It answers at two depths. By default at once, from what is installed, without starting any framework
(TensorFlow alone takes seconds to import and logs as it starts): a framework is usable when its
distribution is installed for this interpreter and every package it requires is installed in a version it
accepts (what ``pip check`` checks), Keras also by the backend it is configured for; PyTorch's Gloo and NCCL
come from PyTorch's own record of how it was built (the compile definitions of its CMake targets, the CUDA
of its version file) and, for NCCL, whether a GPU is visible. ``deep=True`` (``--verbose``) also imports
each framework with hpcdl's API for it, each in a child process of its own, all at once, and a framework
that fails there is shown with its error. Controllers and CPU tensor operations come from the compiled
runtime (``hpcdl.common.built()``) in both.

A row is a function returning a ``Capability``; ``check_build`` lists them by section.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from hpcdl._version import __version__
from hpcdl.common.build import Capability, built

DEEP_PROBE_TIMEOUT_S = 300.0  # importing TensorFlow on a busy login node


@dataclass(frozen=True)
class Matrix:
    version: str
    library: str
    frameworks: list[Capability] = field(default_factory=list)
    controllers: list[Capability] = field(default_factory=list)
    tensor_operations: list[Capability] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# ---- what is installed ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Installed:
    """The distribution that provides an importable top-level module."""

    distribution: str
    version: str
    unmet: tuple[str, ...]  # its requirements that are missing or in a version it does not accept

    def label(self) -> str:
        return f"{self.distribution} {self.version}"


def _distribution_of(module: str, location: Path) -> metadata.Distribution | None:
    """The distribution that installed top-level `module` (found at `location`): the one of its name, else
    the one beside it whose top_level.txt or RECORD names it (cheaper than reading every package's
    metadata, as importlib.metadata.packages_distributions does)."""
    try:
        return metadata.distribution(module)
    except metadata.PackageNotFoundError:
        pass
    for info in sorted(location.parent.glob("*.dist-info")):
        dist = metadata.Distribution.at(info)
        listed = dist.read_text("top_level.txt")
        if listed is not None:
            if module in listed.split():
                return dist
        elif f"\n{module}/" in "\n" + (dist.read_text("RECORD") or ""):
            return dist
    return None


def installed(module: str) -> Installed | None:
    """What provides `module` here, found without importing it; None when it is not importable."""
    spec = importlib.util.find_spec(module)
    if spec is None:
        return None
    places = list(spec.submodule_search_locations or []) or ([spec.origin] if spec.origin else [])
    dist = _distribution_of(module, Path(places[0])) if places else None
    if dist is None:
        return Installed(module, "(no package metadata)", ())
    return Installed(dist.metadata["Name"] or module, dist.version, tuple(unmet_requirements(dist)))


def unmet_requirements(dist: metadata.Distribution) -> list[str]:
    """The requirements of `dist` (those of no extra, on this platform) that are not installed in a version
    it accepts."""
    unmet = []
    for text in dist.requires or []:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            have = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{requirement}, which is not installed")
            continue
        if requirement.specifier and not requirement.specifier.contains(have, prereleases=True):
            unmet.append(f"{requirement}, but {requirement.name} {have} is installed")
    return unmet


def _unusable(display: str, found: Installed) -> Capability:
    return Capability(
        display,
        False,
        f"{found.label()} is installed but requires {found.unmet[0]}; install the versions it requires "
        f"(pip check lists them all)",
    )


def _major(version: str) -> int:
    try:
        return Version(version).major
    except InvalidVersion:
        return 0


# ---- the frameworks ------------------------------------------------------------------------------------
def _tensorflow_capability() -> Capability:
    found = installed("tensorflow")
    if found is None:
        return Capability("TensorFlow", False, "TensorFlow is not installed; pip install 'hpcdl[tensorflow]'")
    if found.unmet:
        return _unusable("TensorFlow", found)
    return Capability("TensorFlow", True, detail=f"tensorflow {found.version}")


def _torch_capability() -> Capability:
    found = installed("torch")
    if found is None:
        return Capability("PyTorch", False, "PyTorch is not installed; pip install 'hpcdl[torch]'")
    if found.unmet:
        return _unusable("PyTorch", found)
    return Capability("PyTorch", True, detail=f"torch {found.version}")


def keras_backend(environ: os._Environ[str] | dict[str, str] = os.environ) -> str:
    """The backend Keras 3 starts on: KERAS_BACKEND, else keras.json's (in KERAS_HOME or ~/.keras), else
    tensorflow."""
    if environ.get("KERAS_BACKEND"):
        return environ["KERAS_BACKEND"]
    home = Path(environ.get("KERAS_HOME") or Path.home() / ".keras")
    try:
        return str(json.loads((home / "keras.json").read_text()).get("backend", "tensorflow"))
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def _keras_capability(frameworks: dict[str, Capability]) -> Capability:
    found = installed("keras")
    if found is None:
        return Capability("Keras", False, "Keras is not installed; Keras 3 comes with 'hpcdl[tensorflow]'")
    if _major(found.version) < 3:
        return Capability("Keras", False, f"keras {found.version} is installed; hpcdl.keras needs Keras 3")
    if found.unmet:
        return _unusable("Keras", found)
    backend = keras_backend()
    framework = {"tensorflow": "TensorFlow", "torch": "PyTorch"}.get(backend)
    if framework is None:
        return Capability(
            "Keras",
            False,
            f"keras {found.version} runs on the {backend} backend, which hpcdl.keras does not serve; "
            "set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch",
        )
    if not frameworks[framework].available:
        reason = f"keras {found.version} runs on the {backend} backend: {frameworks[framework].reason}"
        return Capability("Keras", False, reason)
    return Capability("Keras", True, detail=f"keras {found.version} on the {backend} backend")


def _tf_keras_capability() -> Capability:
    """Which Keras ``tf.keras`` (hence ``hpcdl.tensorflow.keras``) is, read from the installed distributions
    and TensorFlow's own switch, without importing TensorFlow."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(distribution: str) -> str | None:
        try:
            return version(distribution)
        except PackageNotFoundError:
            return None

    keras3, tf_keras = installed("keras"), installed("tf-keras") or installed("tf_keras")
    if importlib.util.find_spec("tensorflow") is None:
        return Capability("tf.keras", False, "TensorFlow is not installed; pip install 'hpcdl[tensorflow]'")
    if os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True"):
        if tf_keras is None:
            reason = "TF_USE_LEGACY_KERAS=1 but tf-keras is not installed: pip install --no-deps tf-keras"
            return Capability("tf.keras", False, reason)
        return Capability("tf.keras", True, detail=f"tf-keras {tf_keras}: Keras 2 (TF_USE_LEGACY_KERAS=1)")
    if keras3 is None:
        return Capability("tf.keras", False, "Keras 3 is not installed; it comes with 'hpcdl[tensorflow]'")
    other = f"; TF_USE_LEGACY_KERAS=1 selects tf-keras {tf_keras}" if tf_keras else ""
    return Capability("tf.keras", True, detail=f"Keras 3, keras {keras3}{other}")


def _unsupported_framework(display: str, module: str) -> Capability:
    found = installed(module)
    if found is None:
        return Capability(display, False, f"{display} is not installed, and hpcdl has no {display} API")
    return Capability(
        display,
        False,
        f"{display} {found.version} is installed, but hpcdl has no {display} API; "
        "use hpcdl.common on NumPy arrays or hpcdl.torch",
    )


# ---- PyTorch's communication backends ------------------------------------------------------------------
@dataclass(frozen=True)
class TorchBuild:
    """How the installed PyTorch was built, read from its files."""

    definitions: frozenset[str] | None  # compile definitions of its CMake targets; None: not recorded
    cuda: str | None  # the CUDA it was built for (torch/version.py)
    hip: str | None  # the ROCm/HIP it was built for


def torch_build() -> TorchBuild | None:
    """PyTorch's record of its build, or None when PyTorch is not importable here."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    try:
        targets = (root / "share" / "cmake" / "Caffe2" / "Caffe2Targets.cmake").read_text()
        found = re.findall(r'INTERFACE_COMPILE_DEFINITIONS "([^"$]*)"', targets)
        definitions = frozenset(d for line in found for d in line.split(";") if d)
    except OSError:
        definitions = None
    try:
        version_file = (root / "version.py").read_text()
    except OSError:
        version_file = ""

    def value(name: str) -> str | None:
        match = re.search(rf"^{name}\b[^=]*=\s*'([^']*)'", version_file, re.MULTILINE)
        return match.group(1) if match else None

    return TorchBuild(definitions, value("cuda"), value("hip"))


def gpus_visible(environ: os._Environ[str] | dict[str, str] = os.environ) -> bool:
    """Whether a GPU driver lists a device here that CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES leaves."""
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        if environ.get(name) is not None and environ[name].strip() in ("", "-1"):
            return False
    nvidia = Path("/proc/driver/nvidia/gpus")
    return (nvidia.is_dir() and any(nvidia.iterdir())) or Path("/dev/kfd").exists()


NO_DISTRIBUTED = "this PyTorch was built without torch.distributed"
NO_NCCL = "this PyTorch was built without NCCL (a CPU-only wheel)"
NO_GPU = "PyTorch has NCCL but no GPU is visible on this machine"


def _torch_backend_capability(display: str, backend: str, build: TorchBuild) -> Capability:
    """Gloo or NCCL from PyTorch's record of its build (``build.definitions`` known)."""
    assert build.definitions is not None
    if "USE_DISTRIBUTED" not in build.definitions:
        return Capability(display, False, NO_DISTRIBUTED)
    if backend == "gloo":
        ok = "USE_C10D_GLOO" in build.definitions
        return Capability(display, ok, "" if ok else "this PyTorch was built without Gloo")
    if build.cuda is None and build.hip is None:
        return Capability(display, False, NO_NCCL)
    if not gpus_visible():
        return Capability(display, False, NO_GPU)
    return Capability(display, True, detail=f"CUDA {build.cuda}" if build.cuda else f"ROCm {build.hip}")


# ---- deep probes: import each framework in a child process ---------------------------------------------
_PROBES = {
    "TensorFlow": "import tensorflow as tf, hpcdl.tensorflow; found = {'version': tf.__version__}",
    "PyTorch": (
        "import torch, torch.distributed as dist, hpcdl.torch\n"
        "found = {'version': torch.__version__, 'distributed': dist.is_available()}\n"
        "found['gloo'] = found['distributed'] and dist.is_gloo_available()\n"
        "found['nccl'] = found['distributed'] and dist.is_nccl_available()\n"
        "found['cuda'] = torch.cuda.is_available()\n"
        "if found['nccl'] and found['cuda']:\n"
        "    found['nccl_version'] = '.'.join(map(str, torch.cuda.nccl.version()))"
    ),
    "Keras": "import keras, hpcdl.keras; found = {'version': keras.__version__}",
}


def _run_probes(names: list[str]) -> dict[str, dict | str]:
    """Import each named framework (with hpcdl's API for it) in a child process, all at once: what it
    reports, or the last line of its error. Their start-up logs stay in the children."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    children = {
        name: subprocess.Popen(
            [sys.executable, "-c", f"import json\n{_PROBES[name]}\nprint('HPCDL-PROBE', json.dumps(found))"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in names
    }
    results: dict[str, dict | str] = {}
    for name, child in children.items():
        try:
            out, err = child.communicate(timeout=DEEP_PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            results[name] = f"importing it did not finish within {DEEP_PROBE_TIMEOUT_S:.0f} s"
            continue
        line = next((ln for ln in out.splitlines() if ln.startswith("HPCDL-PROBE ")), "")
        if child.returncode == 0 and line:
            results[name] = json.loads(line.partition(" ")[2])
        else:
            lines = [ln for ln in err.strip().splitlines() if ln.strip()]
            results[name] = lines[-1] if lines else f"its import ended with exit status {child.returncode}"
    return results


def _deep_torch_backend(display: str, backend: str, probe: dict) -> Capability:
    """Gloo or NCCL as the imported PyTorch reports them."""
    if not probe["distributed"]:
        return Capability(display, False, NO_DISTRIBUTED)
    if backend == "gloo":
        ok = bool(probe["gloo"])
        return Capability(display, ok, "" if ok else "this PyTorch was built without Gloo")
    if not probe["nccl"]:
        return Capability(display, False, NO_NCCL)
    if not probe["cuda"]:
        return Capability(display, False, NO_GPU)
    return Capability(display, True, detail=f"NCCL {probe['nccl_version']}")


# ---- the matrix ----------------------------------------------------------------------------------------
def check_build(deep: bool = False) -> Matrix:
    """The matrix; ``deep`` also imports every usable framework (see the module's docstring)."""
    runtime = built()
    caps = {"TensorFlow": _tensorflow_capability(), "PyTorch": _torch_capability()}
    caps["Keras"] = _keras_capability(caps)
    build = torch_build() if caps["PyTorch"].available else None
    probed = [name for name, cap in caps.items() if cap.available] if deep else []
    if build is not None and build.definitions is None and not deep:
        probed = ["PyTorch"]  # PyTorch keeps no record of its build: ask it
    probes = _run_probes(probed) if probed else {}
    for name in ("TensorFlow", "PyTorch", "Keras"):
        failure = probes.get(name)
        if isinstance(failure, str):
            reason = f"{caps[name].detail} is installed, but importing it with hpcdl's API fails: {failure}"
            caps[name] = Capability(name, False, reason)
    if caps["Keras"].available:
        caps["Keras"] = _keras_capability(caps)  # the framework under it may have failed to import
    torch = probes.get("PyTorch")
    backends = []
    for display, backend in (("NCCL", "nccl"), ("Gloo", "gloo")):
        if not caps["PyTorch"].available:
            reason = f"{display} comes through torch.distributed: {caps['PyTorch'].reason}"
            backends.append(Capability(display, False, reason))
        elif isinstance(torch, dict):
            backends.append(_deep_torch_backend(display, backend, torch))
        else:
            assert build is not None
            backends.append(_torch_backend_capability(display, backend, build))
    frameworks = [
        caps["TensorFlow"],
        caps["PyTorch"],
        caps["Keras"],
        _tf_keras_capability(),
        _unsupported_framework("JAX", "jax"),
        _unsupported_framework("MXNet", "mxnet"),
    ]
    controllers = [Capability("TCP", runtime.tcp.available, runtime.tcp.reason), runtime.mpi]
    return Matrix(
        version=runtime.version or __version__,
        library=runtime.library or runtime.load_error,
        frameworks=frameworks,
        controllers=controllers,
        tensor_operations=[runtime.shm, runtime.tcp, runtime.mpi, *backends],
    )
