"""Batch normalization: the forward ops (with and without running statistics, training and
inference) and their backward, as PyTorch's CPU kernels compute them.

Statistics are per channel (dimension 1) over every other dimension, in opmath (float32
for half types): the mean first, then the sum of squared deviations (two passes, as
torch). The output is ``x * alpha + beta`` with ``alpha = invstd * weight`` and
``beta = bias - mean * alpha`` (torch's rounding). Running statistics move by
``momentum`` towards the batch mean and the *unbiased* batch variance. The statistics'
dtype is at::native's param_scalar_type (:func:`hologram_torch.lowering.nn.stats_dtype`).
"""

from __future__ import annotations

import math

from hologram.isa import dtypes as dt
from hologram_torch.lowering.common import Unsupported, aten, cast, opmath, register
from hologram_torch.lowering.nn import stats_dtype


def _check(x, *params) -> None:
    """Shapes and dtypes torch accepts (anything else: torch raises, eagerly)."""
    if x.ndim < 2 or not x.dtype.is_float or math.prod(x.shape) == 0:
        raise Unsupported("batch_norm input")  # torch raises (empty input included)
    for p in params:
        if p is not None and (p.shape != (x.shape[1],) or not p.dtype.is_float):
            raise Unsupported("batch_norm parameter shapes")


def _axes(x) -> tuple[int, ...]:
    return (0, *range(2, x.ndim))


def _channel(t, x):
    """A per-channel vector viewed to broadcast against ``x`` (channels on dimension 1)."""
    return t.reshape(x.shape[1], *(1,) * (x.ndim - 2))


def _batch_stats(g, xo, eps):
    """(mean, invstd, sum of squared deviations) per channel of ``xo`` (in opmath)."""
    axes = _axes(xo)
    count = math.prod(xo.shape[d] for d in axes)
    mean = g.reduce("sum", xo, axes) / count
    d = xo - _channel(mean, xo)
    var_sum = g.reduce("sum", d * d, axes)
    invstd = 1.0 / g.unary("sqrt", var_sum / count + eps)
    return mean, invstd, var_sum


def _running_invstd(g, running_var, acc, eps):
    return 1.0 / g.unary("sqrt", cast(running_var, acc) + eps)


def _transform(g, x, xo, weight, bias, mean, invstd):
    acc = xo.dtype
    alpha = invstd if weight is None else invstd * cast(weight, acc)
    beta = -(mean * alpha) if bias is None else cast(bias, acc) - mean * alpha
    # one fused multiply-add, as torch's build contracts it (with a zero variance its
    # residue is the whole result)
    return cast(g.fma(xo, _channel(alpha, x), _channel(beta, x)), x.dtype)


def _empty_stats(g, dtype: dt.DType):
    """The (0,)-shaped statistics torch returns in inference mode."""
    return cast(g.arange(0), dtype)


def inference(g, x, weight, bias, running_mean, running_var, eps):
    """The output of batch normalization with the running statistics (inference)."""
    _check(x, weight, bias, running_mean, running_var)
    if running_mean is None or running_var is None:
        raise Unsupported("inference without running statistics")  # torch raises
    acc = opmath(x.dtype)
    return _transform(g, x, cast(x, acc), weight, bias, cast(running_mean, acc),
                      _running_invstd(g, running_var, acc, float(eps)))


def _forward(g, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new running mean, new running var); the running
    statistics are None where absent."""
    _check(x, weight, bias, running_mean, running_var)
    acc, stats = opmath(x.dtype), stats_dtype(x, weight)
    if not training:
        out = inference(g, x, weight, bias, running_mean, running_var, eps)
        return (out, _empty_stats(g, stats), _empty_stats(g, stats), running_mean,
                running_var)
    xo = cast(x, acc)
    mean, invstd, var_sum = _batch_stats(g, xo, float(eps))
    out = _transform(g, x, xo, weight, bias, mean, invstd)
    new_mean = new_var = None
    m = float(momentum)
    if running_mean is not None:
        new_mean = cast(mean * m + cast(running_mean, acc) * (1.0 - m), running_mean.dtype)
    if running_var is not None:
        count = math.prod(x.shape) // x.shape[1]
        unbiased = var_sum / float(count - 1)  # 0/0 = NaN for one value, as torch
        new_var = cast(unbiased * m + cast(running_var, acc) * (1.0 - m), running_var.dtype)
    return out, cast(mean, stats), cast(invstd, stats), new_mean, new_var


@register(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(g, input, weight, bias, running_mean, running_var, training,
                          momentum, eps):
    """(out, save_mean, save_invstd, running_mean_out, running_var_out)."""
    return _forward(g, input, weight, bias, running_mean, running_var, training, momentum,
                    eps)


@register(aten._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(g, input, weight, bias, training, momentum, eps):
    """Batch statistics only (``training`` must hold: torch rejects inference without
    running statistics)."""
    return _forward(g, input, weight, bias, None, None, training, momentum, eps)[:3]


@register(aten._native_batch_norm_legit_no_training.default)
def batch_norm_inference(g, input, weight, bias, running_mean, running_var, momentum, eps):
    return _forward(g, input, weight, bias, running_mean, running_var, False, momentum,
                    eps)[:3]


@register(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(g, grad_out, input, weight, running_mean, running_var,
                               save_mean, save_invstd, train, eps, output_mask):
    """(grad_input, grad_weight, grad_bias), None where ``output_mask`` is off (and for
    grad_weight without a weight). torch's CPU formula: in training
    ``dx = (dy - mean(dy) - (x - mean) * dot(x - mean, dy) invstd² / n) invstd w``,
    in inference ``dx = dy invstd w``."""
    x = input
    # In inference the saved statistics are torch's empty placeholders: not read.
    _check(x, weight, running_mean, running_var, *((save_mean, save_invstd) if train else ()))
    if grad_out.shape != x.shape or not grad_out.dtype.is_float:
        raise Unsupported("batch_norm_backward grad shape")
    acc, stats = opmath(x.dtype), stats_dtype(x, weight)
    if train:
        if save_mean is None or save_invstd is None:
            raise Unsupported("training backward without saved statistics")
        mean, invstd = cast(save_mean, acc), cast(save_invstd, acc)
    else:
        if running_mean is None or running_var is None:
            raise Unsupported("inference backward without running statistics")
        mean = cast(running_mean, acc)
        invstd = _running_invstd(g, running_var, acc, float(eps))
    axes = _axes(x)
    count = math.prod(x.shape[d] for d in axes)
    xo, dy = cast(x, acc), cast(grad_out, acc)
    centered = xo - _channel(mean, x)
    sum_dy = g.reduce("sum", dy, axes)
    dotp = g.reduce("sum", centered * dy, axes)
    scale = invstd if weight is None else invstd * cast(weight, acc)
    results: list = [None, None, None]
    if output_mask[0]:
        if train:
            k = dotp * invstd * invstd / count
            dx = (dy - _channel(sum_dy / count, x) - centered * _channel(k, x)) \
                * _channel(scale, x)
        else:
            dx = dy * _channel(scale, x)
        results[0] = cast(dx, x.dtype)
    if output_mask[1] and weight is not None:
        results[1] = cast(dotp * invstd, stats)
    if output_mask[2]:
        results[2] = cast(sum_dy, stats)
    return tuple(results)
