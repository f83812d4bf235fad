"""Batch normalization on the device: ``native_batch_norm`` (what ``F.batch_norm`` and
``nn.BatchNorm*d`` reach), the ``_native_batch_norm_legit*`` forms (what exported and
compiled graphs call) and ``native_batch_norm_backward``.

The math is :mod:`hologram_torch.lowering.norm`. One program computes the output, the
saved statistics and, in training with running statistics, the new running statistics,
written into the running tensors in place (as torch updates them). What the lowering does
not take (empty inputs, mismatched shapes, non-float dtypes) runs through the CPU
fallback, which gives torch's result or raises torch's error.
"""

from __future__ import annotations

import torch
import torch._decomp
import torch._prims_common as _prims

from hologram_torch import memory
from hologram_torch.aten import from_table, layout, runner
from hologram_torch.aten.registry import aten, composed, impl
from hologram_torch.aten.runner import ISA
from hologram_torch.fallback import run_on_cpu
from hologram_torch.lowering import Unsupported, norm  # (importing registers the entries)

OPINFO = ("nn.functional.batch_norm", "native_batch_norm", "_native_batch_norm_legit")


def _stats_dtype(x: torch.Tensor, weight: torch.Tensor | None) -> torch.dtype:
    mixed = (weight is not None and weight.dtype is torch.float32
             and x.dtype in (torch.float16, torch.bfloat16))
    return torch.float32 if mixed else x.dtype


def _native(*tensors) -> bool:
    return all(t is None or (t.dtype.is_floating_point and t.dtype in ISA
                             and not t.is_cpu) for t in tensors)


def _update_in_place(x, weight, bias, running_mean, running_var, momentum, eps):
    """Training with running statistics: one program, the running tensors its outputs."""
    c = x.shape[1]
    stats = _stats_dtype(x, weight)
    out = (memory.empty(x.shape, x.dtype, layout.suggested(x)), memory.empty((c,), stats),
           memory.empty((c,), stats), running_mean, running_var)
    r = from_table.call(aten._native_batch_norm_legit_functional.default, x, weight, bias,
                     running_mean, running_var, True, float(momentum), float(eps),
                     out=out, name="batch_norm_train", file=True)
    return NotImplemented if r is NotImplemented else out[:3]


def _forward(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """The three results of ``native_batch_norm``, or NotImplemented."""
    if not _native(x, weight, bias, running_mean, running_var):
        return NotImplemented
    if training and running_mean is not None and running_var is not None:
        return _update_in_place(x, weight, bias, running_mean, running_var, momentum, eps)
    if training:
        return from_table.call(aten._native_batch_norm_legit.no_stats, x, weight, bias, True,
                            float(momentum), float(eps), name="batch_norm_batch_stats")
    if running_mean is None or running_var is None:
        return NotImplemented  # torch raises
    # The output only: the empty statistics are made here (a program's empty outputs cost
    # launches of their own).
    params = tuple(p for p in (weight, bias) if p is not None)
    try:
        out = runner.run("batch_norm_eval", _inference, (x, running_mean, running_var,
                                                          *params),
                          (weight is not None, bias is not None, float(eps)),
                          layout=layout.like_first)
    except (runner.Unsupported, Unsupported):
        return NotImplemented
    stats = _stats_dtype(x, weight)
    return out, memory.empty((0,), stats), memory.empty((0,), stats)


def _inference(g, x, running_mean, running_var, *rest):
    *params, has_weight, has_bias, eps = rest
    weight = params.pop(0) if has_weight else None
    bias = params.pop(0) if has_bias else None
    return norm.inference(g, x, weight, bias, running_mean, running_var, eps)


@impl("native_batch_norm", hot=True)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum,
                      eps):
    r = _forward(input, weight, bias, running_mean, running_var, training, momentum, eps)
    if r is NotImplemented:
        return run_on_cpu(aten.native_batch_norm.default, input, weight, bias, running_mean,
                          running_var, training, momentum, eps)
    return r


@impl("_native_batch_norm_legit")
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training,
                            momentum, eps):
    r = _forward(input, weight, bias, running_mean, running_var, training, momentum, eps)
    if r is NotImplemented:
        return run_on_cpu(aten._native_batch_norm_legit.default, input, weight, bias,
                          running_mean, running_var, training, momentum, eps)
    return r


@impl("_native_batch_norm_legit.no_stats")
def native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    r = _forward(input, weight, bias, None, None, training, momentum, eps) if training \
        else NotImplemented
    if r is NotImplemented:
        return run_on_cpu(aten._native_batch_norm_legit.no_stats, input, weight, bias,
                          training, momentum, eps)
    return r


@impl("_native_batch_norm_legit_no_training")
def native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var,
                                        momentum, eps):
    r = _forward(input, weight, bias, running_mean, running_var, False, momentum, eps)
    if r is NotImplemented:
        return run_on_cpu(aten._native_batch_norm_legit_no_training.default, input, weight,
                          bias, running_mean, running_var, momentum, eps)
    return r


@impl("_native_batch_norm_legit_functional")
def native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var,
                                       training, momentum, eps):
    r = NotImplemented
    if _native(input, weight, bias, running_mean, running_var):
        r = from_table.call(aten._native_batch_norm_legit_functional.default, input, weight,
                         bias, running_mean, running_var, bool(training), float(momentum),
                         float(eps), name="batch_norm_functional")
    if r is NotImplemented:
        return run_on_cpu(aten._native_batch_norm_legit_functional.default, input, weight,
                          bias, running_mean, running_var, training, momentum, eps)
    return r


@impl("native_batch_norm_backward", hot=True)
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                               save_invstd, train, eps, output_mask):
    mask = (bool(output_mask[0]), bool(output_mask[1]) and weight is not None,
            bool(output_mask[2]))
    r = NotImplemented
    if _native(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd):
        r = from_table.call(aten.native_batch_norm_backward.default, grad_out, input, weight,
                         running_mean, running_var, save_mean, save_invstd, bool(train),
                         float(eps), mask, name="batch_norm_backward",
                         file=True) if any(mask) else ()
    if r is NotImplemented:
        return run_on_cpu(aten.native_batch_norm_backward.default, grad_out, input, weight,
                          running_mean, running_var, save_mean, save_invstd, train, eps,
                          output_mask)
    results = iter((r,) if isinstance(r, torch.Tensor) else r)
    return tuple(next(results) if m else None for m in mask)


# --- group norm ---------------------------------------------------------------------------
# PyTorch's composite kernel, which the device ran, views its input as (1, N * groups, -1):
# a channels_last input cannot be viewed so. The CPU's kernel takes any layout and lays its
# result out in the input's suggested memory format; here the same decomposition (batch
# statistics over each group, natively) runs on a contiguous input, and the result is laid
# out back.
_group_norm = torch._decomp.decomposition_table[aten.native_group_norm.default]


@composed("native_group_norm")
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    out, mean, rstd = _group_norm(input.contiguous(), weight, bias, N, C, HxW, group, eps)
    strides = layout.suggested(input)
    if tuple(out.stride()) != strides and out.numel():
        out = out.contiguous(memory_format=_prims.suggest_memory_format(input))
    return out, mean, rstd
