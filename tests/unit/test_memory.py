"""Large out-of-place results live in a pool of warm blocks advised onto huge pages: a block serves one
result at a time, comes back when the last reference to the result goes, and the pool keeps few idle."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hpcdl.common import memory  # noqa: E402
from hpcdl.torch.async_ops import new_output  # noqa: E402

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
ELEMENTS = 16 << 20  # 64 MiB of float32


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
def test_a_large_result_is_on_huge_pages_and_behaves_as_a_tensor() -> None:
    source = torch.ones(64, ELEMENTS // 64, dtype=torch.float32).t()  # not contiguous
    out = new_output(source)
    assert "hg" in vm_flags(out.data_ptr() + out.nbytes // 2)
    assert out.shape == source.shape and out.dtype == source.dtype and out.is_contiguous()
    assert not out.requires_grad
    out.copy_(source)
    assert float(out.sum()) == ELEMENTS and torch.equal(out, source)
    out.resize_(10)  # smaller is allowed; beyond its size it cannot grow (a tensor made from a buffer)
    with pytest.raises(RuntimeError, match="not resizable"):
        out.resize_(ELEMENTS + 1)
    small = new_output(torch.ones(1024))
    assert small.is_contiguous() and small.shape == (1024,)


def test_a_block_serves_one_result_at_a_time_and_comes_back_when_the_last_view_goes() -> None:
    source = torch.zeros(ELEMENTS, dtype=torch.bfloat16)  # 32 MiB: a size no other test uses
    first = new_output(source)
    second = new_output(source)  # the first still lives: another block
    first_at, second_at = first.data_ptr(), second.data_ptr()
    assert second_at != first_at
    first.fill_(1.0)
    second.fill_(2.0)
    assert float(first[-1]) == 1.0 and float(second[0]) == 2.0
    view = first[ELEMENTS // 2 :]
    del first
    gc.collect()
    third = new_output(source)  # a view of the first still holds its block
    assert third.data_ptr() not in (first_at, second_at)
    assert float(view[0]) == 1.0
    del view, second, third
    gc.collect()
    again = new_output(source)  # one of the blocks that came back, warm
    assert again.data_ptr() in (first_at, second_at)


def test_the_pool_keeps_at_most_two_idle_blocks_of_a_size_and_hands_them_out_again() -> None:
    nbytes = memory.POOL_FROM_BYTES + 4096
    before = memory.idle_bytes()
    buffers = [memory.result_buffer(nbytes) for _ in range(4)]
    arrays = [np.frombuffer(b, dtype=np.uint8) for b in buffers]
    arrays[0][:] = 7
    assert int(arrays[0][-1]) == 7 and int(arrays[1][-1]) == 0
    del buffers, arrays
    gc.collect()
    assert memory.idle_bytes() - before == memory.IDLE_BLOCKS_PER_SIZE * nbytes
    reused = memory.result_buffer(nbytes)  # taken from the idle ones, not mapped anew
    assert memory.idle_bytes() - before == (memory.IDLE_BLOCKS_PER_SIZE - 1) * nbytes
    assert len(reused) == nbytes


def test_a_result_array_holds_its_block_through_views_and_tensors_and_gives_it_back() -> None:
    # NumPy keeps the mapping under a memoryview, not the memoryview: a block handed out as a memoryview to
    # numpy.frombuffer came back at once, while the array used it, and served the next result too.
    nbytes = memory.POOL_FROM_BYTES + 8192
    before = memory.idle_bytes()
    array = memory.result_array((nbytes // 8, 2), np.float32)
    assert array.shape == (nbytes // 8, 2) and array.dtype == np.float32 and array.flags.c_contiguous
    view = array[1:].reshape(-1)
    tensor = torch.from_numpy(memory.result_array((nbytes,), np.uint8)).view(torch.float32).reshape(-1, 2)
    del array
    gc.collect()
    assert memory.idle_bytes() == before  # both blocks still in use: the view and the tensor hold them
    other = memory.result_array((nbytes // 8, 2), np.float32)  # so a new result gets a block of its own
    assert not np.shares_memory(other, view)
    assert other.ctypes.data != tensor.data_ptr()
    view[:] = 1.0
    other[:] = 2.0
    assert float(view[-1]) == 1.0
    del view, tensor, other
    gc.collect()
    assert memory.idle_bytes() - before == memory.IDLE_BLOCKS_PER_SIZE * nbytes
    small = memory.result_array((3, 4), np.float64)  # below POOL_FROM_BYTES: NumPy's own
    assert small.flags.owndata and small.shape == (3, 4)
