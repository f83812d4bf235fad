"""Reductions: ``sum``, ``mean``, ``amax``/``amin``, ``max``/``min`` (with and without
``dim``), ``argmax``/``argmin``, ``var``/``std`` (and ``var_mean``/``std_mean``) and
``linalg_vector_norm``.

Each kernel normalizes its ``dim``/``keepdim``/``dtype`` arguments with :func:`_dims`
and builds one reduction program. Semantics follow torch's CPU kernels:

* integer and bool sums accumulate (and return) int64; half types accumulate in float32
  (:func:`program.opmath`) and round once at the end;
* max/min/amax/amin propagate NaN; argmax/argmin (and the indices of ``max.dim``) pick
  the first occurrence of the extreme, NaN counting as the extreme;
* an empty sum is 0, an empty mean or variance NaN;
* whatever torch rejects (a bad ``dim``, an empty ``max``, ``mean`` of integers, complex
  inputs) goes through the CPU fallback, which raises torch's own error or computes the
  unsupported case, so messages and results match the CPU exactly.

The backward formulas of these ops are elementwise ops and these reductions, except
``max.dim``/``min.dim``, whose backward scatters into zeros (``scatter.src``, another
family).
"""

from __future__ import annotations

import math

import torch

from hologram.isa import dtypes as dt
from hologram_torch.aten import program
from hologram_torch.aten.program import ISA, cast, opmath
from hologram_torch.aten.registry import aten, impl, native_or_cpu
from hologram_torch.fallback import run_on_cpu

OPINFO = ("sum", "mean", "amax", "amin", "max.reduction_with_dim", "max.reduction_no_dim",
          "min.reduction_with_dim", "min.reduction_no_dim", "argmax", "argmin", "var",
          "var.unbiased", "std", "std.unbiased", "var_mean", "var_mean.unbiased", "std_mean",
          "std_mean.unbiased", "linalg.vector_norm", "norm", "norm.fro", "norm.inf", "all",
          "any")


# --- argument parsing -------------------------------------------------------------------

def _dims(x: torch.Tensor, dim) -> tuple[int, ...] | None:
    """``dim`` (None, an int, or a list; an empty list means every dimension) as sorted
    non-negative axes; ``None`` when torch would reject it (so the caller falls back and
    torch raises its own error). A 0-d tensor accepts dim 0 / -1 and reduces nothing."""
    rank = x.dim()
    if dim is None:
        dims = list(range(rank))
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
        dims = dims or list(range(rank))
    wrap = max(rank, 1)
    if not all(-wrap <= d < wrap for d in dims):
        return None
    axes = {d % wrap for d in dims}
    if len(axes) != len(dims):
        return None
    return tuple(sorted(axes)) if rank else ()


def _nonempty(x: torch.Tensor, axes: tuple[int, ...]) -> bool:
    """Does every reduced row have an element? (max/min/argmax of nothing is an error.)"""
    return x.numel() > 0 or all(x.shape[d] for d in axes)


