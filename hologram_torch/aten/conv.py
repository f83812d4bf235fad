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

from hologram_torch.aten import lowered
from hologram_torch.aten.lowered import static
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


@composed("convolution_overrideable")
def convolution_overrideable(input, weight, bias, stride, padding, dilation, transposed,
                             output_padding, groups):
    r = lowered.call(aten.convolution.default, input, weight, bias, static(stride),
                     static(padding), static(dilation), bool(transposed),
                     static(output_padding), int(groups), name="convolution")
    if r is NotImplemented:
        return run_on_cpu_as(aten.convolution_overrideable.default, _convolution, input,
                             weight, bias, stride, padding, dilation, transposed,
                             output_padding, groups)
    return r


@composed("convolution_backward_overrideable")
def convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation,
                                      transposed, output_padding, groups, output_mask):
    mask = tuple(bool(m) for m in output_mask)
    if not any(mask):
        return None, None, None
    bias_sizes = _bias_sizes(weight, transposed, groups, mask)
    r = lowered.call(aten.convolution_backward.default, grad_output, input, weight,
                     static(bias_sizes) if bias_sizes else None, static(stride),
                     static(padding), static(dilation), bool(transposed),
                     static(output_padding), int(groups), mask,
                     name="convolution_backward")
    if r is NotImplemented:
        return run_on_cpu_as(aten.convolution_backward_overrideable.default,
                             _convolution_backward, grad_output, input, weight, stride,
                             padding, dilation, transposed, output_padding, groups,
                             output_mask)
    results = iter((r,) if isinstance(r, torch.Tensor) else r)
    return tuple(next(results) if m else None for m in mask)
