"""The batch-norm statistics ops of ``nn.SyncBatchNorm``, composed of device ops.

``nn.SyncBatchNorm`` accepts PrivateUse1 devices, and in distributed training computes
each rank's per-channel statistics, gathers them, and normalizes with the global ones
through ``batch_norm_stats``, ``batch_norm_gather_stats(_with_counts)``,
``batch_norm_elemt``, ``batch_norm_backward_reduce`` and ``batch_norm_backward_elemt``:
ops with CUDA kernels only, which the CPU fallback cannot run. Here each is its formula
on device tensors (statistics of half types in float32, as the CUDA kernels keep them).
The channel is dimension 1; every other dimension is reduced.
"""

from __future__ import annotations

import torch

from hologram_torch.aten.registry import composed


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _dims(x: torch.Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


def _channel(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-channel vector shaped to broadcast against ``like`` (channel dim 1)."""
    return t.reshape(-1, *(1,) * (like.dim() - 2))


@composed("batch_norm_stats")
def batch_norm_stats(input, eps):
    x = input.to(_acc(input.dtype))
    mean = x.mean(_dims(x))
    var = (x - _channel(mean, x)).square().mean(_dims(x))  # biased, as normalization uses
    return mean, (var + eps).rsqrt()


def _gather(mean, invstd, running_mean, running_var, momentum, eps, counts):
    # Merge the ranks' (count, mean, variance) as Chan's parallel variance does: the
    # global second moment is each rank's plus its mean's spread around the global mean.
    counts = counts.to(mean.dtype).reshape(-1, 1)
    total = counts.sum()
    global_mean = (counts * mean).sum(0) / total
    var = (invstd.square().reciprocal() - eps)
    m2 = (counts * (var + (mean - global_mean).square())).sum(0)
    global_invstd = (m2 / total + eps).rsqrt()
    if running_mean is not None:
        running_mean.copy_(running_mean * (1 - momentum) + global_mean * momentum)
    if running_var is not None:
        unbiased = m2 / (total - 1)
        running_var.copy_(running_var * (1 - momentum) + unbiased * momentum)
    return global_mean, global_invstd


@composed("batch_norm_gather_stats_with_counts")
def batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var,
                                        momentum, eps, counts):
    return _gather(mean, invstd, running_mean, running_var, momentum, eps, counts)


@composed("batch_norm_gather_stats")
def batch_norm_gather_stats(input, mean, invstd, running_mean, running_var, momentum, eps,
                            count):
    counts = torch.full((mean.shape[0],), count, dtype=mean.dtype, device=mean.device)
    return _gather(mean, invstd, running_mean, running_var, momentum, eps, counts)


@composed("batch_norm_elemt")
def batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    out = (input - _channel(mean, input)) * _channel(invstd, input)
    if weight is not None:
        out = out * _channel(weight, input)
    if bias is not None:
        out = out + _channel(bias, input)
    return out.to(input.dtype)


@composed("batch_norm_backward_reduce")
def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g,
                               bias_g):
    dy = grad_out.to(mean.dtype)
    sum_dy = dy.sum(_dims(dy))
    sum_dy_xmu = (dy * (input.to(mean.dtype) - _channel(mean, input))).sum(_dims(dy))
    dtype = weight.dtype if weight is not None else mean.dtype
    grad_weight = (sum_dy_xmu * invstd).to(dtype) if weight_g else None
    grad_bias = sum_dy.to(dtype) if bias_g else None
    if not input_g:
        return None, None, grad_weight, grad_bias
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


@composed("batch_norm_backward_elemt")
def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu,
                              count):
    # count: every rank's element count per channel (int32), so their sum is the global N.
    total = count.sum().to(mean.dtype)
    x_mu = input.to(mean.dtype) - _channel(mean, input)
    scale = _channel(invstd, input)
    grad = (grad_out.to(mean.dtype) - _channel(sum_dy / total, input)
            - x_mu * scale.square() * _channel(sum_dy_xmu / total, input)) * scale
    if weight is not None:
        grad = grad * _channel(weight.to(mean.dtype), input)
    return grad.to(input.dtype)
