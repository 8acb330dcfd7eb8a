"""Horovod's TensorFlow collectives (``horovod.tensorflow.mpi_ops``) on hpcdl's engine.

Eagerly, an op hands NumPy views of its tensors to the engine and waits. Inside a graph (a
``tf.function``, or a TensorFlow 1 graph run by a session) an op is three: a stateful
``tf.numpy_function`` that submits the collective to the engine without waiting, the asynchronous
``HpcdlLatch`` kernel (``latch_op.cc``), which completes when the operation ended (waited for with the
engine's deadline by the kernel's own threads, or by the executor thread of the last collective of an
execution, which then cannot keep any other from being submitted), and a ``tf.numpy_function`` that reads
the result. So every collective of a graph reaches the engine whatever order each rank's executor runs
them in, and the engine orders and fuses them, as Horovod's asynchronous kernels let it. Outputs get the
static shapes known when tracing. Nothing works under XLA (``jit_compile=True``), which compiles no
Python: such a trace is refused with what to do.

Gradients follow Horovod 0.28 (``tf.custom_gradient``): allreduce's gradient is the same allreduce of the
incoming gradient; allgather's the Average-allreduce of it, sliced to this rank's rows; broadcast's the
Average-allreduce on the root and zeros elsewhere; alltoall's the reverse alltoall; reducescatter's the
allgather of it (times the set size for Sum, times the scale factors).

Names of unnamed operations: see ``_graph_names``.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import record
from tensorflow.python.ops import control_flow_util

from hpcdl.common import basics, elastic
from hpcdl.common.exceptions import (
    HpcdlError,
    HpcdlMismatchError,
    HpcdlTimeoutError,
    HpcdlUnsupportedError,
    error_for,
)
from hpcdl.common.process_sets import ProcessSet, global_process_set, id_of
from hpcdl.common.reduce_ops import Adasum, Average, Product, Sum, check_op
from hpcdl.tensorflow import _engine, _errors, _graph_names, _latch
from hpcdl.tensorflow._dtypes import reduction_dtype, wire_of

Tensors = Sequence[Any]
_from_dlpack = tf.experimental.dlpack.from_dlpack


# ---- running engine work on tensors ------------------------------------------------------------------


_PENDING: dict[int, tuple[_engine.Started, list[str]]] = {}  # token -> (its operations, their auto names)
_TOKENS = itertools.count(1)


def _failure(exc: BaseException, auto_names: Sequence[str]) -> BaseException:
    """``exc`` as TensorFlow sees it (see ``_errors``); a mismatch or a missing rank on an automatically
    named graph operation adds what to do about it to the engine's message."""
    if auto_names and isinstance(exc, (HpcdlMismatchError, HpcdlTimeoutError)):
        exc = type(exc)(
            f"{exc}\n{', '.join(auto_names)} was named automatically, by its position among the unnamed "
            "collectives of its graph, which works when every rank creates and runs the same ones in the "
            "same order there. Pass name='...' (the same on every rank) to the collectives that only some "
            "ranks create or run (a rank-dependent branch or loop), or make every rank build the same ones."
        )
    return _errors.as_tensorflow(exc)


def _explained(result: Callable[[], Any], auto_names: Sequence[str]) -> Any:
    """``result()``, its failure raised as :func:`_failure` makes it."""
    try:
        return result()
    except (HpcdlError, ValueError) as exc:
        raise _failure(exc, auto_names) from None


class _Submitters:
    """How many submitting ops a graph holds, read when they run: the latch of an execution's last one may
    wait on its executor thread (see ``latch_op.cc``)."""

    count = 0


_SUBMITTERS: weakref.WeakKeyDictionary[Any, _Submitters] = weakref.WeakKeyDictionary()


def _on_failure(token: int, status: int, message: str) -> Optional[tuple[int, str]]:
    """A watched collective failed (``status``: its hpcdl status) or, with ``Kernel.ORPHAN``, ended after
    its latch was cancelled: release its operations; the TensorFlow code and message to fail its latch
    with, if it failed."""
    started, auto_names = _PENDING.pop(token)
    started.release()
    if status == _latch.Kernel.ORPHAN:
        return None
    return _errors.code_and_message(_failure(error_for(status, message), auto_names))


