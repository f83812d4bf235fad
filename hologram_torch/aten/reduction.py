"""Reductions: ``sum``, ``mean``, ``amax``/``amin``, ``max``/``min`` (with and without
``dim``), ``argmax``/``argmin``, ``var``/``std`` (and ``var_mean``/``std_mean``) and
``linalg_vector_norm``.

Each kernel normalizes its ``dim`` argument with :func:`_dims` and runs the op's entry in
:mod:`hologram_torch.lowering.reduction` (the table torch.compile lowers through too).
Semantics follow torch's CPU kernels:

* integer and bool sums accumulate (and return) int64; half types accumulate in float32
  (:func:`runner.opmath`) and round once at the end;
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

import torch

from hologram_torch import memory
from hologram_torch.aten import from_table, runner
from hologram_torch.aten.registry import aten, composed, impl, native_or_cpu
from hologram_torch.aten.runner import ISA, MAX_NDIM
from hologram_torch.fallback import run_on_cpu
from hologram_torch.lowering import Unsupported, reduction

OPINFO = ("sum", "mean", "amax", "amin", "max.reduction_with_dim", "max.reduction_no_dim",
          "min.reduction_with_dim", "min.reduction_no_dim", "argmax", "argmin", "var",
          "var.unbiased", "std", "std.unbiased", "var_mean", "var_mean.unbiased", "std_mean",
          "std_mean.unbiased", "linalg.vector_norm", "norm", "norm.fro", "norm.inf", "all",
          "any")


# --- argument parsing -------------------------------------------------------------------

def _dims(x: torch.Tensor, dim) -> tuple[int, ...] | None:
    """:func:`hologram_torch.lowering.reduction.dims`, or ``None`` where torch would reject
    ``dim`` (so the caller falls back and torch raises its own error): a dimension out of
    range, or any ``dim`` of a tensor of more than 64 dimensions (its dims are a 64-bit
    mask there; ``dim=None`` reduces everything and is fine)."""
    if x.dim() > MAX_NDIM and dim is not None:
        return None
    try:
        return reduction.dims(x, dim)
    except Unsupported:
        return None


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

def _run(op, x, static, kwargs=(), out=None, name=None, file=False):
    """``op``'s lowering (:mod:`hologram_torch.lowering.reduction`) on ``x``; ``file``: with
    the front kernel running the call (as :func:`from_table.call`'s)."""
    return from_table.run(op, (x,), static, kwargs, out, name, file)


def _over_dims(op):
    """The kernel of ``op`` (``sum.dim_IntList``, ``mean.dim``): its lowering over the
    axes ``dim`` names, filed with the front kernel; else the CPU's."""

    def kernel(x, dim, keepdim=False, dtype=None):
        axes = _dims(x, dim)
        r = NotImplemented if axes is None else _run(op, x, (axes, keepdim),
                                                     (("dtype", dtype),), file=True)
        if r is NotImplemented:
            return run_on_cpu(op, x, dim, keepdim, dtype=dtype)
        return r

    return kernel


sum_dim = impl("sum.dim_IntList", hot=True)(_over_dims(aten.sum.dim_IntList))


def _whole(op, general, whole, x, dtype):
    """``x.sum()`` / ``x.mean()`` (no dim, no dtype) on a device tensor: the kernel
    remembered under ``x``'s signature, else ``general`` (which files it, see
    runner.shortcuts); past 64 dimensions (no program takes them, and ``general`` with
    ``dim=None`` is refused there) the CPU's ``whole``."""
    if x.dim() > MAX_NDIM:
        return run_on_cpu(whole, x, dtype=dtype)
    if dtype is not None or x.is_cpu:
        return general(x, None, False, dtype=dtype)
    key = (op, x.dtype, x.shape, x.stride())
    entry = runner.shortcuts.get(key)
    if entry is not None:
        return runner.launch_fresh(entry, (x,))
    r = general(x, None, False)
    axes = _dims(x, None)
    if axes is not None:
        runner.remember(key, op.__name__.partition(".")[0],
                         from_table.spec(op, (x,), (axes, False), (("dtype", None),)), (x,), r)
    return r


@impl("sum", hot=True)
def sum_all(x, dtype=None):
    return _whole(aten.sum.dim_IntList, sum_dim, aten.sum.default, x, dtype)


mean_dim = impl("mean.dim", hot=True)(_over_dims(aten.mean.dim))


@impl("mean", hot=True)
def mean_all(x, dtype=None):
    if _float_result(x, dtype) is None:
        return run_on_cpu(aten.mean.default, x, dtype=dtype)
    return _whole(aten.mean.dim, mean_dim, aten.mean.default, x, dtype)


def _reduced_shape(x: torch.Tensor, axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    return tuple(1 if d in axes else n for d, n in enumerate(x.shape) if keepdim or d not in axes)


def _into(out: torch.Tensor, x: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """Can a result of ``shape`` be written into ``out`` directly? (It must not share
    ``x``'s memory nor overlap itself; a non-empty ``out`` of another shape is left to the
    fallback, which resizes it with torch's warning; an empty one is resized here.)"""
    if (out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            or memory.internal_overlap(out)):
        return False
    if tuple(out.shape) != shape:
        if out.numel():
            return False
        out.resize_(shape)
    return True


def _sum_out(name: str, fallback, mean: bool):
    """sum/mean with ``out=``: torch accumulates in ``dtype``, else in out's dtype."""
    op = aten.mean.dim if mean else aten.sum.dim_IntList

    @impl(name)
    def kernel(x, dim, keepdim=False, *, dtype=None, out):
        axes, want = _dims(x, dim), dtype or out.dtype
        if (axes is None or want != out.dtype or (mean and _float_result(x, dtype) is None)
                or not _into(out, x, _reduced_shape(x, axes, keepdim))
                or _run(op, x, (axes, keepdim), (("dtype", want),), (out,), name)
                is NotImplemented):
            return run_on_cpu(fallback, x, dim, keepdim, dtype=dtype, out=out)
        return out

    return kernel


sum_out = _sum_out("sum.IntList_out", aten.sum.IntList_out, mean=False)
mean_out = _sum_out("mean.out", aten.mean.out, mean=True)


# --- extremes -----------------------------------------------------------------------------

def _extreme(name: str, op, x, dim, keepdim, fallback, *fallback_args):
    """``op``'s lowering for a max/min-like reduction, or the CPU fallback for what torch
    rejects (bad dims, empty rows) or cannot do natively."""
    axes = _dims(x, dim)
    r = NotImplemented if axes is None else _run(op, x, (axes, keepdim), name=name)
    return run_on_cpu(fallback, x, *fallback_args) if r is NotImplemented else r


def _register_extremes(kind: str) -> None:
    ops = getattr(aten, kind), getattr(aten, f"a{kind}"), getattr(aten, f"arg{kind}")

    def amax(x, dim=(), keepdim=False):
        return _extreme(f"a{kind}", ops[1].default, x, dim, keepdim, ops[1].default,
                        dim, keepdim)

    def full(x):
        return _extreme(kind, ops[1].default, x, None, False, ops[0].default)

    def with_dim(x, dim, keepdim=False):
        return _extreme(f"{kind}.dim", ops[0].dim, x, dim, keepdim, ops[0].dim, dim, keepdim)

    def argmax(x, dim=None, keepdim=False):
        return _extreme(f"arg{kind}", ops[2].default, x, dim, keepdim, ops[2].default,
                        dim, keepdim)

    impl(f"a{kind}")(amax)
    impl(kind)(full)
    impl(f"{kind}.dim")(with_dim)
    impl(f"arg{kind}")(argmax)


_register_extremes("max")
_register_extremes("min")


# --- variance -----------------------------------------------------------------------------

def _variance(name: str, op, root: bool, with_mean: bool):
    def kernel(x, dim=None, *, correction=None, keepdim=False):
        axes = _dims(x, dim)
        r = NotImplemented if axes is None else _run(
            op, x, (axes,), (("correction", correction), ("keepdim", keepdim)), name=name)
        if r is NotImplemented:
            return run_on_cpu(op, x, dim, correction=correction, keepdim=keepdim)
        return r

    impl(str(op).removeprefix("aten."))(kernel)
    return kernel


var = _variance("var", aten.var.correction, False, False)
std = _variance("std", aten.std.correction, True, False)
var_mean = _variance("var_mean", aten.var_mean.correction, False, True)
std_mean = _variance("std_mean", aten.std_mean.correction, True, True)


# --- norms --------------------------------------------------------------------------------

@impl("linalg_vector_norm")
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    axes = _dims(x, dim)
    r = NotImplemented
    if axes is not None and isinstance(ord, (int, float)):
        r = _run(aten.linalg_vector_norm.default, x, (float(ord), axes, keepdim),
                 (("dtype", dtype),), name="vector_norm")
    if r is NotImplemented:
        return run_on_cpu(aten.linalg_vector_norm.default, x, ord, dim, keepdim, dtype=dtype)
    return r


__all__ = ["OPINFO", "linalg_vector_norm", "mean_all", "mean_dim", "mean_out", "std",
           "std_mean", "sum_all", "sum_dim", "sum_out", "var", "var_mean"]


# --- all / any ----------------------------------------------------------------------------

def _all_any(name: str, kind: str):
    """``all``/``any`` over every dimension or ``dim`` (an int or a list), and ``out=``.
    The result is bool (torch returns uint8 for uint8 inputs: the fallback handles that)."""

    op = getattr(aten, name).dims

    def reduce(x, dim=None, keepdim=False, *, out=None):
        # dim=() reduces nothing here, unlike sum's and amax's dim=() (torch 2.13)
        axes = () if isinstance(dim, (list, tuple)) and not dim else _dims(x, dim)
        if axes is None or not runner.supported(x) or x.dtype is torch.uint8 or (
                out is not None and (out.dtype is not torch.bool
                                     or not _into(out, x, _reduced_shape(x, axes, keepdim)))):
            return NotImplemented
        dims = None if dim is None else tuple(dim) if isinstance(dim, (list, tuple)) else dim
        result = _run(op, x, (dims, keepdim), (), None if out is None else (out,), name)
        return result if out is None or result is NotImplemented else out

    native_or_cpu(name)(lambda x: reduce(x))
    native_or_cpu(f"{name}.dim", f"{name}.dims")(
        lambda x, dim=None, keepdim=False: reduce(x, dim, keepdim))
    native_or_cpu(f"{name}.all_out")(lambda x, *, out: reduce(x, out=out))
    native_or_cpu(f"{name}.out", f"{name}.dims_out")(
        lambda x, dim=None, keepdim=False, *, out: reduce(x, dim, keepdim, out=out))


_all_any("all", "min")
_all_any("any", "max")


# torch's mode.values kernel is composite and refuses every device but CPU, CUDA and XPU
# before it looks at the tensors; the CPU's, on aliases of them, is the device's (mode has
# no program: it sorts).
@composed("mode.values")
def mode_values(x, dim=-1, keepdim=False, *, values, indices):
    return run_on_cpu(aten.mode.values, x, dim, keepdim, values=values, indices=indices)
