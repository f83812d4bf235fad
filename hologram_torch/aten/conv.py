"""Convolutions (1-3d, grouped, dilated, transposed; forward and backward).

For a device other than CPU and CUDA, PyTorch's ``convolution`` and
``convolution_backward`` call ``convolution_overrideable`` and
``convolution_backward_overrideable``, whose default kernels only raise
``NotImplementedError``. Both run the lowering of ``convolution`` /
``convolution_backward`` (:mod:`hologram_torch.lowering.conv`: im2col, batched GEMMs and
a col2im scatter-add), transposed or not. What that lowering does not take (complex or
integer dtypes, unbatched inputs, arguments PyTorch rejects) runs PyTorch's CPU
convolution on tensors aliasing the device memory, counted and warned about as a fallback
(``fallback_stats()`` lists those under the overrideable names), so PyTorch's own errors
and results come back. Padding modes (``same``, ``reflect``, ``circular``...) and double
backward are composite ops above these two.
"""

from __future__ import annotations

import torch
import torch._prims_common as _prims

from hologram_torch import memory
from hologram_torch.aten import from_table, layout
from hologram_torch.aten.from_table import static
from hologram_torch.aten.registry import aten, composed
from hologram_torch.fallback import run_on_cpu_as

OPINFO = ("nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d",
          "nn.functional.conv_transpose1d", "nn.functional.conv_transpose2d",
          "nn.functional.conv_transpose3d")


def _convolution(input, weight, bias, stride, padding, dilation, transposed,
                 output_padding, groups):
    return aten.convolution.default(input, weight, bias, stride, padding, dilation,
                                    transposed, output_padding, groups)


def _bias_sizes(weight, transposed, groups, output_mask):
    # The bias' gradient is a sum of grad_output over all but the channel dimension;
    # convolution_backward wants the bias' shape to produce it.
    channels = weight.size(1) * groups if transposed else weight.size(0)
    return [channels] if output_mask[2] else None


def _convolution_backward(grad_output, input, weight, stride, padding, dilation,
                          transposed, output_padding, groups, output_mask):
    return aten.convolution_backward.default(
        grad_output, input, weight, _bias_sizes(weight, transposed, groups, output_mask),
        stride, padding, dilation, transposed, output_padding, groups, output_mask)


def _expanded(values, dims: int) -> tuple[int, ...] | None:
    values = tuple(int(v) for v in values)
    values = values * dims if len(values) == 1 else values
    return values if len(values) == dims else None


def _out_shape(input, weight, stride, padding, dilation, transposed, output_padding,
               groups) -> tuple[int, ...] | None:
    """The convolution's output shape, or None where PyTorch raises (its kernel then runs
    on the CPU, for its error)."""
    dims = weight.dim() - 2
    if input.dim() != weight.dim() or not 1 <= dims <= 3 or groups < 1:
        return None
    params = [_expanded(p, dims) for p in (stride, padding, dilation, output_padding)]
    if None in params or min(params[0]) < 1:
        return None
    stride, padding, dilation, output_padding = params
    kernel = weight.shape[2:]
    if transposed:
        channels = weight.shape[1] * groups
        sizes = [(n - 1) * s - 2 * p + d * (k - 1) + op + 1 for n, k, s, p, d, op in zip(
            input.shape[2:], kernel, stride, padding, dilation, output_padding)]
    else:
        channels = weight.shape[0]
        sizes = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, s, p, d in zip(
            input.shape[2:], kernel, stride, padding, dilation)]
    if min(sizes) < 1:
        return None
    return (input.shape[0], channels, *sizes)


def _new(shape, input, weight, transposed, output_padding, stride) -> torch.Tensor:
    """A result of ``shape`` laid out as PyTorch's CPU convolutions lay out their output
    and gradients: channels_last when the input or the weight is, for 2-d images and, in
    the types its oneDNN kernels take, for 3-d ones (its slow paths, float64 and a
    transposed convolution whose ``output_padding`` reaches the stride, are contiguous
    in 3-d)."""
    dims = input.dim() - 2
    dense_3d = dims == 3 and input.dtype in (torch.float32, torch.float16, torch.bfloat16) \
        and not (transposed and any(op >= s for op, s in zip(
            _expanded(output_padding, 3) or (), _expanded(stride, 3) or ())))
    if dims == 2 or dense_3d:
        for t in (input, weight):
            if _prims.suggest_memory_format(t) is not torch.contiguous_format:
                return memory.empty(shape, input.dtype, layout.suggested(t, shape))
    return memory.empty(shape, input.dtype)


@composed("convolution_overrideable", hot=True)
def convolution_overrideable(input, weight, bias, stride, padding, dilation, transposed,
                             output_padding, groups):
    shape = _out_shape(input, weight, stride, padding, dilation, transposed, output_padding,
                       groups)
    if shape is not None:
        # (filed: the result's layout, like the program, follows from the signature)
        out = _new(shape, input, weight, transposed, output_padding, stride)
        r = from_table.call(aten.convolution.default, input, weight, bias, static(stride),
                         static(padding), static(dilation), bool(transposed),
                         static(output_padding), int(groups), out=(out,),
                         name="convolution", file=True)
        if r is not NotImplemented:
            return out
    return run_on_cpu_as(aten.convolution_overrideable.default, _convolution, input, weight,
                         bias, stride, padding, dilation, transposed, output_padding, groups)


@composed("convolution_backward_overrideable", hot=True)
def convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation,
                                      transposed, output_padding, groups, output_mask):
    mask = tuple(bool(m) for m in output_mask)
    if not any(mask):
        return None, None, None
    bias_sizes = _bias_sizes(weight, transposed, groups, mask)
    shapes = (input.shape, weight.shape, bias_sizes)
    out = tuple(memory.empty(tuple(shape), input.dtype) if i == 2 else
                _new(tuple(shape), input, weight, transposed, output_padding, stride)
                for i, (m, shape) in enumerate(zip(mask, shapes)) if m)
    r = from_table.call(aten.convolution_backward.default, grad_output, input, weight,
                     static(bias_sizes) if bias_sizes else None, static(stride),
                     static(padding), static(dilation), bool(transposed),
                     static(output_padding), int(groups), mask, out=out,
                     name="convolution_backward", file=True)
    if r is NotImplemented:
        return run_on_cpu_as(aten.convolution_backward_overrideable.default,
                             _convolution_backward, grad_output, input, weight, stride,
                             padding, dilation, transposed, output_padding, groups,
                             output_mask)
    results = iter(out)
    return tuple(next(results) if m else None for m in mask)
