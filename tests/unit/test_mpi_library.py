"""Which MPI family and which libmpi a job asks for (hpcdl.common.mpi_library), without loading any MPI."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.common import mpi_library
from hpcdl.common.exceptions import HpcdlConfigError

OPENMPI, MPICH = (mpi_library._BY_KEY[k] for k in ("openmpi", "mpich"))


def test_the_launcher_decides_the_family() -> None:
    assert mpi_library.requested_family("auto", "OpenMPI mpirun") == (
        OPENMPI, "this process was started by OpenMPI mpirun"
    )  # fmt: skip
    assert mpi_library.requested_family("", "MPICH/PMI mpiexec")[0] is MPICH
    assert mpi_library.requested_family("auto", "Slurm srun") == (None, "")  # no family of its own


def test_hpcdl_mpi_names_a_family_or_a_library_over_the_launcher() -> None:
    assert mpi_library.requested_family("MPICH", "OpenMPI mpirun") == (MPICH, "HPCDL_MPI=MPICH")
    assert mpi_library.requested_family("/opt/impi/lib/libmpi.so.12", "none") == (
        None, "HPCDL_MPI=/opt/impi/lib/libmpi.so.12"
    )  # fmt: skip


def test_an_unknown_hpcdl_mpi_is_refused_with_the_choices() -> None:
    with pytest.raises(HpcdlConfigError, match="not one of auto, openmpi, mpich nor a path"):
        mpi_library.requested_family("intel", "none")


def test_a_family_install_named_by_its_variables_comes_before_the_loader_search(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libmpi.so.40").write_bytes(b"")
    assert mpi_library._candidates(OPENMPI, {"OPAL_PREFIX": str(tmp_path)}) == [
        str(tmp_path / "lib" / "libmpi.so.40"), "libmpi.so.40"
    ]  # fmt: skip
    impi = tmp_path / "impi"
    (impi / "lib" / "release").mkdir(parents=True)
    (impi / "lib" / "release" / "libmpi.so.12").write_bytes(b"")
    found = mpi_library._candidates(MPICH, {"I_MPI_ROOT": str(impi)})
    assert found[0] == str(impi / "lib" / "release" / "libmpi.so.12")
    assert found[1:] == ["libmpi.so.12", "libmpich.so.12", "libmpi_cray.so.12"]


def test_a_library_that_does_not_load_says_why(tmp_path: Path) -> None:
    broken = tmp_path / "libmpi.so.40"
    broken.write_text("not an ELF file")
    found = mpi_library.find(OPENMPI, {}, str(broken))
    assert not found.ok
    assert str(broken) in found.describe() and "no Open MPI library loads" in found.describe()


@pytest.mark.parametrize(
    ("version", "family"),
    [("Open MPI v5.0.3", "openmpi"), ("MPICH 4.0.2", "mpich"), ("Intel(R) MPI Library 2021.6", "mpich"),
     ("MVAPICH2 2.3.7", "mpich"), ("MPI VERSION    : CRAY MPICH version 8.1.25.17", "mpich")],
)  # fmt: skip
def test_the_family_of_a_library_is_read_from_its_version(version: str, family: str) -> None:
    assert mpi_library._family_of(version).key == family
