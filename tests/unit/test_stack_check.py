"""Checks on machine descriptions (Detection values) against the real tables: every mismatch has a cause
and a fix."""

from __future__ import annotations

from dataclasses import replace

from hpcdl.stack.check import check, has_errors
from hpcdl.stack.detect import Detection, Found
from hpcdl.stack.tables import builtin_tables

OPENMPI = Found(
    "openmpi", "4.1.4", "/usr/bin/mpirun.openmpi", "mpirun.openmpi --version", {"cuda_aware": False}
)
MPICH = Found("mpich", "4.0.2", "/usr/bin/mpiexec.mpich", "mpiexec.mpich --version", {"cuda_aware": False})
HPCDL_OMPI = {
    "version": "0.1.0",
    "library": "/x.so",
    "loaded": True,
    "load_error": "",
    "features": {"shared memory": True, "TCP": True, "MPI": True},
    "mpi": True,
    "mpi_detail": "Open MPI 4.1.4",
    "mpi_reason": "",
}


def machine(**changes) -> Detection:
    base = Detection(
        python="3.11.7",
        driver=None,
        gpus=[],
        cuda_toolkits=[],
        cudnn=[],
        nccl=[],
        mpis=[OPENMPI, MPICH],
        default_mpirun=replace(OPENMPI, path="/usr/bin/mpirun"),
        mpi4py=Found("mpi4py", "4.1.2", "/m", "import", {"mpi": "openmpi", "mpi_version": "4.1.4"}),
        torch=Found(
            "torch",
            "2.13.0+cpu",
            "/t",
            "import torch",
            {"cuda": None, "cudnn": None, "nccl": None, "cuda_available": False},
        ),
        hpcdl=HPCDL_OMPI,
        loaded_modules=[],
        problems=[],
    )
    return replace(base, **changes)


def errors(found: Detection) -> list:
    return [f for f in check(found, builtin_tables()) if f.severity == "error"]


def test_consistent_cpu_machine_has_no_errors() -> None:
    findings = check(machine(), builtin_tables())
    assert not has_errors(findings)
    assert any(f.severity == "ok" and "mpi4py uses Open MPI 4.1.4" in f.message for f in findings)


def test_mpi4py_built_with_mpich_but_mpirun_is_open_mpi() -> None:
    mpi4py = Found("mpi4py", "4.1.2", "/m", "import", {"mpi": "mpich", "mpi_version": "4.0.2"})
    found = errors(machine(mpi4py=mpi4py))
    messages = [f.message for f in found]
    assert any(m.startswith("mpi4py uses MPICH 4.0.2 but `mpirun`") for m in messages)
    assert any("different MPIs" in m for m in messages)  # hpcdl (Open MPI) and mpi4py (MPICH) in one process
    fix = next(f.fix for f in found if f.message.startswith("mpi4py"))
    assert "mpiexec.mpich" in fix and "MPICC=mpicc.openmpi" in fix and "--no-binary mpi4py" in fix


def test_cuda_toolkit_newer_than_driver() -> None:
    toolkit = Found("cuda", "12.8.1", "/usr/local/cuda-12.8", "version.json")
    old_driver = errors(machine(driver="470.57.02", gpus=["A100"], cuda_toolkits=[toolkit]))
    assert (
        old_driver[0].message
        == "CUDA 12.8.1 at /usr/local/cuda-12.8 needs driver >= 570.124.06; this driver is 470.57.02"
    )
    assert "insufficient" in old_driver[0].cause and "module load cuda/" in old_driver[0].fix
    findings = check(machine(driver="550.54.15", gpus=["A100"], cuda_toolkits=[toolkit]), builtin_tables())
    compat = next(f for f in findings if f.part == "cuda")
    assert compat.severity == "warning" and "minor-version compatibility" in compat.cause
    assert "module load cuda/12.4.1" in compat.fix


def test_cudnn_and_nccl_for_another_cuda() -> None:
    toolkit = Found("cuda", "12.1.1", "/usr/local/cuda", "version.json")
    found = machine(
        cuda_toolkits=[toolkit],
        cudnn=[Found("cudnn", "9.5.1", "/c/cudnn_version.h", "h")],
        nccl=[Found("nccl", "2.21.5", "/n/nccl.h", "h")],
    )
    parts = {f.part for f in errors(found)}
    assert parts == {"nccl"}  # cuDNN 9.5.1 supports CUDA 12.1; NCCL 2.21.5 needs 12.4+
    nccl = [f for f in check(found, builtin_tables()) if f.part == "nccl"]
    assert nccl and nccl[0].severity == "error" and "hpcdl stack resolve cuda@12.1 nccl" in nccl[0].fix


def test_torch_cuda_wheel_on_an_old_driver_gets_a_matching_index() -> None:
    torch = Found(
        "torch",
        "2.5.1+cu124",
        "/t",
        "import torch",
        {"cuda": "12.4", "cudnn": "9.1.0", "nccl": "2.21.5", "cuda_available": False},
    )
    found = errors(machine(driver="470.57.02", gpus=["V100"], torch=torch))
    assert found[0].part == "torch"
    assert "upgrade the driver to >= 525.60.13" in found[0].fix  # no torch 2.5 wheel fits a 470 driver
    cpu = check(machine(driver="550.54.15", gpus=["A100"]), builtin_tables())
    warning = next(f for f in cpu if f.part == "torch")
    assert warning.severity == "warning" and "download.pytorch.org/whl/cu" in warning.fix


def test_runtime_without_mpi_and_runtime_that_does_not_load() -> None:
    no_mpi = {**HPCDL_OMPI, "mpi": False, "mpi_detail": "", "mpi_reason": "MPI headers not found at build"}
    warnings = [f for f in check(machine(hpcdl=no_mpi), builtin_tables()) if f.severity == "warning"]
    assert any("can use no MPI" in f.message and "binary wheel" in f.fix for f in warnings)
    broken = {**HPCDL_OMPI, "loaded": False, "load_error": "undefined symbol: x"}
    found = errors(machine(hpcdl=broken))
    assert found[0].cause == "undefined symbol: x" and "--force-reinstall" in found[0].fix
