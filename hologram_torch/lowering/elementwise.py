"""Elementwise ATen ops: arithmetic and comparisons (broadcasting, PyTorch's type
promotion), unary math, ``where``/``masked_fill``/``clamp``, activations and the backward
ops of their autograd formulas, bitwise and logical ops.

Each op computes in PyTorch's opmath dtype (half types in float32) and casts the result
to the op's result dtype. Not lowered (:class:`Unsupported`): integer ``pow`` (exact only on
the CPU), bool subtraction and
negation, complex dtypes, and the argument combinations torch rejects (its own kernel
raises the error).
"""

from __future__ import annotations

import math

import torch

from hologram.frontend import functional
from hologram.isa import dtypes as dt
from hologram_torch.lowering.common import (
    Tensor,
    Unsupported,
    aten,
    cast,
    is_float,
    isa,
    opmath,
    register,
    result_type,
    torch_dtype,
)


def _apply(fn, args, compute: dt.DType, result: dt.DType, *extra):
    """``fn(g, *args-in-compute, *extra)`` cast to ``result``."""
    g = next(a.graph for a in args if isinstance(a, Tensor))
    return cast(fn(g, *(cast(a, compute) for a in args), *extra), result)


# --- PyTorch's min/max of two values --------------------------------------------------------

def torch_max(g, a, b):
    """PyTorch's CPU maximum of two values: NaN if either is NaN, else the larger and, on a
    tie, the first operand, so ``max(-0.0, +0.0)`` is -0.0 (``std::max`` in its scalar
    kernels; clamp, relu6 and hardtanh with number bounds follow it at every size). The
    ISA's ``max`` orders -0.0 below +0.0 in either order instead (docs/isa.md)."""
    return _first_on_tie(g, a, b, g.maximum(a, b))


def torch_min(g, a, b):
    """PyTorch's CPU minimum of two values (see :func:`torch_max`)."""
    return _first_on_tie(g, a, b, g.minimum(a, b))


def _first_on_tie(g, a, b, extreme):
    if not extreme.dtype.is_float:
        return extreme  # equal integers are the same value
    return g.where(g.binary("eq", a, b), a, extreme)


# --- binary arithmetic ----------------------------------------------------------------------

def _bools(a, b) -> bool:
    return (a if isinstance(a, Tensor) else b).dtype is dt.bool_


def _add(g, a, b):
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return a + b
    return g.binary("or", a, b) if _bools(a, b) else a + b


def _mul(g, a, b):
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return a * b
    return g.binary("and", a, b) if _bools(a, b) else a * b


def _arith_result(self, other, alpha=1, floating=False, bools=True) -> torch.dtype:
    result = result_type(self, other)
    if floating and not result.is_floating_point:
        result = torch.get_default_dtype()
    if result is torch.bool and not bools:
        raise Unsupported("bool operands")  # torch raises
    if not result.is_floating_point and not isinstance(alpha, (bool, int)) and (
            torch_dtype(alpha).is_floating_point):
        raise Unsupported("a float alpha for an integral result")  # torch raises
    isa(result)
    return result


def _with_alpha(fn, alpha):
    if not isinstance(alpha, Tensor) and alpha == 1:
        return fn, ()
    return (lambda g, a, b, s: fn(g, a, _mul(g, b, s))), (alpha,)


@register(aten.add.Tensor, aten.add.Scalar)
def add(g, self, other, alpha=1):
    result = _arith_result(self, other, alpha)
    fn, extra = _with_alpha(_add, alpha)
    return _apply(fn, (self, other, *extra), opmath(isa(result)), isa(result))


@register(aten.sub.Tensor, aten.sub.Scalar)
def sub(g, self, other, alpha=1):
    result = _arith_result(self, other, alpha, bools=False)
    fn, extra = _with_alpha(lambda g, a, b: a - b, alpha)
    return _apply(fn, (self, other, *extra), opmath(isa(result)), isa(result))


