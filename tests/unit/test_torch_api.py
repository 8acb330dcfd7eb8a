"""hpcdl.torch pieces that need no running job: the exported surface, compression, op resolution,
learning-rate warmup, Adasum arithmetic, tensor views, the optimizer's argument checks."""

from __future__ import annotations

import ast
import warnings

import numpy as np
import pytest
import torch

import hpcdl.torch as hvd
from hpcdl.common.exceptions import HpcdlInternalError
from hpcdl.common.ops import reducescatter_rows
from hpcdl.common.types import DType
from hpcdl.torch import _adasum, _tensors, optimizer, reduce_ops

# Every name `import horovod.torch as hvd` offers in Horovod 0.28 (horovod/torch/__init__.py).
HOROVOD_TORCH_NAMES = [
    "elastic",
    "Compression",
    "allgather_object",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "allreduce",
    "allreduce_async",
    "allreduce_",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_async",
    "grouped_allreduce_",
    "grouped_allreduce_async_",
    "sparse_allreduce_async",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_async",
    "broadcast_",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "join",
    "barrier",
    "poll",
    "synchronize",
    "init",
    "shutdown",
    "is_initialized",
    "start_timeline",
    "stop_timeline",
    "size",
    "local_size",
    "cross_size",
    "rank",
    "local_rank",
    "cross_rank",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "HorovodInternalError",
    "DistributedOptimizer",
    "SyncBatchNorm",
]


def test_every_horovod_torch_name_is_exported() -> None:
    missing = [name for name in HOROVOD_TORCH_NAMES if not hasattr(hvd, name)]
    assert missing == []


def test_horovod_internal_error_is_hpcdls() -> None:
    assert hvd.HorovodInternalError is HpcdlInternalError
    assert issubclass(hvd.HorovodInternalError, Exception)


def test_elastic_surface() -> None:
    for name in ("State", "ObjectState", "TorchState", "ElasticSampler", "run", "HostsUpdatedInterrupt"):
        assert hasattr(hvd.elastic, name), name


def test_reduction_ops_are_distinct_and_average_is_default() -> None:
    ops = [hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product, hvd.Adasum]
    assert len(set(ops)) == 6
    assert reduce_ops.resolve_op(None, None) == hvd.Average
    assert reduce_ops.resolve_op(hvd.Max, None) == hvd.Max


def test_deprecated_average_flag_maps_to_ops_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="replaced with `op`"):
        assert reduce_ops.resolve_op(None, True) == hvd.Average
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert reduce_ops.resolve_op(None, False) == hvd.Sum
    with pytest.raises(ValueError, match="The op parameter supersedes average"):
        reduce_ops.resolve_op(hvd.Sum, True)
    with pytest.raises(ValueError, match="unknown reduction op 42"):
        reduce_ops.resolve_op(42, None)


def test_fp16_compression_round_trip() -> None:
    x = torch.tensor([1.0, 2.5, -3.25], dtype=torch.float64)
    compressed, ctx = hvd.Compression.fp16.compress(x)
    assert compressed.dtype == torch.float16
    restored = hvd.Compression.fp16.decompress(compressed, ctx)
    assert restored.dtype == torch.float64 and torch.equal(restored, x)
    ints = torch.tensor([1, 2, 3])
    same, ctx = hvd.Compression.fp16.compress(ints)
    assert same is ints and hvd.Compression.fp16.decompress(same, ctx) is ints


def test_none_compression_is_identity() -> None:
    x = torch.ones(3)
    compressed, ctx = hvd.Compression.none.compress(x)
    assert compressed is x and hvd.Compression.none.decompress(compressed, ctx) is x


def test_warmup_factor_goes_from_one_over_size_to_one() -> None:
    assert hvd.warmup_factor(0.0, 5, 4) == pytest.approx(0.25)
    assert hvd.warmup_factor(2.5, 5, 4) == pytest.approx((2.5 * 3 / 5 + 1) / 4)
    assert hvd.warmup_factor(5.0, 5, 4) == 1.0
    assert hvd.warmup_factor(7.0, 5, 4) == 1.0
    assert hvd.warmup_factor(0.0, 0, 4) == 1.0


def test_learning_rate_warmup_scales_every_param_group() -> None:
    a, b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([{"params": [a], "lr": 0.4}, {"params": [b], "lr": 0.8}], lr=0.1)
    warmup = hvd.LearningRateWarmup(opt, warmup_epochs=2, steps_per_epoch=4, world_size=4)
    warmup.step(0, 0)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1, 0.2])
    warmup.step(1, 0)  # halfway: (1 * 3 / 2 + 1) / 4 = 0.625
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.25, 0.5])
    warmup.step(2, 0)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.4, 0.8])
    with pytest.raises(ValueError, match="steps_per_epoch"):
        hvd.LearningRateWarmup(opt, steps_per_epoch=0, world_size=4)