def _submit(
    start: Callable[..., _engine.Started],
    arrays: Sequence[np.ndarray],
    auto_names: list[str],
    census: Optional[_graph_names.Census],
    kernel: _latch.Kernel,
    submitters: _Submitters,
) -> np.ndarray:
    """Submit without waiting and hand the operations to the kernel's library, which opens the token's
    latch when they end (a failed one through :func:`_on_failure`: then the reading op does not run). When
    the ranks' unnamed collectives disagree (``census``), nothing is submitted and the latch fails."""
    token = next(_TOKENS)
    if census is not None:
        try:
            census.check()
        except HpcdlError as exc:
            kernel.fail(token, *_errors.code_and_message(_failure(exc, auto_names)))
            return np.asarray(token, dtype=np.int64)
    started = _explained(lambda: start(*arrays), auto_names)
    _PENDING[token] = (started, auto_names)
    kernel.serve(_on_failure)
    kernel.watch(token, started.ids(), id(submitters), submitters.count if kernel.inline else 0)
    return np.asarray(token, dtype=np.int64)


def _adopt(array: np.ndarray) -> tf.Tensor:
    """An eager tensor over ``array``'s own memory, through DLPack, where TensorFlow can use that memory as
    it is (aligned for its kernels: an unaligned one is adopted too, and fails their checks with an abort);
    else a copy (unaligned, bfloat16, read-only). A 32 MiB result took 5.8 ms to convert, DLPack 1 us; a
    small one 7.5 us against 0.7."""
    if (
        array.dtype.kind in "biufc"
        and array.flags.writeable
        and array.flags.c_contiguous
        and array.ctypes.data % _engine.ALIGNMENT == 0
    ):
        return _from_dlpack(array.__dlpack__())
    return tf.convert_to_tensor(array)


def _run(
    kind: str,
    start: Callable[..., _engine.Started],
    inputs: Sequence[tf.Tensor],
    dtypes: Sequence[tf.DType],
    shapes: Sequence[Any],
    names: Sequence[Optional[str]] = (),
    process_set: int = 0,
) -> list[tf.Tensor]:
    """``start`` the engine work on NumPy views of ``inputs`` and return its outputs: at once when eager,
    else as the ops described in the module's doc, whose outputs get ``shapes``."""
    auto_names = [n for n in names if n is not None and _graph_names.is_auto(n)]
    if tf.executing_eagerly():
        arrays = [np.asarray(t) for t in inputs]
        return [_adopt(out) for out in _explained(start(*arrays).finish, auto_names)]
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise HpcdlUnsupportedError(
            f"hpcdl's {kind} cannot run inside an XLA-compiled function: XLA compiles no Python, and "
            "hpcdl's TensorFlow ops reach the engine through tf.numpy_function. Use "
            "tf.function(jit_compile=False), or model.compile(..., jit_compile=False) with Keras"
        )
    census = _graph_names.census(process_set) if auto_names else None
    kernel = _latch.load()
    if kernel is None:  # no kernel: wait inside the op

        def run(*arrays: np.ndarray) -> list[np.ndarray]:
            if census is not None:
                census.check()
            return start(*arrays).finish()

        outputs = tf.numpy_function(
            lambda *arrays: _explained(lambda: run(*arrays), auto_names),
            list(inputs),
            list(dtypes),
            stateful=True,
            name=f"Hpcdl{kind}",
        )
    else:
        submitters = _SUBMITTERS.setdefault(tf.compat.v1.get_default_graph(), _Submitters())
        submitters.count += 1
        [token] = tf.numpy_function(
            lambda *arrays: _submit(start, arrays, auto_names, census, kernel, submitters),
            list(inputs),
            [tf.int64],
            stateful=True,
            name=f"Hpcdl{kind}",
        )
        ready = kernel.ops.hpcdl_latch(token, name=f"Hpcdl{kind}Latch")
        outputs = tf.numpy_function(
            lambda t: _explained(_PENDING.pop(int(t))[0].result, auto_names),
            [ready],
            list(dtypes),
            stateful=True,
            name=f"Hpcdl{kind}Result",
        )
    for out, shape in zip(outputs, shapes):
        out.set_shape(shape)
    return list(outputs)


