"""The facts check-build answers from without importing a framework: a distribution's unmet requirements,
Keras's configured backend, a visible GPU, and PyTorch's record of its build."""

from __future__ import annotations

import importlib.metadata as metadata
from pathlib import Path

import pytest

from hpcdl.stack import check_build


def _dist(tmp_path: Path, requires: list[str]) -> metadata.Distribution:
    info = tmp_path / "fake-1.0.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", "Name: fake", "Version: 1.0"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    return metadata.Distribution.at(info)


def test_requirements_that_are_missing_or_in_another_version_are_unmet(tmp_path: Path) -> None:
    numpy = metadata.version("numpy")
    dist = _dist(tmp_path, ["numpy<1.0", "numpy>=1.0", "no-such-package-hpcdl>=1", 'other; extra == "docs"',
                            'winonly; platform_system == "Windows"'])  # fmt: skip
    assert check_build.unmet_requirements(dist) == [
        f"numpy<1.0, but numpy {numpy} is installed",
        "no-such-package-hpcdl>=1, which is not installed",
    ]


def test_keras_backend_from_the_environment_then_keras_json(tmp_path: Path) -> None:
    assert check_build.keras_backend({"KERAS_BACKEND": "jax", "KERAS_HOME": str(tmp_path)}) == "jax"
    assert check_build.keras_backend({"KERAS_HOME": str(tmp_path)}) == "tensorflow"  # no keras.json
    (tmp_path / "keras.json").write_text('{"backend": "torch"}')
    assert check_build.keras_backend({"KERAS_HOME": str(tmp_path)}) == "torch"


@pytest.mark.parametrize("hidden", ["", "-1"])
def test_no_gpu_is_visible_when_cuda_visible_devices_hides_them(hidden: str) -> None:
    assert not check_build.gpus_visible({"CUDA_VISIBLE_DEVICES": hidden})


def test_pytorchs_record_of_its_build_is_read_from_its_files() -> None:
    pytest.importorskip("torch")
    build = check_build.torch_build()
    assert build is not None and build.definitions is not None
    assert "USE_DISTRIBUTED" in build.definitions  # every Linux wheel has torch.distributed
    assert check_build.installed("torch") is not None
    assert check_build.installed("no_such_module_hpcdl") is None