def test_adasum_pair_matches_the_formula() -> None:
    a = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    b = torch.tensor([0.5, -1.0, 3.0], dtype=torch.float64)
    dot = float(a @ b)
    expected = (1 - dot / (2 * float(a @ a))) * a + (1 - dot / (2 * float(b @ b))) * b
    assert torch.allclose(_adasum.combine_pair(a, b), expected)
    same = _adasum.combine(torch.stack([a, a]))
    assert torch.allclose(same, a)  # identical gradients are not doubled
    zero = _adasum.combine(torch.stack([a, torch.zeros(3, dtype=torch.float64)]))
    assert torch.allclose(zero, a)


def test_adasum_tree_pairs_neighbours_first() -> None:
    rows = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    left = _adasum.combine_pair(rows[0], rows[1])
    right = _adasum.combine_pair(rows[2], rows[3])
    assert torch.allclose(_adasum.combine(rows), _adasum.combine_pair(left, right))


@pytest.mark.parametrize(
    ("dtype", "code"),
    [
        (torch.uint8, DType.UINT8),
        (torch.int8, DType.INT8),
        (torch.int16, DType.INT16),
        (torch.int32, DType.INT32),
        (torch.int64, DType.INT64),
        (torch.float16, DType.FLOAT16),
        (torch.bfloat16, DType.BFLOAT16),
        (torch.float32, DType.FLOAT32),
        (torch.float64, DType.FLOAT64),
        (torch.bool, DType.BOOL),
    ],
)
def test_tensor_buffers_are_zero_copy_views(dtype: torch.dtype, code: DType) -> None:
    t = torch.zeros(2, 3, dtype=dtype)
    buf = _tensors.buffer_of(t)
    assert buf.ptr == t.data_ptr() and buf.dtype == code and buf.shape == (2, 3)


def test_unsupported_dtype_names_the_supported_ones() -> None:
    with pytest.raises(ValueError, match=r"ComplexFloatTensor is not supported.*float32"):
        _tensors.runtime_dtype(torch.zeros(1, dtype=torch.complex64))


def test_scalar_tensors_travel_as_one_element() -> None:
    assert _tensors.buffer_of(torch.tensor(3.0)).shape == (1,)


class _EngineOutput:
    """What a finished allgather's handle gives: the address, size and shape of bytes the engine owns."""

    def __init__(self, raw: np.ndarray, shape: tuple[int, ...]) -> None:
        self.raw, self.shape = raw, shape

    def output_bytes(self) -> tuple[int, int, tuple[int, ...]]:
        return self.raw.ctypes.data, self.raw.nbytes, self.shape


def test_engine_output_becomes_a_tensor_of_the_right_dtype() -> None:
    values = torch.tensor([[1.5, -2.0], [3.0, 4.25]], dtype=torch.bfloat16)
    raw = values.view(torch.uint8).numpy().copy()
    back = _tensors.tensor_from_output(_EngineOutput(raw, (2, 2)), torch.bfloat16)
    assert torch.equal(back, values)
    raw[:] = 0  # a copy: the engine's bytes go when the handle is released
    assert torch.equal(back, values)
    empty = _tensors.tensor_from_output(_EngineOutput(np.zeros(0, np.uint8), (0, 3)), torch.float32)
    assert empty.shape == (0, 3)
    with pytest.raises(HpcdlInternalError, match="returned 8 bytes"):
        _tensors.tensor_from_output(_EngineOutput(np.zeros(8, np.uint8), (3,)), torch.float32)


def test_reducescatter_rows_follow_horovod() -> None:
    assert [reducescatter_rows(7, 3, r) for r in range(3)] == [3, 2, 2]
    assert [reducescatter_rows(2, 3, r) for r in range(3)] == [1, 1, 0]


def test_split_list_balances_groups() -> None:
    assert optimizer.split_list(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]


def test_named_parameters_are_checked_like_horovod() -> None:
    model = torch.nn.Linear(2, 2)
    groups = [{"params": list(model.parameters())}]
    with pytest.raises(ValueError, match="should be a sequence of tuples"):
        optimizer._named(list(model.parameters()), groups)
    with pytest.raises(ValueError, match=r"must be unique\. Found duplicates: w"):
        optimizer._named([("w", model.weight), ("w", model.bias)], groups)
    with pytest.raises(ValueError, match="were not named"):
        optimizer._named([("w", model.weight)], groups)
    names = optimizer._named(None, groups)
    assert sorted(names.values()) == ["allreduce.noname.0.0", "allreduce.noname.0.1"]


def test_process_set_validation() -> None:
    assert hvd.ProcessSet([2, 0, 1]).ranks == [0, 1, 2]
    with pytest.raises(ValueError, match="list of process ranks or an mpi4py Comm"):
        hvd.ProcessSet(["a"])
    unregistered = hvd.ProcessSet([0, 1])
    assert unregistered.size() is None and unregistered.rank() is None
    assert hvd.global_process_set.process_set_id == 0
    assert hvd.remove_process_set(unregistered) is False


