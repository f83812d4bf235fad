"""The hard activations of mobile CNNs: ``hardswish`` and ``hardsigmoid`` and their
backward ops, as PyTorch's CPU kernels compute them (in opmath; NaN propagates through
the clamp, as ``std::min``/``std::max`` do; the backward constants are torch's, including
its float32 ``1/6`` in float64 arithmetic)."""

from __future__ import annotations

import numpy as np

from hologram_torch.lowering.common import aten, opmath, register
from hologram_torch.lowering.elementwise import (
    _activation,
    _apply,
    _backward_result,
    torch_max,
    torch_min,
)

_ONE_SIXTH = float(np.float32(1.0) / np.float32(6.0))  # torch's opmath_t(1.0f / 6.0f)


def _relu6_of_shift(g, x):
    """min(max(x + 3, 0), 6)."""
    return torch_min(g, torch_max(g, x + 3.0, 0.0), 6.0)


@register(aten.hardswish.default)
def hardswish(g, self):
    result = _activation(self)
    return _apply(lambda g, x: x * _relu6_of_shift(g, x) / 6.0, (self,), opmath(result),
                  result)


@register(aten.hardsigmoid.default)
def hardsigmoid(g, self):
    result = _activation(self)
    return _apply(lambda g, x: _relu6_of_shift(g, x) / 6.0, (self,), opmath(result), result)


def _hardswish_grad(g, grad, x):
    # torch's scalar rule: 0 up to -3 included, the slope below 3, grad from 3 on and at
    # NaN (its float64 vectorized code gives NaN there: position-dependent)
    middle = g.where(g.binary("lt", x, 3.0), grad * (x / 3.0 + 0.5), grad)
    return g.where(g.binary("le", x, -3.0), 0.0, middle)


@register(aten.hardswish_backward.default)
def hardswish_backward(g, grad_output, self):
    result = _backward_result(grad_output, self)
    return _apply(_hardswish_grad, (grad_output, self), opmath(result), result)


def _hardsigmoid_grad(g, grad, x):
    inside = g.binary("and", g.binary("gt", x, -3.0), g.binary("lt", x, 3.0))
    return g.where(inside, grad * _ONE_SIXTH, 0.0)


@register(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(g, grad_output, self):
    result = _backward_result(grad_output, self)
    return _apply(_hardsigmoid_grad, (grad_output, self), opmath(result), result)