def _tensors(values: Tensors, what: str) -> list[tf.Tensor]:
    if isinstance(values, (tf.Tensor, tf.Variable)) or not isinstance(values, (list, tuple)):
        raise _errors.invalid_argument(f"{what} takes a list of tensors, got {type(values).__name__}")
    if not values:
        raise _errors.invalid_argument(f"{what} needs a non-empty list of tensors")
    return [_tensor(v, what) for v in values]


def _tensor(value: Any, what: str) -> tf.Tensor:
    if isinstance(value, tf.IndexedSlices):
        raise _errors.invalid_argument(f"{what} takes dense tensors; hvd.allreduce handles tf.IndexedSlices")
    if isinstance(value, tf.Tensor):  # nothing to convert, and a conversion's dispatch costs 8 us eagerly
        return value
    try:
        return tf.convert_to_tensor(value)
    except (TypeError, ValueError) as exc:
        raise _errors.invalid_argument(
            f"{what} takes a tf.Tensor (or a value convertible to one): {exc}"
        ) from None


def _rows(tensor: tf.Tensor, what: str) -> None:
    if tensor.shape.rank == 0:
        raise _errors.invalid_argument(
            f"{what} works on the first dimension, but got a 0-d tensor; reshape it, e.g. tf.reshape(t, [1])"
        )


def _names(
    kind: str, name: Optional[str], tensors: Sequence[tf.Tensor], process_set: ProcessSet
) -> list[Optional[str]]:
    """The engine names of one operation (one tensor) or of a group's members (``name`` None: see
    ``_graph_names``)."""
    if name is not None and not isinstance(name, str):
        raise _errors.invalid_argument(f"name must be a string or None, got {name!r}")
    if not name:
        if tf.executing_eagerly():
            return [None] * len(tensors)
        name = _graph_names.auto_name(id_of(process_set))
    if len(tensors) == 1:
        return [name]
    return [f"{name}.{i}" for i in range(len(tensors))]


def _differentiable(
    forward: Callable[[list[tf.Tensor]], list[tf.Tensor]],
    backward: Callable[[list[tf.Tensor]], list[Optional[tf.Tensor]]],
    tensors: Sequence[tf.Tensor],
) -> list[tf.Tensor]:
    """``forward(tensors)``, whose gradient is ``backward(the outputs' incoming gradients)``. Eagerly with
    no gradient tape recording, the forward alone: ``tf.custom_gradient`` inspects the function's signature
    on every call, 70 % of a small eager allreduce's time."""
    if tf.executing_eagerly() and not record.could_possibly_record():
        return forward(list(tensors))

    @tf.custom_gradient
    def op(*xs: tf.Tensor) -> Any:
        ys = forward(list(xs))

        def gradient(*dys: tf.Tensor) -> list[Optional[tf.Tensor]]:
            return backward(list(dys))

        return ys, gradient

    return list(op(*tensors))


def _gradients(
    dys: Sequence[tf.Tensor], gradient: Callable[[list[int]], list[tf.Tensor]]
) -> list[Optional[tf.Tensor]]:
    """``gradient(indices)`` for the floating-point and complex incoming gradients (in order); None for
    the others, which have no gradient."""
    wanted = [i for i, d in enumerate(dys) if d.dtype.is_floating or d.dtype.is_complex]
    grads: list[Optional[tf.Tensor]] = [None] * len(dys)
    for i, g in zip(wanted, gradient(wanted) if wanted else []):
        grads[i] = g
    return grads


# ---- allreduce, reducescatter ------------------------------------------------------------------------


_HALF = (tf.float16, tf.bfloat16)


def _rounded(tensor: tf.Tensor, factor: float) -> tf.Tensor:
    """A half-precision ``tensor`` times ``factor``, computed in float32 and rounded once."""
    return tf.cast(tf.cast(tensor, tf.float32) * factor, tensor.dtype)


def _set_size(ps: int, dtype: tf.DType) -> tf.Tensor:
    """The set's size as a ``dtype`` scalar (read when the graph runs under an elastic launch, where it
    changes between resets)."""
    if elastic.enabled() and not tf.executing_eagerly():
        return tf.cast(size_op(ps), dtype)
    return tf.cast(basics.process_set_size(ps), dtype)


