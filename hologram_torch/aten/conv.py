"""Convolutions (1-3d, grouped, dilated, transposed; forward and backward).

For a device other than CPU and CUDA, PyTorch's ``convolution`` and
``convolution_backward`` call ``convolution_overrideable`` and
``convolution_backward_overrideable``, whose default kernels only raise
``NotImplementedError``. Those two run PyTorch's CPU convolution on tensors aliasing the
device memory, counted and warned about as fallbacks (``fallback_stats()`` lists them
under the overrideable names). Padding modes (``same``, ``reflect``, ``circular``...) and
double backward are composite ops above these two.
"""

from __future__ import annotations

from hologram_torch.aten.registry import aten, composed
from hologram_torch.fallback import run_on_cpu_as

OPINFO = ("nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d",
          "nn.functional.conv_transpose1d", "nn.functional.conv_transpose2d",
          "nn.functional.conv_transpose3d")


def _convolution(input, weight, bias, stride, padding, dilation, transposed,
                 output_padding, groups):
    return aten.convolution.default(input, weight, bias, stride, padding, dilation,
                                    transposed, output_padding, groups)


def _convolution_backward(grad_output, input, weight, stride, padding, dilation,
                          transposed, output_padding, groups, output_mask):
    # The bias' gradient is a sum of grad_output over all but the channel dimension; the
    # CPU op wants the bias' shape to produce it.
    channels = weight.size(1) * groups if transposed else weight.size(0)
    return aten.convolution_backward.default(
        grad_output, input, weight, [channels] if output_mask[2] else None, stride,
        padding, dilation, transposed, output_padding, groups, output_mask)


@composed("convolution_overrideable")
def convolution_overrideable(*args):
    return run_on_cpu_as(aten.convolution_overrideable.default, _convolution, *args)


@composed("convolution_backward_overrideable")
def convolution_backward_overrideable(*args):
    return run_on_cpu_as(aten.convolution_backward_overrideable.default,
                         _convolution_backward, *args)