@register(aten.mul.Tensor, aten.mul.Scalar)
def mul(g, self, other):
    result = isa(_arith_result(self, other))
    return _apply(_mul, (self, other), opmath(result), result)


@register(aten.div.Tensor, aten.div.Scalar)
def div(g, self, other):
    result = isa(_arith_result(self, other, floating=True))
    return _apply(lambda g, a, b: a / b, (self, other), opmath(result), result)


@register(aten.maximum.default)
def maximum(g, self, other):
    result = isa(_arith_result(self, other))
    return _apply(torch_max, (self, other), opmath(result), result)


@register(aten.minimum.default)
def minimum(g, self, other):
    result = isa(_arith_result(self, other))
    return _apply(torch_min, (self, other), opmath(result), result)


# --- integer division: the ISA's total div/mod ---------------------------------------------

def _integral(self, other) -> dt.DType:
    """The integer dtype of an integer division's result; :class:`Unsupported` for float
    results (and bool, which torch rejects), left to PyTorch's kernels."""
    result = result_type(self, other)
    if result.is_floating_point or result.is_complex or result is torch.bool:
        raise Unsupported(f"integer division of {result}")
    return isa(result)


def _negative(g, x):
    return g.binary("lt", x, 0) if isinstance(x, Tensor) else x < 0


def _differ(g, a, b):
    """``a != b`` for two truth values (graph bools or Python bools)."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return g.binary("xor", a, b)
    return a != b


def _trunc_div(g, a, b):
    # the ISA's integer div truncates, and INT_MIN / -1 wraps to INT_MIN (where the
    # hardware's instruction traps); x / 0 is defined too, but never reaches a kernel:
    # the eager kernels raise PyTorch's ZeroDivisionError first
    return g.binary("div", a, b)


def _floor_div(g, a, b):
    """PyTorch's integer floor division: the truncated quotient, less one where the
    remainder is nonzero and its sign is not the divisor's."""
    q, r = g.binary("div", a, b), g.binary("mod", a, b)
    adjust = g.binary("and", g.binary("ne", r, 0), _differ(g, _negative(g, r), _negative(g, b)))
    return g.where(adjust, q - 1, q)


def _remainder(g, a, b):
    """Python's modulo (the sign of the divisor), as PyTorch's ``remainder``."""
    r = g.binary("mod", a, b)
    adjust = g.binary("and", g.binary("ne", r, 0), _differ(g, _negative(g, r), _negative(g, b)))
    return g.where(adjust, r + b, r)


def _fmod(g, a, b):
    return g.binary("mod", a, b)  # C's %: the sign of the dividend


#: The integer divisions: how each rounds.
INTEGER_DIVISION = {"trunc": _trunc_div, "floor": _floor_div, "remainder": _remainder,
                    "fmod": _fmod}


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(g, self, other, *, rounding_mode=None):
    """``div`` with a rounding mode: lowered for integer results (float ones are
    PyTorch's own kernels')."""
    if rounding_mode is None:
        return div(g, self, other)
    if rounding_mode not in ("trunc", "floor"):
        raise Unsupported(f"rounding_mode {rounding_mode!r}")  # torch raises
    result = _integral(self, other)
    return _apply(INTEGER_DIVISION[rounding_mode], (self, other), result, result)