def _reductions(
    kind: str,
    tensors: list[tf.Tensor],
    names: list[Optional[str]],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    groups: Sequence[int],
) -> list[tf.Tensor]:
    """The (non-differentiable) allreduce (``kind`` "Allreduce") or reducescatter ("Reducescatter") of
    ``tensors``, uint16/uint32 reduced in a wider type.

    Where rounding makes the order of operations visible, the result is what TensorFlow's own arithmetic
    gives, as with Horovod: half-precision tensors are scaled (prescale, Average's division, postscale)
    by TensorFlow around the engine's half-precision Sum, each step rounded to the dtype; and a
    floating-point allreduce with Product is ``tf.reduce_prod`` of every rank's tensor in rank order.
    """
    if op == Adasum:
        raise NotImplementedError(
            "hpcdl.tensorflow does not implement the Adasum reduction; use op=hvd.Average (or hpcdl.torch, "
            "which has Adasum)"
        )
    ps = id_of(process_set)
    floating = all(t.dtype.is_floating for t in tensors)
    if kind == "Allreduce" and op == Product and floating:
        return _product_in_rank_order(tensors, names, ps, groups)
    half = all(t.dtype in _HALF for t in tensors)
    if half and (op == Average or prescale_factor != 1.0 or postscale_factor != 1.0):
        if prescale_factor != 1.0:
            tensors = [_rounded(t, prescale_factor) for t in tensors]
        summed = _reductions(kind, tensors, names, Sum, 1.0, 1.0, process_set, groups)
        if op == Average:
            summed = [t / _set_size(ps, t.dtype) for t in summed]
        return [_rounded(t, postscale_factor) for t in summed] if postscale_factor != 1.0 else summed
    how = _engine.Reduction(
        op, float(prescale_factor), float(postscale_factor), ps, _engine.place(groups, ps)
    )
    originals = [t.dtype for t in tensors]
    wider = [reduction_dtype(t.dtype, op) for t in tensors]
    # tf.cast to the same dtype returns its input, after a dispatch that costs 8 us eagerly
    widened = [t if t.dtype == w else tf.cast(t, w) for t, w in zip(tensors, wider)]
    wires = [wire_of(t.dtype) for t in widened]
    if kind == "Allreduce":
        run, shapes = _engine.allreduce, [t.shape for t in widened]
    else:
        run, shapes = (
            _engine.reducescatter,
            [tf.TensorShape([None]).concatenate(t.shape[1:]) for t in widened],
        )

    def start(*arrays: np.ndarray) -> _engine.Started:
        return run(arrays, wires, names, how)

    reduced = _run(kind, start, widened, [t.dtype for t in widened], shapes, names, ps)
    return [r if r.dtype == d else tf.cast(r, d) for r, d in zip(reduced, originals)]


def _product_in_rank_order(
    tensors: list[tf.Tensor], names: list[Optional[str]], ps: int, groups: Sequence[int]
) -> list[tf.Tensor]:
    """Product of floating-point tensors: every rank's tensor gathered, multiplied in rank order."""
    stacked = [t[None] for t in tensors]
    wires = [wire_of(t.dtype) for t in stacked]
    placed = _engine.place(groups, ps)

    def start(*arrays: np.ndarray) -> _engine.Started:
        return _engine.allgather(arrays, wires, names, ps, placed)

    shapes = [tf.TensorShape([None]).concatenate(t.shape) for t in tensors]
    gathered = _run("Allreduce", start, stacked, [t.dtype for t in stacked], shapes, names, ps)
    return [tf.reduce_prod(g, axis=0) for g in gathered]


def reduce_tensors(
    tensors: list[tf.Tensor],
    names: list[Optional[str]],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    groups: Sequence[int],
) -> list[tf.Tensor]:
    """The (non-differentiable) allreduce of ``tensors``; ``groups``: the sizes of consecutive groups that
    run atomically."""
    return _reductions(
        "Allreduce", tensors, names, op, prescale_factor, postscale_factor, process_set, groups
    )


def _allreduce_group(
    tensors: list[tf.Tensor],
    names: list[Optional[str]],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    grouped: bool,
) -> list[tf.Tensor]:
    """Differentiable allreduce of ``tensors``, one atomic group when ``grouped``; the gradient is the
    same allreduce of the incoming gradients."""

    def groups(count: int) -> list[int]:
        return [count] if grouped else [1] * count

    def backward(dys: list[tf.Tensor]) -> list[Optional[tf.Tensor]]:
        def reduce(wanted: list[int]) -> list[tf.Tensor]:
            chosen = [dys[i] for i in wanted]
            names = _names("Allreduce", None, chosen, process_set)
            return _allreduce_group(
                chosen, names, op, prescale_factor, postscale_factor, process_set, grouped
            )

        return _gradients(dys, reduce)

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        return reduce_tensors(xs, names, op, prescale_factor, postscale_factor, process_set, groups(len(xs)))

    return _differentiable(forward, backward, tensors)


