"""Reductions: ``sum``, ``mean``, ``amax``/``amin``, ``max``/``min`` (with and without
``dim``), ``argmax``/``argmin``, ``var``/``std`` (and ``var_mean``/``std_mean``),
``linalg_vector_norm``, ``all``/``any``.

Semantics follow torch's CPU kernels:

* integer and bool sums accumulate (and return) int64; half types accumulate in float32
  and round once at the end;
* max/min/amax/amin propagate NaN; argmax/argmin (and the indices of ``max.dim``) pick
  the first occurrence of the extreme, NaN counting as the extreme;
* an empty sum is 0, an empty mean or variance NaN.

:class:`Unsupported`: what torch rejects (a bad ``dim``, an empty ``max``, ``mean`` of
integers, bool argmax), uint8 ``all``/``any`` (torch returns uint8) and complex dtypes.
"""

from __future__ import annotations

import math

import torch

from hologram.isa import dtypes as dt
from hologram_torch.lowering.common import (
    Unsupported,
    aten,
    cast,
    isa,
    opmath,
    register,
)


def dims(x, dim) -> tuple[int, ...]:
    """``dim`` (None, an int, or a list; an empty list means every dimension) as sorted
    non-negative axes. A 0-d tensor accepts dim 0 / -1 and reduces nothing.
    :class:`Unsupported` for what torch rejects (out of range, repeated)."""
    rank = x.ndim
    if dim is None:
        given = list(range(rank))
    else:
        given = [dim] if isinstance(dim, int) else list(dim)
        given = given or list(range(rank))
    wrap = max(rank, 1)
    if not all(-wrap <= d < wrap for d in given):
        raise Unsupported(f"dim {dim} out of range")
    axes = {d % wrap for d in given}
    if len(axes) != len(given):
        raise Unsupported(f"dim {dim} repeats a dimension")
    return tuple(sorted(axes)) if rank else ()


def _nonempty(x, axes) -> None:
    """Every reduced row has an element (max/min/argmax of nothing is an error)."""
    if math.prod(x.shape) == 0 and not all(x.shape[d] for d in axes):
        raise Unsupported("an extreme of an empty row")  # torch raises


def _float_result(x, dtype: torch.dtype | None) -> dt.DType:
    """The result dtype of a float-only reduction (mean, var, norm)."""
    out = isa(dtype) if dtype is not None else x.dtype
    if not out.is_float:
        raise Unsupported("a float reduction of integers")  # torch raises
    return out


# --- sum / mean ---------------------------------------------------------------------------

def _sum(g, x, axes, keepdim, out: dt.DType, count=None):
    """sum(x) over axes in ``out``'s accumulation dtype, over ``count`` for a mean (as a
    division, so that 0/0 is NaN, as in torch)."""
    acc = opmath(out) if out.is_float else dt.int64
    total = g.reduce("sum", cast(cast(x, out), acc), axes, keepdim)
    if count is not None:
        total = total / count
    return cast(total, out)


def sum_dtype(x, dtype: torch.dtype | None) -> dt.DType:
    if dtype is not None:
        out = isa(dtype)
        if out.is_bool:
            raise Unsupported("a bool sum")
        return out
    return x.dtype if x.dtype.is_float else dt.int64


@register(aten.sum.dim_IntList)
def sum_dim(g, self, dim, keepdim=False, *, dtype=None):
    return _sum(g, self, dims(self, dim), keepdim, sum_dtype(self, dtype))


@register(aten.sum.default)
def sum_all(g, self, *, dtype=None):
    return sum_dim(g, self, None, dtype=dtype)


@register(aten.mean.dim)
def mean_dim(g, self, dim, keepdim=False, *, dtype=None):
    axes, out = dims(self, dim), _float_result(self, dtype)
    return _sum(g, self, axes, keepdim, out, math.prod(self.shape[d] for d in axes))


@register(aten.mean.default)
def mean_all(g, self, *, dtype=None):
    return mean_dim(g, self, None, dtype=dtype)


# --- extremes -----------------------------------------------------------------------------

def _arg_operand(g, x):
    """x prepared for argmax/argmin: bools as integers; -0.0 as +0.0, because torch treats
    the zeros as equal (the first wins) while the ISA orders -0.0 below +0.0."""
    if x.dtype.is_bool:
        return cast(x, dt.uint8)
    if x.dtype.is_float:
        return g.where(g.binary("eq", x, 0.0), 0.0, x)
    return x


