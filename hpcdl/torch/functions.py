"""Broadcasting model and optimizer state, and arbitrary Python objects (Horovod's ``functions.py``)."""

from __future__ import annotations

import collections
from typing import Any, Callable, Optional

import torch

from hpcdl.common import payloads
from hpcdl.torch.async_ops import broadcast_async_, synchronize
from hpcdl.torch.basics import rank
from hpcdl.torch.ops import allgather, broadcast_
from hpcdl.torch.process_sets import ProcessSet, global_process_set, id_of


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite every rank's tensors with those of ``root_rank``.

    ``params`` is a dict such as ``model.state_dict()`` (broadcast in sorted-name order) or a list of
    tensors or of ``(name, tensor)`` pairs such as ``list(model.named_parameters())``. All broadcasts run
    concurrently and are waited for together.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(
            f"invalid params of type: {type(params)}; pass model.state_dict() or "
            "list(model.named_parameters())"
        )
    handles = [broadcast_async_(p, root_rank, name) for name, p in items]
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None) -> None:
    """Make every rank's optimizer state (tensors such as momentum buffers, and options such as the
    learning rate) equal to that of ``root_rank``. A fresh optimizer's state is created first by a
    zero-gradient step so that all ranks have the same structure."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        _initialize_state(optimizer, model)
        state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        return  # a stateless optimizer (e.g. plain SGD): nothing to broadcast

    tensors: list[tuple[str, torch.Tensor]] = []
    scalars: dict[str, Any] = {}
    assign: dict[str, Callable[[Any], None]] = {}
    occurrences: dict[str, int] = collections.defaultdict(int)

    def set_option(index: int, key: str) -> Callable[[Any], None]:
        def apply(value: Any) -> None:
            optimizer.param_groups[index][key] = value

        return apply

    def set_state(pid: Any, key: str) -> Callable[[Any], None]:
        def apply(value: Any) -> None:
            state_dict["state"][pid][key] = value

        return apply

    for index, group in enumerate(state_dict["param_groups"]):
        for key, value in group.items():
            if key == "params":
                continue
            scalar_key = f"{key}.{index}"
            scalars[scalar_key] = value
            assign[scalar_key] = set_option(index, key)
        for pid in group["params"]:
            if pid not in state_dict["state"]:
                continue
            for key, value in state_dict["state"][pid].items():
                occurrences[key] += 1
                unique = f"{key}.{occurrences[key]}"
                if torch.is_tensor(value):
                    tensors.append((unique, value))
                else:
                    scalars[unique] = value
                    assign[unique] = set_state(pid, key)

    # state_dict() shares the optimizer's state tensors, so broadcasting them in place updates it.
    broadcast_parameters(tensors, root_rank)
    for key, value in broadcast_object(scalars, root_rank).items():
        assign[key](value)


def _initialize_state(optimizer: torch.optim.Optimizer, model: Any) -> None:
    sparse_params: set[int] = set()
    if model is not None:
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding) and module.sparse:
                sparse_params.update(id(p) for p in module.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                    isinstance(optimizer, torch.optim.SGD) and id(p) in sparse_params
                ):
                    p.grad = p.grad.to_sparse()
    # A DistributedOptimizer's step() would start allreduces that the other ranks never join here, so
    # step the wrapped optimizer class directly.
    step = getattr(optimizer, "_hpcdl_local_step", None)
    if step is not None:
        step()
    else:
        optimizer.step()
    # Unlike Horovod, the initializing step does not count: Adam's bias correction (and any other
    # step-counting optimizer) then behaves exactly as if training started from a fresh optimizer.
    for state in optimizer.state.values():
        count = state.get("step")
        if torch.is_tensor(count):
            count.zero_()
        elif isinstance(count, (int, float)):
            state["step"] = type(count)(0)


def broadcast_object(
    obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> Any:
    """Return ``root_rank``'s ``obj`` on every rank of the set (serialized with cloudpickle).

    Non-root ranks may pass anything (e.g. None): unlike Horovod, the default operation name does not
    depend on the object's type, so ``broadcast_object(x if rank == 0 else None)`` works. The payload
    travels with a MAC that receivers check before unpickling it (:mod:`hpcdl.common.payloads`).
    """
    name = name or "broadcast_object"
    operation = payloads.operation("broadcast_object", id_of(process_set), name)
    if rank() == root_rank:
        payload = torch.frombuffer(operation.pickle(root_rank, obj), dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
        broadcast_(length, root_rank, name + ".sz", process_set)
    else:
        length = torch.zeros(1, dtype=torch.int64)
        broadcast_(length, root_rank, name + ".sz", process_set)
        payload = torch.empty(operation.check_length(root_rank, int(length.item())), dtype=torch.uint8)
    broadcast_(payload, root_rank, name + ".t", process_set)
    if rank() == root_rank:
        return obj
    return operation.unpickle(root_rank, payload.numpy())


def allgather_object(
    obj: Any, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> list:
    """Return the list of every rank's ``obj`` (in rank order of the set); objects may differ in type.
    Every piece is checked against its MAC before any is unpickled (:mod:`hpcdl.common.payloads`)."""
    name = name or "allgather_object"
    operation = payloads.operation("allgather_object", id_of(process_set), name)
    payload = torch.frombuffer(operation.pickle(process_set.rank(), obj), dtype=torch.uint8)
    lengths = allgather(
        torch.tensor([payload.numel()], dtype=torch.int64), name=name + ".sz", process_set=process_set
    )
    gathered = allgather(payload, name=name + ".t", process_set=process_set)
    return operation.unpickle_pieces(lengths.tolist(), gathered.numpy())