def _float_result(x: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype | None:
    """The result dtype of a float-only reduction (mean, var, norm), or None when torch
    rejects the input (ints without a float ``dtype``) or the dtype is not native."""
    out = dtype or x.dtype
    if not (out.is_floating_point and x.dtype in ISA and out in ISA):
        return None
    return out


# --- sum / mean ---------------------------------------------------------------------------

def _sum_build(g, x, axes, keepdim, out, scale):
    """sum(x) over axes in ``out``'s accumulation dtype, times ``scale`` (mean: 1/n as a
    division so that 0/0 is NaN, as in torch)."""
    acc = opmath(out) if out.is_float else dt.int64
    total = g.reduce("sum", cast(cast(x, out), acc), axes, keepdim)
    if scale is not None:
        total = total / scale
    return cast(total, out)


def _sum_dtype(x: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    return x.dtype if x.dtype.is_floating_point or x.dtype.is_complex else torch.int64


@impl("sum.dim_IntList")
def sum_dim(x, dim, keepdim=False, dtype=None):
    axes, out = _dims(x, dim), _sum_dtype(x, dtype)
    if axes is None or not program.supported(x) or out not in ISA or out is torch.bool:
        return run_on_cpu(aten.sum.dim_IntList, x, dim, keepdim, dtype=dtype)
    return program.run("sum", _sum_build, (x,), (axes, keepdim, ISA[out], None))


@impl("sum")
def sum_all(x, dtype=None):
    return sum_dim(x, None, False, dtype=dtype)


@impl("mean.dim")
def mean_dim(x, dim, keepdim=False, dtype=None):
    axes, out = _dims(x, dim), _float_result(x, dtype)
    if axes is None or out is None:
        return run_on_cpu(aten.mean.dim, x, dim, keepdim, dtype=dtype)
    count = math.prod(x.shape[d] for d in axes)
    return program.run("mean", _sum_build, (x,), (axes, keepdim, ISA[out], count))


@impl("mean")
def mean_all(x, dtype=None):
    if _float_result(x, dtype) is None:
        return run_on_cpu(aten.mean.default, x, dtype=dtype)
    return mean_dim(x, None, False, dtype=dtype)


def _reduced_shape(x: torch.Tensor, axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    return tuple(1 if d in axes else n for d, n in enumerate(x.shape) if keepdim or d not in axes)


def _into(out: torch.Tensor, x: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """Can a result of ``shape`` be written into ``out`` directly? (It must not share
    ``x``'s memory; a non-empty ``out`` of another shape is left to the fallback, which
    resizes it with torch's warning; an empty one is resized here.)"""
    if out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        return False
    if tuple(out.shape) != shape:
        if out.numel():
            return False
        out.resize_(shape)
    return True


def _sum_out(name: str, fallback, mean: bool):
    """sum/mean with ``out=``: torch accumulates in ``dtype``, else in out's dtype."""

    @impl(name)
    def kernel(x, dim, keepdim=False, *, dtype=None, out):
        axes, want = _dims(x, dim), dtype or out.dtype
        if (axes is None or not program.supported(x) or want not in ISA or want is torch.bool
                or want != out.dtype or (mean and _float_result(x, dtype) is None)
                or not _into(out, x, _reduced_shape(x, axes, keepdim))):
            return run_on_cpu(fallback, x, dim, keepdim, dtype=dtype, out=out)
        count = math.prod(x.shape[d] for d in axes) if mean else None
        program.run(name, _sum_build, (x,), (axes, keepdim, ISA[want], count), out=(out,))
        return out

    return kernel


sum_out = _sum_out("sum.IntList_out", aten.sum.IntList_out, mean=False)
mean_out = _sum_out("mean.out", aten.mean.out, mean=True)


# --- extremes -----------------------------------------------------------------------------

def _extreme_build(g, x, kind, axes, keepdim):
    return g.reduce(kind, x, axes, keepdim)


def _arg_operand(g, x):
    """x prepared for argmax/argmin: bools as integers; -0.0 as +0.0, because torch treats
    the zeros as equal (the first wins) while the ISA orders -0.0 below +0.0."""
    if x.dtype.is_bool:
        return cast(x, dt.uint8)
    if x.dtype.is_float:
        return g.where(g.binary("eq", x, 0.0), 0.0, x)
    return x


def _arg_reduce(g, x, kind, axes, keepdim):
    """argmax/argmin (of a 0-d tensor: 0)."""
    return g.reduce(kind, _arg_operand(g, x), axes, keepdim)


def _value_index_build(g, x, kind, axes, keepdim):
    return g.reduce(kind, x, axes, keepdim), _arg_reduce(g, x, f"arg{kind}", axes, keepdim)


def _extreme(name: str, kind: str, build, x, dim, keepdim, fallback, *fallback_args):
    """Run ``build`` for a max/min-like reduction, or the CPU fallback for what torch
    rejects (bad dims, empty rows) or cannot do natively."""
    axes = _dims(x, dim)
    if axes is None or not _nonempty(x, axes) or not program.supported(x):
        return run_on_cpu(fallback, x, *fallback_args)
    return program.run(name, build, (x,), (kind, axes, keepdim))


def _register_extremes(kind: str) -> None:
    ops = getattr(aten, kind), getattr(aten, f"a{kind}"), getattr(aten, f"arg{kind}")

    def amax(x, dim=(), keepdim=False):
        return _extreme(f"a{kind}", kind, _extreme_build, x, dim, keepdim, ops[1].default,
                        dim, keepdim)

    def full(x):
        return _extreme(kind, kind, _extreme_build, x, None, False, ops[0].default)

    def with_dim(x, dim, keepdim=False):
        return _extreme(f"{kind}.dim", kind, _value_index_build, x, dim, keepdim,
                        ops[0].dim, dim, keepdim)

    def argmax(x, dim=None, keepdim=False):
        if x.dtype is torch.bool:  # torch has no bool argmax/argmin: it raises
            return run_on_cpu(ops[2].default, x, dim, keepdim)
        # dim=None: an index into the row-major flattening, as the ISA's argmax over
        # several axes gives it (with keepdim, every dimension kept as size 1, as torch)
        return _extreme(f"arg{kind}", f"arg{kind}", _arg_reduce, x, dim, keepdim,
                        ops[2].default, dim, keepdim)

    impl(f"a{kind}")(amax)
    impl(kind)(full)
    impl(f"{kind}.dim")(with_dim)
    impl(f"arg{kind}")(argmax)


_register_extremes("max")
_register_extremes("min")


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


def _var_build(g, x, axes, keepdim, divisor, root, with_mean):
    var, mean = _moments(g, x, axes, keepdim, divisor)
    result = g.unary("sqrt", var) if root else var
    result = cast(result, x.dtype)
    return (result, cast(mean, x.dtype)) if with_mean else result


def _variance(name: str, fallback, root: bool, with_mean: bool):
    def kernel(x, dim=None, *, correction=None, keepdim=False):
        axes = _dims(x, dim)
        if axes is None or _float_result(x, None) is None:
            return run_on_cpu(fallback, x, dim, correction=correction, keepdim=keepdim)
        count = math.prod(x.shape[d] for d in axes)
        divisor = float(max(count - (1 if correction is None else correction), 0))
        return program.run(name, _var_build, (x,), (axes, keepdim, divisor, root, with_mean))

    impl(str(fallback).removeprefix("aten."))(kernel)
    return kernel


var = _variance("var", aten.var.correction, False, False)
std = _variance("std", aten.std.correction, True, False)
var_mean = _variance("var_mean", aten.var_mean.correction, False, True)
std_mean = _variance("std_mean", aten.std_mean.correction, True, True)


# --- norms --------------------------------------------------------------------------------

def _norm_build(g, x, ord, axes, keepdim, out):
    x = cast(cast(x, out), opmath(out))
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


@impl("linalg_vector_norm")
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    axes, out = _dims(x, dim), _float_result(x, dtype)
    # Norms without an identity (negative and infinite orders) reject empty rows.
    if (axes is None or out is None or not isinstance(ord, (int, float))
            or ((ord < 0 or math.isinf(ord)) and not _nonempty(x, axes))):
        return run_on_cpu(aten.linalg_vector_norm.default, x, ord, dim, keepdim, dtype=dtype)
    return program.run("vector_norm", _norm_build, (x,),
                       (float(ord), axes, keepdim, ISA[out]))


__all__ = ["OPINFO", "linalg_vector_norm", "mean_all", "mean_dim", "mean_out", "std",
           "std_mean", "sum_all", "sum_dim", "sum_out", "var", "var_mean"]


# --- all / any ----------------------------------------------------------------------------

def _truth_build(g, x, axes, keepdim, kind):
    """all: min of the truth values; any: their max (NaN counts as true, as in torch).
    No axes: no reduction (torch's all/any over ``dim=()``)."""
    truth = x if x.dtype is dt.bool_ else g.binary("ne", x, 0)
    return g.reduce(kind, truth, axes, keepdim) if axes else truth


def _all_any(name: str, kind: str):
    """``all``/``any`` over every dimension or ``dim`` (an int or a list), and ``out=``.
    The result is bool (torch returns uint8 for uint8 inputs: the fallback handles that)."""

    def reduce(x, dim=None, keepdim=False, *, out=None):
        # dim=() reduces nothing here, unlike sum's and amax's dim=() (torch 2.13)
        axes = () if isinstance(dim, (list, tuple)) and not dim else _dims(x, dim)
        if axes is None or not program.supported(x) or x.dtype is torch.uint8 or (
                out is not None and (out.dtype is not torch.bool
                                     or not _into(out, x, _reduced_shape(x, axes, keepdim)))):
            return NotImplemented
        result = program.run(name, _truth_build, (x,), (axes, keepdim, kind),
                             out=None if out is None else (out,))
        return result if out is None else out

    native_or_cpu(name)(lambda x: reduce(x))
    native_or_cpu(f"{name}.dim", f"{name}.dims")(
        lambda x, dim=None, keepdim=False: reduce(x, dim, keepdim))
    native_or_cpu(f"{name}.all_out")(lambda x, *, out: reduce(x, out=out))
    native_or_cpu(f"{name}.out", f"{name}.dims_out")(
        lambda x, dim=None, keepdim=False, *, out: reduce(x, dim, keepdim, out=out))


_all_any("all", "min")
_all_any("any", "max")