def _extremes(kind: str):
    ops = getattr(aten, kind), getattr(aten, f"a{kind}"), getattr(aten, f"arg{kind}")

    def indices(g, self, dim, keepdim):
        # dim=None: an index into the row-major flattening, as the ISA's argmax over
        # several axes gives it (with keepdim, every dimension kept as size 1, as torch)
        axes = dims(self, dim)
        _nonempty(self, axes)
        return g.reduce(f"arg{kind}", _arg_operand(g, self), axes, keepdim)

    @register(ops[1].default)
    def amax(g, self, dim=(), keepdim=False):
        axes = dims(self, dim)
        _nonempty(self, axes)
        return g.reduce(kind, self, axes, keepdim)

    @register(ops[0].default)
    def full(g, self):
        return amax(g, self, None)

    @register(ops[0].dim)
    def with_dim(g, self, dim, keepdim=False):
        return amax(g, self, dim, keepdim), indices(g, self, dim, keepdim)

    @register(ops[2].default)
    def argmax(g, self, dim=None, keepdim=False):
        if self.dtype.is_bool:
            raise Unsupported(f"arg{kind} of bools")  # torch raises
        return indices(g, self, dim, keepdim)

    return amax, full, with_dim, argmax


amax, max_all, max_dim, argmax = _extremes("max")
amin, min_all, min_dim, argmin = _extremes("min")


# --- variance -----------------------------------------------------------------------------

def _moments(g, x, axes, keepdim, divisor):
    """(variance, mean) over axes by two passes in opmath: mean first, then the mean of
    squared deviations over ``divisor`` (n - correction, at least 0: 0 gives inf/NaN)."""
    x = cast(x, opmath(x.dtype))
    count = math.prod(x.shape[d] for d in axes)
    mean = g.reduce("sum", x, axes, True) / count
    d = x - mean
    var = g.reduce("sum", d * d, axes, keepdim) / divisor
    if not keepdim:
        mean = mean.reshape(*var.shape)
    return var, mean


def _variance(op, root: bool, with_mean: bool):
    def variance(g, self, dim=None, *, correction=None, keepdim=False):
        axes = dims(self, dim)
        _float_result(self, None)
        count = math.prod(self.shape[d] for d in axes)
        divisor = float(max(count - (1 if correction is None else correction), 0))
        var, mean = _moments(g, self, axes, keepdim, divisor)
        result = cast(g.unary("sqrt", var) if root else var, self.dtype)
        return (result, cast(mean, self.dtype)) if with_mean else result

    return register(op)(variance)


var = _variance(aten.var.correction, False, False)
std = _variance(aten.std.correction, True, False)
var_mean = _variance(aten.var_mean.correction, False, True)
std_mean = _variance(aten.std_mean.correction, True, True)


# --- norms --------------------------------------------------------------------------------

@register(aten.linalg_vector_norm.default)
def linalg_vector_norm(g, self, ord=2, dim=None, keepdim=False, *, dtype=None):
    axes, out = dims(self, dim), _float_result(self, dtype)
    if not isinstance(ord, (int, float)):
        raise Unsupported(f"ord {ord!r}")
    ord = float(ord)
    if ord < 0 or math.isinf(ord):
        _nonempty(self, axes)  # norms without an identity reject empty rows
    x = cast(cast(self, out), opmath(out))
    a = abs(x)
    if ord == math.inf:
        r = g.reduce("max", a, axes, keepdim)
    elif ord == -math.inf:
        r = g.reduce("min", a, axes, keepdim)
    elif ord == 0:
        r = g.reduce("sum", cast(g.binary("ne", x, 0.0), a.dtype), axes, keepdim)
    elif ord == 1:
        r = g.reduce("sum", a, axes, keepdim)
    elif ord == 2:
        r = g.unary("sqrt", g.reduce("sum", x * x, axes, keepdim))
    else:
        r = g.binary("pow", g.reduce("sum", g.binary("pow", a, ord), axes, keepdim),
                     1.0 / ord)
    return cast(r, out)


# --- all / any ----------------------------------------------------------------------------

def _truth_reduction(name: str, kind: str):
    """all: min of the truth values; any: their max (NaN counts as true, as in torch).
    ``dim=()`` reduces nothing (unlike sum's and amax's, torch 2.13). The result is bool
    (torch returns uint8 for uint8 inputs: not lowered)."""
    ops = getattr(aten, name)

    @register(ops.default, ops.dim, ops.dims)
    def reduce(g, self, dim=None, keepdim=False):
        if self.dtype is dt.uint8:
            raise Unsupported(f"{name} of uint8")
        axes = () if isinstance(dim, (list, tuple)) and not dim else dims(self, dim)
        truth = self if self.dtype is dt.bool_ else g.binary("ne", self, 0)
        return g.reduce(kind, truth, axes, keepdim) if axes else truth

    return reduce


all_ = _truth_reduction("all", "min")
any_ = _truth_reduction("any", "max")
