"""The compatibility tables: every one names its source, and they cover every version the recipes list."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.stack.recipe import load_recipes
from hpcdl.stack.tables import TABLES_DIR, builtin_tables, load_tables
from hpcdl.stack.yamlfile import StackFileError


def test_every_table_names_its_source() -> None:
    tables = builtin_tables()
    assert set(tables.sources) == {
        "cuda_driver",
        "cudnn_cuda",
        "nccl_cuda",
        "pytorch",
        "mpi_cuda",
        "preferences",
    }
    assert all(len(source) > 20 for source in tables.sources.values())
    assert "docs.nvidia.com" in tables.sources["cuda_driver"]


def test_tables_cover_the_recipes() -> None:
    tables, recipes = builtin_tables(), load_recipes()
    for version in recipes["cuda"].versions:
        assert version.version in tables.cuda_driver, version.version
    for version in recipes["cudnn"].versions:
        assert tables.cudnn_supports(version.version, "12.4.1") is not None, version.version
    for version in recipes["nccl"].versions:
        assert tables.nccl_supports(version.version, "12.4.1") is not None, version.version
    for version in recipes["pytorch"].versions:
        assert tables.torch_release(version.version) is not None, version.version


def test_facts_from_the_sources() -> None:
    tables = builtin_tables()
    assert tables.min_driver("12.4.1") == "550.54.15"
    assert tables.min_driver("12.4.0") == "550.54.14"
    assert tables.minor_compat["12"] == "525.60.13"
    assert tables.newest_cuda_for_driver("560.35.03") == "12.6.2"
    assert tables.cudnn_supports("9.17.0", "13.1.0") and not tables.cudnn_supports("9.5.1.17", "12.8.1")
    release = tables.torch_release("2.5.1+cu124")
    assert release.known_cuda == ("11.8", "12.1", "12.4") and release.nccl == "2.21.5"
    assert tables.torch_release("2.13.0").known_cuda == ("13.0",)  # variants not recorded: default wheel only
    assert "--with-cuda" in tables.mpi_cuda["openmpi"]["build_flags"]


def test_a_broken_table_names_file_and_line(tmp_path: Path) -> None:
    for table in TABLES_DIR.glob("*.yaml"):
        (tmp_path / table.name).write_text(table.read_text())
    broken = tmp_path / "cudnn_cuda.yaml"
    broken.write_text(broken.read_text().replace('cuda: ">=12.0,<12.4 ||', 'cuda: ">=twelve ||', 1))
    with pytest.raises(StackFileError, match=rf"{broken}:\d+: .*not a version constraint"):
        load_tables(tmp_path)
    (tmp_path / "nccl_cuda.yaml").write_text("releases: []\n")
    broken.write_text((TABLES_DIR / "cudnn_cuda.yaml").read_text())
    with pytest.raises(StackFileError, match="names its 'source'"):
        load_tables(tmp_path)
