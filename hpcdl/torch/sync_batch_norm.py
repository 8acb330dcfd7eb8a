"""``SyncBatchNorm``: batch normalization whose statistics cover the whole global batch.

In training every rank contributes its per-channel count, sum and sum of squares (float64) to one Sum
allreduce, so each rank normalizes with the mean and variance of the concatenated batch; backward
allreduces the two per-channel sums the input gradient needs. Works for CPU and CUDA tensors (Horovod's
only takes CUDA). The weight and bias gradients stay local, as in Horovod: ``DistributedOptimizer``
reduces them with the other gradients.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from hpcdl.torch.async_ops import allreduce_async, synchronize
from hpcdl.torch.basics import size
from hpcdl.torch.reduce_ops import Sum


def _channel_view(t: torch.Tensor, shape_like: torch.Tensor) -> torch.Tensor:
    return t.view(1, -1, *([1] * (shape_like.dim() - 2)))


class SyncBatchNorm(_BatchNorm):
    """Drop-in for ``torch.nn.BatchNorm1d/2d/3d`` that normalizes over the global batch.

    Args: as ``torch.nn.BatchNorm2d``: num_features, eps=1e-5, momentum=0.1 (None: cumulative average),
    affine=True, track_running_stats=True.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _momentum(self) -> float:
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return float(self.momentum)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats or size() == 1:
            momentum = self._momentum() if (self.training and self.track_running_stats) else 0.0
            return F.batch_norm(
                input,
                self.running_mean,
                self.running_var,
                self.weight,
                self.bias,
                use_batch_stats,
                momentum,
                self.eps,
            )
        update = self.training and self.track_running_stats
        return _SyncBatchNormFunction.apply(
            input,
            self.weight,
            self.bias,
            self.running_mean if update else None,
            self.running_var if update else None,
            self.eps,
            self._momentum() if update else 0.0,
        )


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum):  # type: ignore[override]
        x = input.contiguous()
        dims = [0, *range(2, x.dim())]
        local = x.to(torch.float64)
        count = torch.tensor([x.numel() // x.shape[1]], dtype=torch.float64, device=x.device)
        stats = torch.cat([count, local.sum(dims), (local * local).sum(dims)])
        stats = synchronize(allreduce_async(stats, op=Sum, name="sync_batch_norm.stats"))
        channels = x.shape[1]
        total = stats[0]
        mean = stats[1 : 1 + channels] / total
        var = (stats[1 + channels :] / total - mean * mean).clamp_min(0.0)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                unbiased = var * (total / (total - 1)) if total > 1 else var
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        mean_x, invstd_x = mean.to(x.dtype), invstd.to(x.dtype)
        xhat = (x - _channel_view(mean_x, x)) * _channel_view(invstd_x, x)
        out = xhat
        if weight is not None:
            out = out * _channel_view(weight, x)
        if bias is not None:
            out = out + _channel_view(bias, x)
        ctx.save_for_backward(xhat, weight, invstd_x)
        ctx.total = float(total)
        return out

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        xhat, weight, invstd = ctx.saved_tensors
        dy = grad_output.contiguous()
        dims = [0, *range(2, dy.dim())]
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        grad_weight = sum_dy_xhat if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sum_dy if ctx.needs_input_grad[2] else None
        grad_input = None
        if ctx.needs_input_grad[0]:
            channels = dy.shape[1]
            sums = synchronize(
                allreduce_async(torch.cat([sum_dy, sum_dy_xhat]), op=Sum, name="sync_batch_norm.grad_sums")
            )
            g_dy, g_dy_xhat = sums[:channels], sums[channels:]
            scale = invstd if weight is None else invstd * weight
            grad_input = _channel_view(scale / ctx.total, dy) * (
                ctx.total * dy - _channel_view(g_dy, dy) - xhat * _channel_view(g_dy_xhat, dy)
            )
        return grad_input, grad_weight, grad_bias, None, None, None, None


def convert_sync_batchnorm(module: Any) -> Any:
    """Replace every ``torch.nn.BatchNorm*d`` in ``module`` by an equivalent ``SyncBatchNorm``."""
    result = module
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        result = SyncBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats
        )
        if module.affine:
            with torch.no_grad():
                result.weight.copy_(module.weight)
                result.bias.copy_(module.bias)
        if module.track_running_stats:
            result.running_mean.copy_(module.running_mean)
            result.running_var.copy_(module.running_var)
            result.num_batches_tracked.copy_(module.num_batches_tracked)
    for name, child in module.named_children():
        result.add_module(name, convert_sync_batchnorm(child))
    return result