@register(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(g, self, other):
    result = _integral(self, other)
    return _apply(_floor_div, (self, other), result, result)


@register(aten.remainder.Tensor, aten.remainder.Scalar)
def remainder(g, self, other):
    result = _integral(self, other)
    return _apply(_remainder, (self, other), result, result)


@register(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(g, self, other):
    result = _integral(self, other)
    return _apply(_fmod, (self, other), result, result)


# --- comparisons, bitwise and logical ops ---------------------------------------------------

def _comparison(op: str):
    def compare(g, self, other):
        common = isa(result_type(self, other))
        return _apply(lambda g, a, b: g.binary(op, a, b), (self, other), common, dt.bool_)

    overloads = (getattr(aten, op).Tensor, getattr(aten, op).Scalar)
    register(*overloads)(compare)
    return compare


eq, ne, lt, le, gt, ge = (_comparison(op) for op in ("eq", "ne", "lt", "le", "gt", "ge"))


def _bitwise(op: str):
    def bitwise(g, self, other):
        result = result_type(self, other)
        if result.is_floating_point:
            raise Unsupported("bitwise op on floats")  # torch raises
        return _apply(lambda g, a, b: g.binary(op, a, b), (self, other), isa(result),
                      isa(result))

    ops = getattr(aten, f"bitwise_{op}")
    register(ops.Tensor, ops.Scalar)(bitwise)
    return bitwise


bitwise_and, bitwise_or, bitwise_xor = (_bitwise(op) for op in ("and", "or", "xor"))


def _truth(g, x):
    return x if x.dtype is dt.bool_ else g.binary("ne", x, 0)


def _logical(op: str):
    def logical(g, self, other):
        common = isa(result_type(self, other))
        return _apply(lambda g, a, b: g.binary(op, _truth(g, a), _truth(g, b)),
                      (self, other), common, dt.bool_)

    register(getattr(aten, f"logical_{op}").default)(logical)
    return logical


logical_and, logical_or, logical_xor = (_logical(op) for op in ("and", "or", "xor"))


@register(aten.logical_not.default)
def logical_not(g, self):
    return g.unary("not", _truth(g, self))


@register(aten.bitwise_not.default)
def bitwise_not(g, self):
    if self.dtype.is_float:
        raise Unsupported("bitwise_not of floats")  # torch raises
    return g.unary("not", self)


@register(aten.isnan.default)
def isnan(g, self):
    return g.binary("ne", self, self)


def _infinity_test(value: float):
    def test(g, self):
        if not self.dtype.is_float:  # integers are never infinite
            return g.binary("ne", self, self)
        return g.binary("eq", self, value)

    return test


isposinf = register(aten.isposinf.default)(_infinity_test(math.inf))
isneginf = register(aten.isneginf.default)(_infinity_test(-math.inf))


# --- pow ------------------------------------------------------------------------------------

#: Exponents PyTorch computes specially (a Python-number exponent is specialized).
POW = {2.0: lambda g, x: x * x, 3.0: lambda g, x: x * x * x,
       0.5: lambda g, x: g.unary("sqrt", x), -0.5: lambda g, x: g.unary("rsqrt", x),
       -1.0: lambda g, x: 1.0 / x, -2.0: lambda g, x: 1.0 / (x * x),
       1.0: lambda g, x: x}


@register(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor)
def pow(g, self, exponent):
    result = result_type(self, exponent)
    if not result.is_floating_point:
        raise Unsupported("integer pow")  # integral in torch: exact on the CPU
    result = isa(result)
    compute = opmath(result)
    if not isinstance(exponent, Tensor) and float(exponent) in POW:
        return cast(POW[float(exponent)](g, cast(self, compute)), result)
    return _apply(lambda g, x, e: g.binary("pow", x, e), (self, exponent), compute, result)


# --- unary math -----------------------------------------------------------------------------

def _unary(op: str, fn, floating: bool, ints=None, bools: bool = False):
    """``floating``: integer inputs give the default float dtype (``exp(int)``); otherwise
    the dtype is kept, and ``ints`` (if any) is the function of integers (``floor`` of an
    integer is itself)."""

    def unary(g, self):
        if self.dtype.is_bool and not (floating or bools):
            raise Unsupported(f"{op} of bool")
        if self.dtype.is_float or not floating:
            result = self.dtype
        else:
            result = isa(torch.get_default_dtype())
        f = ints if ints is not None and not self.dtype.is_float else fn
        return _apply(f, (self,), opmath(result), result)

    register(getattr(aten, op).default)(unary)
    return unary


def _primitive(op: str):
    return lambda g, x: g.unary(op, x)


for _op in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin", "cos",
            "tanh", "sigmoid", "erf"):
    _unary(_op, _primitive(_op), floating=True)
for _op in ("floor", "ceil", "round", "trunc"):
    _unary(_op, _primitive(_op), floating=False, ints=lambda g, x: x)
for _op in ("neg", "abs"):
    _unary(_op, _primitive(_op), floating=False)


def _sign(g, x):
    # torch: sign(NaN) = 0 and sign(-0.0) = +0.0 (the ISA's sign keeps both)
    if not x.dtype.is_float:
        return g.unary("sign", x)
    return g.cast(g.binary("gt", x, 0.0), x.dtype) - g.cast(g.binary("lt", x, 0.0), x.dtype)


_unary("sign", _sign, floating=False)
_unary("reciprocal", lambda g, x: 1.0 / x, floating=True)


# --- selection: where, masked_fill, clamp ---------------------------------------------------

@register(aten.where.self)
def where(g, condition, self, other):
    if condition.dtype is not dt.bool_:
        raise Unsupported("a non-bool condition")
    result = isa(result_type(self, other))
    return g.where(condition, cast(self, result), cast(other, result))


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(g, self, mask, value):
    if mask.dtype is not dt.bool_:
        raise Unsupported("a non-bool mask")
    if isinstance(value, Tensor):
        if value.ndim:
            raise Unsupported("a value of more than 0 dimensions")  # torch raises
        if value.dtype.is_float and not self.dtype.is_float:
            raise Unsupported("a float value into an integer tensor")
    elif isinstance(value, float) and not (self.dtype.is_float or self.dtype.is_bool):
        raise Unsupported("a float value into an integer tensor")  # torch decides
    return g.where(mask, cast(value, self.dtype), self)


def _clamp(g, self, lo, hi):
    bounds = [b for b in (lo, hi) if b is not None]
    if not bounds:
        raise Unsupported("clamp without bounds")  # torch raises
    result = torch_dtype(self)
    for b in bounds:
        result = torch.promote_types(result, result_type(self, b))
    if result is torch.bool:
        raise Unsupported("clamp of bools")
    result = isa(result)
    x = cast(self, opmath(result))
    if lo is not None:
        x = torch_max(g, x, cast(lo, opmath(result)))
    if hi is not None:
        x = torch_min(g, x, cast(hi, opmath(result)))
    return cast(x, result)


@register(aten.clamp.default, aten.clamp.Tensor)
def clamp(g, self, min=None, max=None):
    return _clamp(g, self, min, max)


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(g, self, min):
    return _clamp(g, self, min, None)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(g, self, max):
    return _clamp(g, self, None, max)


# --- activations and their backward ops -----------------------------------------------------

def _activation(self, ints: bool = False) -> dt.DType:
    """The result dtype of an activation: float inputs (ints too if ``ints``)."""
    if not (self.dtype.is_float or (ints and not self.dtype.is_bool)):
        raise Unsupported(f"an activation of {self.dtype}")
    return self.dtype


def _backward_result(grad, saved, promote: bool = True) -> dt.DType:
    if not (is_float(grad) and is_float(saved)):
        raise Unsupported("a backward op of non-float tensors")
    return isa(torch.promote_types(torch_dtype(grad), torch_dtype(saved))) if promote \
        else grad.dtype


def relu_math(g, x):
    """relu of a value in its compute dtype: where(x < 0, 0, x), not max(x, 0): torch keeps
    NaN and -0.0."""
    return g.where(g.binary("lt", x, 0), 0, x)


def sigmoid_backward_math(g, grad, y):
    return grad * (1.0 - y) * y


def tanh_backward_math(g, grad, y):
    return grad * (1.0 - y * y)


@register(aten.relu.default)
def relu(g, self):
    result = _activation(self, ints=True)
    return _apply(relu_math, (self,), opmath(result), result)


@register(aten.threshold_backward.default)
def threshold_backward(g, grad_output, self, threshold):
    result = _backward_result(grad_output, self)
    return _apply(lambda g, grad, x, t: g.where(g.binary("le", x, t), 0.0, grad),
                  (grad_output, self, threshold), opmath(result), result)


@register(aten.silu.default)
def silu(g, self):
    result = _activation(self)
    return _apply(lambda g, x: x * g.unary("sigmoid", x), (self,), opmath(result), result)


def _silu_backward(g, grad, x):
    s = g.unary("sigmoid", x)
    return grad * s * (x * (1.0 - s) + 1.0)


@register(aten.silu_backward.default)
def silu_backward(g, grad_output, self):
    result = _backward_result(grad_output, self)
    return _apply(_silu_backward, (grad_output, self), opmath(result), result)


@register(aten.sigmoid_backward.default)
def sigmoid_backward(g, grad_output, output):
    result = _backward_result(grad_output, output)
    return _apply(sigmoid_backward_math, (grad_output, output), opmath(result), result)


@register(aten.tanh_backward.default)
def tanh_backward(g, grad_output, output):
    result = _backward_result(grad_output, output)
    return _apply(tanh_backward_math, (grad_output, output), opmath(result), result)


@register(aten.gelu.default)
def gelu(g, self, approximate="none"):
    result = _activation(self)
    return _apply(lambda g, x: functional.gelu(x, approximate), (self,), opmath(result),
                  result)


def gelu_backward_math(g, grad, x, approximate):
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        t = g.unary("tanh", (x + x * x * x * 0.044715) * k)
        inner = (x * x * (3 * 0.044715) + 1.0) * k
        return grad * ((t + 1.0) * 0.5 + x * 0.5 * (1.0 - t * t) * inner)
    cdf = (g.unary("erf", x * (1.0 / math.sqrt(2.0))) + 1.0) * 0.5
    pdf = g.unary("exp", x * x * -0.5) * (1.0 / math.sqrt(2.0 * math.pi))
    return grad * (cdf + x * pdf)


@register(aten.gelu_backward.default)
def gelu_backward(g, grad_output, self, approximate="none"):
    result = _backward_result(grad_output, self, promote=False)
    return _apply(gelu_backward_math, (grad_output, self), opmath(result), result, approximate)


@register(aten.leaky_relu.default)
def leaky_relu(g, self, negative_slope=0.01):
    result = _activation(self)
    return _apply(lambda g, x, s: g.where(g.binary("gt", x, 0.0), x, x * s),
                  (self, negative_slope), opmath(result), result)


@register(aten.leaky_relu_backward.default)
def leaky_relu_backward(g, grad_output, self, negative_slope, self_is_result=False):
    result = _backward_result(grad_output, self, promote=False)
    return _apply(lambda g, grad, x, s: g.where(g.binary("gt", x, 0.0), grad, grad * s),
                  (grad_output, self, negative_slope), opmath(result), result)


@register(aten.hardtanh.default)
def hardtanh(g, self, min_val=-1, max_val=1):
    result = _activation(self, ints=True)
    return _apply(lambda g, x, lo, hi: torch_min(g, torch_max(g, x, lo), hi),
                  (self, min_val, max_val), opmath(result), result)


def _hardtanh_backward(g, grad, x, lo, hi):
    outside = g.binary("or", g.binary("le", x, lo), g.binary("ge", x, hi))
    return g.where(outside, 0.0, grad)


@register(aten.hardtanh_backward.default)
def hardtanh_backward(g, grad_output, self, min_val, max_val):
    result = _backward_result(grad_output, self)
    return _apply(_hardtanh_backward, (grad_output, self, min_val, max_val), opmath(result),
                  result)
