"""Fresh out-of-place results of tens of MiB are advised onto huge pages before their first touch; small
ones are left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hpcdl.common.memory import ADVISE_FROM_BYTES, advise_huge_pages  # noqa: E402
from hpcdl.torch.async_ops import new_output  # noqa: E402

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds `address`."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= address < high
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not THP.exists(), reason="this kernel has no transparent huge pages")
def test_a_large_fresh_output_is_advised_onto_huge_pages_and_a_small_one_is_not() -> None:
    elements = 16 << 20  # 64 MiB of float32: above glibc's largest mmap threshold, a mapping of its own
    large = new_output(torch.ones(elements))
    middle = large.data_ptr() + large.nbytes // 2
    assert "hg" in vm_flags(middle), vm_flags(middle)
    assert large.shape == (elements,) and large.is_contiguous()
    large.fill_(2.0)  # the memory is ordinary memory
    assert float(large.sum()) == 2.0 * elements
    assert not advise_huge_pages(large.data_ptr(), ADVISE_FROM_BYTES - 1)  # too small to gain