def test_horovod_module_paths_exist() -> None:
    from hpcdl.torch import compression, functions, mpi_ops, sync_batch_norm
    from hpcdl.torch import optimizer as optimizer_module

    assert mpi_ops.allreduce_async is hvd.allreduce_async and mpi_ops.Sum == hvd.Sum
    assert compression.Compression is hvd.Compression and functions.broadcast_object is hvd.broadcast_object
    assert optimizer_module.DistributedOptimizer is hvd.DistributedOptimizer
    assert sync_batch_norm.SyncBatchNorm is hvd.SyncBatchNorm


# Parameters and defaults of Horovod 0.28.1's public torch functions (read from its source with `ast`).
HOROVOD_SIGNATURES = {
    "DistributedOptimizer": "optimizer, named_parameters=None, compression=Compression.none, "
    "backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None, "
    "sparse_as_dense=False, process_set=global_process_set",
    "add_process_set": "process_set",
    "allgather": "tensor, name=None, process_set=global_process_set",
    "allgather_async": "tensor, name=None, process_set=global_process_set",
    "allgather_object": "obj, name=None",
    "allreduce": "tensor, average=None, name=None, compression=Compression.none, op=None, "
    "prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set",
    "allreduce_": "tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, "
    "process_set=global_process_set",
    "allreduce_async": "tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, "
    "process_set=global_process_set",
    "allreduce_async_": "tensor, average=None, name=None, op=None, prescale_factor=1.0, "
    "postscale_factor=1.0, process_set=global_process_set",
    "alltoall": "tensor, splits=None, name=None, process_set=global_process_set",
    "alltoall_async": "tensor, splits=None, name=None, process_set=global_process_set",
    "barrier": "process_set=global_process_set",
    "broadcast": "tensor, root_rank, name=None, process_set=global_process_set",
    "broadcast_": "tensor, root_rank, name=None, process_set=global_process_set",
    "broadcast_async": "tensor, root_rank, name=None, process_set=global_process_set",
    "broadcast_async_": "tensor, root_rank, name=None, process_set=global_process_set",
    "broadcast_object": "obj, root_rank=0, name=None, process_set=global_process_set",
    "broadcast_optimizer_state": "optimizer, root_rank, model=None",
    "broadcast_parameters": "params, root_rank",
    "grouped_allgather": "tensors, name=None, process_set=global_process_set",
    "grouped_allgather_async": "tensors, name=None, process_set=global_process_set",
    "grouped_allreduce": "tensors, average=None, name=None, compression=Compression.none, op=None, "
    "prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set",
    "grouped_allreduce_": "tensors, average=None, name=None, op=None, prescale_factor=1.0, "
    "postscale_factor=1.0, process_set=global_process_set",
    "grouped_allreduce_async": "tensors, average=None, name=None, op=None, prescale_factor=1.0, "
    "postscale_factor=1.0, process_set=global_process_set",
    "grouped_allreduce_async_": "tensors, average=None, name=None, op=None, prescale_factor=1.0, "
    "postscale_factor=1.0, process_set=global_process_set",
    "grouped_reducescatter": "tensors, name=None, compression=Compression.none, op=Average, "
    "process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0",
    "grouped_reducescatter_async": "tensors, name=None, op=Average, process_set=global_process_set, "
    "prescale_factor=1.0, postscale_factor=1.0",
    "init": "comm=None, process_sets=None",
    "join": "device=-1",
    "poll": "handle",
    "reducescatter": "tensor, name=None, compression=Compression.none, op=Average, "
    "process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0",
    "reducescatter_async": "tensor, name=None, op=Average, process_set=global_process_set, "
    "prescale_factor=1.0, postscale_factor=1.0",
    "remove_process_set": "process_set",
    "shutdown": "",
    "sparse_allreduce_async": "tensor, name, op, process_set=global_process_set",
    "start_timeline": "file_path, mark_cycles=False",
    "synchronize": "handle",
}
_NO_DEFAULT = object()
_SYMBOLS = {
    "Compression.none": hvd.Compression.none,
    "Average": hvd.Average,
    "global_process_set": hvd.global_process_set,
}


def _horovod_parameters(text: str) -> list[tuple[str, object]]:
    params = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, default = item.partition("=")
        if not default:
            params.append((name, _NO_DEFAULT))
        else:
            params.append((name, _SYMBOLS[default] if default in _SYMBOLS else ast.literal_eval(default)))
    return params


@pytest.mark.parametrize("function", sorted(HOROVOD_SIGNATURES))
def test_signature_matches_horovod(function: str) -> None:
    """Same parameters, in the same order, with the same defaults; hpcdl may only append optional ones."""
    import inspect

    ours = list(inspect.signature(getattr(hvd, function)).parameters.values())
    theirs = _horovod_parameters(HOROVOD_SIGNATURES[function])
    assert [p.name for p in ours[: len(theirs)]] == [name for name, _ in theirs]
    for parameter, (name, default) in zip(ours, theirs):
        if default is _NO_DEFAULT:
            assert parameter.default is inspect.Parameter.empty, name
        else:
            assert parameter.default == default or parameter.default is default, name
    assert all(p.default is not inspect.Parameter.empty for p in ours[len(theirs) :])
