"""``hpcdl stack check``: what `detect` found, held against the compatibility tables.

Each finding names the part, what is wrong, why it matters and the command that fixes it. Findings are
pure functions of a Detection, so they can be checked for any machine description.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from packaging.version import Version

from hpcdl.stack.detect import Detection
from hpcdl.stack.tables import Tables, major_minor

MPI_NAMES = {"openmpi": "Open MPI", "mpich": "MPICH", "intel-mpi": "Intel MPI"}
MPI_LAUNCHERS = {"openmpi": "mpirun.openmpi", "mpich": "mpiexec.mpich"}
MPI_COMPILERS = {"openmpi": "mpicc.openmpi", "mpich": "mpicc.mpich"}


@dataclass(frozen=True)
class Finding:
    severity: str  # "error", "warning", "info" or "ok"
    part: str
    message: str
    cause: str = ""
    fix: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _mpi_of(detail: str) -> str:
    text = detail.lower()
    if "open mpi" in text or "openmpi" in text:
        return "openmpi"
    if "mpich" in text:
        return "mpich"
    return "intel-mpi" if "intel" in text else ""


def _newest_torch_variant(tables: Tables, torch_version: str, driver: str) -> str | None:
    release = tables.torch_release(torch_version)
    if release is None:
        return None
    fitting = [
        c for c in release.known_cuda if (d := tables.min_driver(f"{c}.0")) and Version(d) <= Version(driver)
    ]
    return max(fitting, key=Version) if fitting else None


def _cuda_findings(found: Detection, tables: Tables) -> list[Finding]:
    findings = []
    for toolkit in found.cuda_toolkits:
        needed = tables.min_driver(toolkit.version)
        where = f"CUDA {toolkit.version} at {toolkit.path}"
        if found.driver is None:
            findings.append(
                Finding("info", "cuda", f"{where}: no NVIDIA driver here, so it can compile but not run")
            )
            continue
        if needed is None:
            findings.append(
                Finding("warning", "cuda", f"{where}: no minimum driver in tables/cuda_driver.yaml")
            )
            continue
        if Version(needed) <= Version(found.driver):
            findings.append(Finding("ok", "cuda", f"{where} fits driver {found.driver} (needs >= {needed})"))
            continue
        major = toolkit.version.split(".")[0]
        compat = tables.minor_compat.get(major)
        newest = tables.newest_cuda_for_driver(found.driver)
        fix = f"load an older toolkit (module load cuda/{newest}) or upgrade the driver to >= {needed}"
        if compat and Version(compat) <= Version(found.driver):
            findings.append(
                Finding(
                    "warning",
                    "cuda",
                    f"{where} is newer than driver {found.driver} (needs >= {needed})",
                    f"it runs only under minor-version compatibility (driver >= {compat} for CUDA {major}.x);"
                    " no PTX JIT, and features of the newer driver fail at run time",
                    fix,
                )
            )
        else:
            findings.append(
                Finding(
                    "error",
                    "cuda",
                    f"{where} needs driver >= {needed}; this driver is {found.driver}",
                    "'CUDA driver version is insufficient for CUDA runtime version' at the first CUDA call",
                    fix,
                )
            )
    return findings


def _library_findings(found: Detection, tables: Tables) -> list[Finding]:
    findings = []
    for libs, supports, part in (
        (found.cudnn, tables.cudnn_supports, "cudnn"),
        (found.nccl, tables.nccl_supports, "nccl"),
    ):
        for lib in libs:
            for toolkit in found.cuda_toolkits:
                ok = supports(lib.version, toolkit.version)
                label = f"{part} {lib.version} ({lib.path}) with CUDA {toolkit.version}"
                if ok is None:
                    findings.append(Finding("warning", part, f"{label}: no row in tables/{part}_cuda.yaml"))
                elif ok:
                    findings.append(Finding("ok", part, f"{label}: supported"))
                else:
                    findings.append(
                        Finding(
                            "error",
                            part,
                            f"{label}: not a supported pair",
                            f"{part} {lib.version} was built for another CUDA; "
                            "builds fail to link or crash at load",
                            f"load a {part} built for CUDA {major_minor(toolkit.version)} "
                            f"(hpcdl stack resolve cuda@{major_minor(toolkit.version)} {part})",
                        )
                    )
    torch = found.torch
    torch_nccl = torch.detail.get("nccl") if torch else None
    for lib in found.nccl:
        if torch_nccl and major_minor(lib.version) != major_minor(torch_nccl):
            findings.append(
                Finding(
                    "warning",
                    "nccl",
                    f"NCCL {lib.version} at {lib.path} differs from torch's NCCL {torch_nccl}",
                    "hpcdl uses torch's NCCL; a different libnccl first on LD_LIBRARY_PATH "
                    "can be loaded instead "
                    "and fail with 'ncclCommInitRank failed' or undefined symbols",
                    f"module unload nccl, or use NCCL {torch_nccl} (hpcdl stack resolve nccl@{torch_nccl})",
                )
            )
    return findings


def _torch_findings(found: Detection, tables: Tables) -> list[Finding]:
    torch = found.torch
    if torch is None:
        return [
            Finding(
                "warning",
                "torch",
                "PyTorch is not installed",
                "hpcdl.torch cannot be used",
                "python -m pip install 'hpcdl[torch]'",
            )
        ]
    cuda = torch.detail.get("cuda")
    release = tables.torch_release(torch.version)
    findings = []
    if release is None:
        findings.append(Finding("info", "torch", f"torch {torch.version}: no row in tables/pytorch.yaml"))
    if cuda is None:
        if found.driver and found.gpus:
            variant = _newest_torch_variant(tables, torch.version, found.driver)
            index = f"cu{variant.replace('.', '')}" if variant else "cuXXX"
            findings.append(
                Finding(
                    "warning",
                    "torch",
                    f"torch {torch.version} is a CPU-only build on a machine with GPUs",
                    "GPU tensors and NCCL are unavailable",
                    f"python -m pip install torch=={torch.version.split('+')[0]} "
                    f"--index-url https://download.pytorch.org/whl/{index}",
                )
            )
        else:
            findings.append(Finding("ok", "torch", f"torch {torch.version} (CPU build; no GPU driver here)"))
        return findings
    if found.driver:
        major = cuda.split(".")[0]
        needed = tables.minor_compat.get(major)
        if needed and Version(needed) > Version(found.driver):
            variant = _newest_torch_variant(tables, torch.version, found.driver)
            fix = (
                (
                    f"python -m pip install torch=={torch.version.split('+')[0]} --index-url "
                    f"https://download.pytorch.org/whl/cu{variant.replace('.', '')}"
                )
                if variant
                else (f"upgrade the driver to >= {needed}")
            )
            findings.append(
                Finding(
                    "error",
                    "torch",
                    f"torch {torch.version} is built for CUDA {cuda}; driver {found.driver} is too old",
                    f"CUDA {major}.x needs driver >= {needed}: 'CUDA driver version is insufficient'",
                    fix,
                )
            )
        else:
            findings.append(
                Finding("ok", "torch", f"torch {torch.version} (CUDA {cuda}) fits driver {found.driver}")
            )
    for toolkit in found.cuda_toolkits:
        if toolkit.version.split(".")[0] != cuda.split(".")[0]:
            findings.append(
                Finding(
                    "warning",
                    "torch",
                    f"torch is built for CUDA {cuda} but the toolkit at {toolkit.path} is {toolkit.version}",
                    "CUDA extensions compiled with this nvcc do not match torch's CUDA major",
                    f"module load cuda/{cuda} "
                    f"(or install the torch variant for CUDA {major_minor(toolkit.version)})",
                )
            )
    return findings


def _mpi_findings(found: Detection, tables: Tables) -> list[Finding]:
    findings = []
    if not found.mpis:
        findings.append(
            Finding(
                "warning",
                "mpi",
                "no MPI implementation found",
                "hpcdl run uses TCP; mpirun and the MPI transport are unavailable",
                "apt install openmpi-bin libopenmpi-dev (or module load openmpi)",
            )
        )
    default = found.default_mpirun
    runtime = found.hpcdl
    users: list[tuple[str, str, str, str]] = []  # (who, implementation, version, rebuild command)
    if runtime.get("loaded") and runtime.get("mpi"):
        users.append(
            (
                "hpcdl's runtime",
                _mpi_of(runtime["mpi_detail"]),
                runtime["mpi_detail"].split()[-1],
                "python -m pip install --no-build-isolation --force-reinstall hpcdl "
                "(with that MPI's mpicc first on PATH)",
            )
        )
    if found.mpi4py:
        impl = found.mpi4py.detail.get("mpi", "")
        users.append(
            (
                "mpi4py",
                impl,
                found.mpi4py.detail.get("mpi_version", ""),
                f"env MPICC={MPI_COMPILERS.get(default.name if default else '', 'mpicc')} "
                "python -m pip install --no-binary mpi4py --force-reinstall mpi4py",
            )
        )
    for who, impl, version, rebuild in users:
        if default is None:
            continue
        label = f"{who} uses {MPI_NAMES.get(impl, impl)} {version}"
        if impl != default.name:
            findings.append(
                Finding(
                    "error",
                    "mpi",
                    f"{label} but `mpirun` ({default.path}) is "
                    f"{MPI_NAMES.get(default.name, default.name)} {default.version}",
                    "a launcher of another MPI starts every rank as a singleton: "
                    "all ranks think they are rank 0 of 1",
                    f"launch with {MPI_LAUNCHERS.get(impl, 'the matching mpirun')}, or rebuild: {rebuild}",
                )
            )
        elif major_minor(version) != major_minor(default.version):
            findings.append(
                Finding(
                    "warning",
                    "mpi",
                    f"{label} but `mpirun` is {default.version}",
                    "an MPI library of another release can fail with undefined symbols (e.g. ompi_mpi_real)",
                    f"rebuild: {rebuild}",
                )
            )
        else:
            findings.append(Finding("ok", "mpi", f"{label}, the same as `mpirun`"))
    if len(users) == 2 and users[0][1] != users[1][1]:
        findings.append(
            Finding(
                "error",
                "mpi",
                f"hpcdl's runtime ({users[0][1]}) and mpi4py ({users[1][1]}) use different MPIs",
                "one process cannot load two MPI libraries",
                users[1][3],
            )
        )
    if not runtime.get("loaded"):
        findings.append(
            Finding(
                "error",
                "hpcdl",
                "hpcdl's compiled runtime does not load",
                runtime.get("load_error", ""),
                "python -m pip install --no-build-isolation --force-reinstall hpcdl",
            )
        )
    elif not runtime.get("mpi") and found.mpis:
        findings.append(
            Finding(
                "warning",
                "hpcdl",
                "hpcdl's runtime can use no MPI (none found at run time, or built without MPI) although "
                "an MPI is installed",
                runtime.get("mpi_reason", ""),
                "pip install the hpcdl binary wheel (both MPI families); from source: apt install "
                "libopenmpi-dev libmpich-dev (MPI headers), then "
                "python -m pip install --no-build-isolation --force-reinstall hpcdl",
            )
        )
    if found.cuda_toolkits:
        for mpi in found.mpis:
            aware = mpi.detail.get("cuda_aware")
            row = tables.mpi_cuda.get(mpi.name, {})
            if aware is False:
                findings.append(
                    Finding(
                        "info",
                        "mpi",
                        f"{MPI_NAMES.get(mpi.name, mpi.name)} {mpi.version} is not CUDA-aware",
                        "fine for hpcdl: NCCL does the GPU collectives; "
                        "CUDA-aware MPI matters only for MPI calls on GPU buffers",
                        f"configure {row.get('build_flags', '--with-cuda')} "
                        f"(hpcdl stack resolve {mpi.name}+cuda)",
                    )
                )
    return findings


def check(found: Detection, tables: Tables) -> list[Finding]:
    findings = _cuda_findings(found, tables) + _library_findings(found, tables)
    findings += _torch_findings(found, tables) + _mpi_findings(found, tables)
    if found.loaded_modules:
        findings.append(Finding("info", "modules", "loaded modules: " + " ".join(found.loaded_modules)))
    return findings


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)