def _grouped_allreduce(
    tensors: Tensors,
    name: Optional[str] = None,
    op: int = Sum,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> list[tf.Tensor]:
    """Reduce a list of tensors as one atomic group over the ranks of ``process_set``."""
    tensors = _tensors(tensors, "grouped_allreduce")
    names = _names("Allreduce", name, tensors, process_set)
    return _allreduce_group(
        tensors, names, check_op(op), prescale_factor, postscale_factor, process_set, grouped=True
    )


def _allreduce(
    tensor: Any,
    name: Optional[str] = None,
    op: int = Sum,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor:
    """Reduce ``tensor`` over the ranks of ``process_set`` (shape and dtype must agree on every rank)."""
    tensors = [_tensor(tensor, "allreduce")]
    names = _names("Allreduce", name, tensors, process_set)
    op = check_op(op)
    return _allreduce_group(tensors, names, op, prescale_factor, postscale_factor, process_set, False)[0]


def _reducescatter_group(
    tensors: list[tf.Tensor],
    names: list[Optional[str]],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> list[tf.Tensor]:
    """Differentiable reducescatter of ``tensors`` (one group); the gradient is the allgather of the
    incoming gradient, times the set size for Sum and times the scale factors."""
    for t in tensors:
        _rows(t, "reducescatter")
    if op == Adasum:
        raise _errors.invalid_argument("reducescatter does not support Adasum; use hvd.Average or hvd.Sum")
    factor = float(prescale_factor) * float(postscale_factor)

    def gradient(dy: tf.Tensor) -> tf.Tensor:
        if op == Sum:
            dy = dy * basics.process_set_size(id_of(process_set))
        return allgather(dy * factor if factor != 1.0 else dy, process_set=process_set)

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        args = (names, op, prescale_factor, postscale_factor, process_set, [len(xs)])
        return _reductions("Reducescatter", xs, *args)

    return _differentiable(
        forward, lambda dys: _gradients(dys, lambda wanted: [gradient(dys[i]) for i in wanted]), tensors
    )


def _grouped_reducescatter(
    tensors: Tensors,
    name: Optional[str] = None,
    op: int = Sum,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[tf.Tensor]:
    """Reduce each tensor over the set and keep this rank's block of rows, as one group."""
    tensors = _tensors(tensors, "grouped_reducescatter")
    names = _names("Reducescatter", name, tensors, process_set)
    return _reducescatter_group(tensors, names, check_op(op), prescale_factor, postscale_factor, process_set)


def _reducescatter(
    tensor: Any,
    name: Optional[str] = None,
    op: int = Sum,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> tf.Tensor:
    """Reduce ``tensor`` over the set and keep this rank's block of rows (the first ``rows % size`` ranks
    get one row more)."""
    tensors = [_tensor(tensor, "reducescatter")]
    names = _names("Reducescatter", name, tensors, process_set)
    op = check_op(op)
    return _reducescatter_group(tensors, names, op, prescale_factor, postscale_factor, process_set)[0]


# ---- allgather ------------------------------------------------------------------------------------


def _my_rows(gradient: tf.Tensor, tensor: tf.Tensor, process_set: ProcessSet) -> tf.Tensor:
    """Allgather's gradient: the Average-allreduce of the incoming gradient, this rank's rows of it."""
    reduced = _allreduce(gradient, op=Average, process_set=process_set)
    rows = allgather(tf.shape(tensor, out_type=tf.int64)[:1], process_set=process_set)
    me = basics.process_set_rank(id_of(process_set))
    start = tf.reduce_sum(rows[:me])
    return reduced[start : start + rows[me]]


def _allgather_group(
    tensors: list[tf.Tensor], names: list[Optional[str]], process_set: ProcessSet
) -> list[tf.Tensor]:
    """Differentiable allgather of ``tensors`` (one group)."""
    for t in tensors:
        _rows(t, "allgather")
    ps = id_of(process_set)
    wires = [wire_of(t.dtype) for t in tensors]

    placed = _engine.place([len(tensors)], ps)

    def start(*arrays: np.ndarray) -> _engine.Started:
        return _engine.allgather(arrays, wires, names, ps, placed)

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        shapes = [tf.TensorShape([None]).concatenate(t.shape[1:]) for t in xs]
        return _run("Allgather", start, xs, [t.dtype for t in xs], shapes, names, ps)

    def backward(dys: list[tf.Tensor]) -> list[Optional[tf.Tensor]]:
        return _gradients(dys, lambda wanted: [_my_rows(dys[i], tensors[i], process_set) for i in wanted])

    return _differentiable(forward, backward, tensors)


def allgather(
    tensor: Any,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor:
    """Concatenate ``tensor`` from every rank of the set along dimension 0 (which may differ per rank)."""
    tensors = [_tensor(tensor, "allgather")]
    return _allgather_group(tensors, _names("Allgather", name, tensors, process_set), process_set)[0]


def grouped_allgather(
    tensors: Tensors,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> list[tf.Tensor]:
    """Allgather a list of tensors as one group."""
    tensors = _tensors(tensors, "grouped_allgather")
    return _allgather_group(tensors, _names("Allgather", name, tensors, process_set), process_set)


# ---- broadcast ----------------------------------------------------------------------------------------


def _check_root(root_rank: Any, process_set: ProcessSet) -> int:
    if not isinstance(root_rank, (int, np.integer)) or isinstance(root_rank, bool):
        raise _errors.invalid_argument(f"root_rank must be an int (a global rank), got {root_rank!r}")
    members = basics.process_set_ranks(id_of(process_set))
    if int(root_rank) not in members:
        raise _errors.invalid_argument(
            f"root_rank {root_rank} is not a member of {process_set} (ranks {members}); "
            "broadcast roots are global ranks, as in Horovod"
        )
    return int(root_rank)


def _broadcast(
    tensors: list[tf.Tensor], names: list[Optional[str]], root: int, process_set: ProcessSet
) -> list[tf.Tensor]:
    ps = id_of(process_set)
    wires = [wire_of(t.dtype) for t in tensors]

    def start(*arrays: np.ndarray) -> _engine.Started:
        return _engine.broadcast(arrays, wires, names, root, ps)

    shapes = [t.shape for t in tensors]
    return _run("Broadcast", start, tensors, [t.dtype for t in tensors], shapes, names, ps)


def broadcast(
    tensor: Any,
    root_rank: int,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor:
    """``tensor`` as it is on global rank ``root_rank``, on every rank of the set."""
    tensor = _tensor(tensor, "broadcast")
    root = _check_root(root_rank, process_set)
    names = _names("Broadcast", name, [tensor], process_set)

    def gradient(dy: tf.Tensor) -> tf.Tensor:
        reduced = _allreduce(dy, op=Average, process_set=process_set)
        return reduced if basics.rank() == root else reduced * 0

    def backward(dys: list[tf.Tensor]) -> list[Optional[tf.Tensor]]:
        return _gradients(dys, lambda wanted: [gradient(dys[i]) for i in wanted])

    return _differentiable(lambda xs: _broadcast(xs, names, root, process_set), backward, [tensor])[0]


def broadcast_(
    variables: Sequence[tf.Variable],
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> list[tf.Tensor]:
    """Overwrite ``variables`` in place with their values on global rank ``root_rank``; returns the new
    values."""
    variables = list(variables)
    if not variables:
        return []
    if not all(isinstance(v, tf.Variable) for v in variables):
        raise _errors.invalid_argument("broadcast_ works in place and takes a list of tf.Variable")
    root = _check_root(root_rank, process_set)
    values = [tf.convert_to_tensor(v) for v in variables]
    names = _names("Broadcast", name, values, process_set)
    received = _broadcast(values, names, root, process_set)
    return [v.assign(r) for v, r in zip(variables, received)]


# ---- alltoall -----------------------------------------------------------------------------------------


def _static_splits(splits: Any) -> Optional[list[int]]:
    """Splits given as Python/NumPy integers (checked now); None for a tensor (checked when it runs)."""
    if isinstance(splits, (tf.Tensor, tf.Variable)) and not tf.executing_eagerly():
        return None
    return [int(s) for s in np.asarray(splits).reshape(-1)]


def _checked_splits(splits: Optional[list[int]], rows: int, set_size: int) -> Optional[list[int]]:
    if splits is None:
        if rows % set_size:
            raise _errors.invalid_argument(
                f"alltoall without splits divides dim 0 evenly, but {rows} rows do not divide among "
                f"{set_size} ranks; pass splits=[rows for each rank]"
            )
        return None
    if len(splits) != set_size or any(s < 0 for s in splits) or sum(splits) != rows:
        raise _errors.invalid_argument(
            f"alltoall splits {splits} must have one non-negative entry per rank of the set ({set_size}) "
            f"and sum to the tensor's first dimension ({rows})"
        )
    return splits


def alltoall(
    tensor: Any,
    splits: Any = None,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Send ``splits[i]`` rows of ``tensor`` to rank i of the set (an even split when None). Returns the
    rows received, and when ``splits`` was given also the rows received from each rank (int32)."""
    tensor = _tensor(tensor, "alltoall")
    _rows(tensor, "alltoall")
    ps = id_of(process_set)
    set_size = basics.process_set_size(ps)
    wire = wire_of(tensor.dtype)
    [op_name] = _names("Alltoall", name, [tensor], process_set)
    known = _static_splits(splits) if splits is not None else None
    if tensor.shape[0] is not None and (splits is None or known is not None):
        _checked_splits(known, int(tensor.shape[0]), set_size)
    inputs = [tensor] if splits is None else [tensor, tf.cast(tf.reshape(splits, [-1]), tf.int64)]

    def start(array: np.ndarray, *given: np.ndarray) -> _engine.Started:
        wanted = [int(s) for s in given[0]] if given else None
        checked = _checked_splits(wanted, array.shape[0], basics.process_set_size(ps))
        return _engine.alltoall(array, wire, checked, op_name, ps)

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        shapes = [tf.TensorShape([None]).concatenate(tensor.shape[1:]), tf.TensorShape([set_size])]
        return _run("Alltoall", start, xs, [tensor.dtype, tf.int32], shapes, [op_name], ps)

    def backward(dys: list[tf.Tensor]) -> list[Optional[tf.Tensor]]:
        def reverse(wanted: list[int]) -> list[tf.Tensor]:
            return [alltoall(dys[0], splits=received, process_set=process_set)[0]]

        return _gradients(dys[:1], reverse) + [None] * (len(inputs) - 1)

    output, received = _differentiable(forward, backward, inputs)
    return (output, received) if splits is not None else output


# ---- join, barrier, values read when a graph runs -----------------------------------------------------


def join(process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Declare that this rank has no more data. Until every rank joined, this rank takes part in the
    others' allreduces with zeros. Returns the last rank to join (an int32 scalar)."""
    ps = id_of(process_set)
    [last] = _run("Join", lambda: _engine.join(ps), [], [tf.int32], [tf.TensorShape([])])
    return last


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of the set has reached this barrier."""
    ps = id_of(process_set)
    _run("Barrier", lambda: _engine.barrier(ps), [], [tf.int32], [tf.TensorShape([])])


def _read(read: Callable[[], int]) -> list[np.ndarray]:
    return [np.asarray(read(), dtype=np.int32)]


def _value_op(kind: str, read: Callable[[], int]) -> tf.Tensor:
    """A value read when the graph runs (no engine operation: one op, which does not wait)."""
    if tf.executing_eagerly():
        return tf.constant(read(), dtype=tf.int32)
    [value] = tf.numpy_function(lambda: _read(read), [], [tf.int32], stateful=True, name=f"Hpcdl{kind}")
    value.set_shape([])
    return value


def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks of the set, read when the graph runs (an int32 scalar)."""
    return _value_op("Size", lambda: basics.process_set_size(process_set_id))


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks on this host, read when the graph runs."""
    return _value_op("LocalSize", basics.local_size)


def rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This rank, read when the graph runs."""
    return _value_op("Rank", basics.rank)


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This rank's index on its host, read when the graph runs."""
    return _value_op("LocalRank", basics.local_rank)


def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """1 when this rank belongs to the set, else 0, read when the graph runs."""
    return _value_op("ProcessSetIncluded", lambda: int(basics.process_set_rank(process_set_id) >= 0))
