"""The check-build matrix (``hpcdl check-build``): what this installation can really do, probed now.

Frameworks are probed by importing them and hpcdl's API for them (Keras also by its backend:
``hpcdl.keras`` serves TensorFlow and PyTorch); controllers and CPU tensor operations come from the
compiled runtime; NCCL and Gloo from the installed PyTorch, which hpcdl uses for them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import asdict, dataclass, field

from hpcdl._version import __version__
from hpcdl.common.build import Capability, built


@dataclass(frozen=True)
class Matrix:
    version: str
    library: str
    frameworks: list[Capability] = field(default_factory=list)
    controllers: list[Capability] = field(default_factory=list)
    tensor_operations: list[Capability] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _module_version(name: str) -> str | None:
    """Import `name` and return its version, or None when it is not importable."""
    if importlib.util.find_spec(name) is None:
        return None
    try:
        module = importlib.import_module(name)
    except Exception:  # a broken install still counts as "not usable"
        return None
    return str(getattr(module, "__version__", "unknown"))


def _torch_capability() -> Capability:
    version = _module_version("torch")
    if version is None:
        return Capability("PyTorch", False, "PyTorch is not installed; pip install 'hpcdl[torch]'")
    try:
        importlib.import_module("hpcdl.torch")
    except Exception as exc:
        return Capability(
            "PyTorch", False, f"torch {version} is installed but hpcdl.torch fails to import: {exc}"
        )
    return Capability("PyTorch", True, detail=f"torch {version}")


def _tensorflow_capability() -> Capability:
    version = _module_version("tensorflow")
    if version is None:
        return Capability("TensorFlow", False, "TensorFlow is not installed; pip install 'hpcdl[tensorflow]'")
    try:
        importlib.import_module("hpcdl.tensorflow")
    except Exception as exc:
        reason = f"tensorflow {version} is installed but hpcdl.tensorflow fails to import: {exc}"
        return Capability("TensorFlow", False, reason)
    return Capability("TensorFlow", True, detail=f"tensorflow {version}")


def _keras_capability() -> Capability:
    if importlib.util.find_spec("keras") is None:
        return Capability("Keras", False, "Keras is not installed; Keras 3 comes with 'hpcdl[tensorflow]'")
    try:
        keras = importlib.import_module("keras")
    except Exception as exc:  # e.g. KERAS_BACKEND names a framework that is not installed
        backend = os.environ.get("KERAS_BACKEND", "its configured backend")
        return Capability("Keras", False, f"Keras is installed but fails to import on {backend}: {exc}")
    version = str(getattr(keras, "__version__", "0"))
    if int(version.split(".")[0]) < 3:
        return Capability("Keras", False, f"keras {version} is installed; hpcdl.keras needs Keras 3")
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "torch"):
        return Capability(
            "Keras",
            False,
            f"keras {version} runs on the {backend} backend, which hpcdl.keras does not serve; "
            "set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch",
        )
    try:
        importlib.import_module("hpcdl.keras")
    except Exception as exc:
        reason = f"keras {version} ({backend} backend) is installed but hpcdl.keras fails to import: {exc}"
        return Capability("Keras", False, reason)
    return Capability("Keras", True, detail=f"keras {version} on the {backend} backend")


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
    version = _module_version(module)
    if version is None:
        return Capability(display, False, f"{display} is not installed, and hpcdl has no {display} API")
    return Capability(
        display,
        False,
        f"{display} {version} is installed, but hpcdl has no {display} API; "
        "use hpcdl.common on NumPy arrays or hpcdl.torch",
    )


def _torch_distributed_backend(display: str, backend: str) -> Capability:
    if importlib.util.find_spec("torch") is None:
        return Capability(display, False, f"{display} comes through torch.distributed; install hpcdl[torch]")
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return Capability(display, False, "this PyTorch was built without torch.distributed")
    if backend == "gloo":
        ok = dist.is_gloo_available()
        return Capability(display, ok, "" if ok else "this PyTorch was built without Gloo")
    if not dist.is_nccl_available():
        return Capability(display, False, "this PyTorch was built without NCCL (a CPU-only wheel?)")
    if not torch.cuda.is_available():
        return Capability(display, False, "PyTorch has NCCL but no CUDA device is visible on this machine")
    return Capability(display, True, detail=f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")


def check_build() -> Matrix:
    runtime = built()
    frameworks = [
        _tensorflow_capability(),
        _torch_capability(),
        _keras_capability(),
        _tf_keras_capability(),
        _unsupported_framework("JAX", "jax"),
        _unsupported_framework("MXNet", "mxnet"),
    ]
    controllers = [
        Capability("TCP", runtime.tcp.available, runtime.tcp.reason),
        runtime.mpi,
    ]
    tensor_operations = [
        runtime.shm,
        runtime.tcp,
        runtime.mpi,
        _torch_distributed_backend("NCCL", "nccl"),
        _torch_distributed_backend("Gloo", "gloo"),
    ]
    return Matrix(
        version=runtime.version or __version__,
        library=runtime.library or runtime.load_error,
        frameworks=frameworks,
        controllers=controllers,
        tensor_operations=tensor_operations,
    )
