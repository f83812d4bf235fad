"""``addcmul``/``addcdiv``/``lerp`` and the ``_foreach_*`` ops of the optimizers.

A foreach op runs its elementwise program once per tensor of the list (one compiled
kernel per distinct shape); the Python loop is the dispatch cost PyTorch's own foreach
kernels save on CUDA, and it is small next to the kernels at training sizes. Lists with
a tensor the device cannot compute natively go to the CPU fallback as a whole.
"""

from __future__ import annotations

import torch

from hologram_torch.aten.elementwise import _check_inplace, _float, _pointwise, torch_max
from hologram_torch.aten.program import cast
from hologram_torch.aten.registry import native_or_cpu

OPINFO = ("addcmul", "addcdiv", "lerp")


# --- single-tensor ops ------------------------------------------------------------------

def _addcmul(g, x, a, b, value):
    return x + a * b * cast(value, x.dtype)


def _addcdiv(g, x, a, b, value):
    return x + a / b * cast(value, x.dtype)


def _lerp(g, x, end, weight):
    # torch's formula: exact at weight 0 and 1, symmetric rounding around 0.5
    weight = cast(weight, x.dtype)
    diff = end - x
    return g.where(g.binary("lt", abs(weight), 0.5), x + weight * diff,
                   end - diff * (1.0 - weight))


def _ternary(name, fn, self, a, b, out=None):
    if not _float(self, a, b):
        return NotImplemented
    result = torch.result_type(self, a)
    if isinstance(b, torch.Tensor):
        result = torch.promote_types(result, torch.result_type(a, b))
    if out is not None:
        _check_inplace(name, out, result, a, b if isinstance(b, torch.Tensor) else None)
        return _pointwise(name, fn, (self, a, b), out.dtype, out=(out,))
    return _pointwise(name, fn, (self, a, b), result)


@native_or_cpu("addcmul")
def addcmul(self, tensor1, tensor2, *, value=1):
    return _ternary_value("addcmul", _addcmul, self, tensor1, tensor2, value)


@native_or_cpu("addcmul_")
def addcmul_(self, tensor1, tensor2, *, value=1):
    return _ternary_value("addcmul_", _addcmul, self, tensor1, tensor2, value, self)


@native_or_cpu("addcdiv")
def addcdiv(self, tensor1, tensor2, *, value=1):
    return _ternary_value("addcdiv", _addcdiv, self, tensor1, tensor2, value)


@native_or_cpu("addcdiv_")
def addcdiv_(self, tensor1, tensor2, *, value=1):
    return _ternary_value("addcdiv_", _addcdiv, self, tensor1, tensor2, value, self)


def _ternary_value(name, fn, self, a, b, value, out=None):
    if not _float(self, a, b, value) or isinstance(value, complex):
        return NotImplemented
    result = torch.promote_types(torch.result_type(self, a), torch.result_type(a, b))
    if out is not None:
        _check_inplace(name, out, result, a, b)
        return _pointwise(name, fn, (self, a, b, value), out.dtype, out=(out,))
    return _pointwise(name, fn, (self, a, b, value), result)


@native_or_cpu("lerp.Scalar", "lerp.Tensor")
def lerp(self, end, weight):
    return _ternary("lerp", _lerp, self, end, weight)


@native_or_cpu("lerp_.Scalar", "lerp_.Tensor")
def lerp_(self, end, weight):
    return _ternary("lerp_", _lerp, self, end, weight, out=self)


# --- foreach ----------------------------------------------------------------------------

def _add(g, x, y, alpha):
    return x + cast(y, x.dtype) * cast(alpha, x.dtype)


def _mul(g, x, y):
    return x * cast(y, x.dtype)


def _div(g, x, y):
    return x / cast(y, x.dtype)


def _maximum(g, x, y):
    return torch_max(g, x, cast(y, x.dtype))


def _sqrt(g, x):
    return g.unary("sqrt", x)


def _neg(g, x):
    return -x


def _each(name, fn, self, *others, inplace):
    """``fn(self[i], *others[i])`` for each i (others: lists, or one value for all)."""
    columns = [o if isinstance(o, (list, tuple)) else [o] * len(self) for o in others]
    rows = list(zip(self, *columns))
    if not all(_float(*row) for row in rows):
        return NotImplemented
    results = []
    for x, *rest in rows:
        if inplace:
            _pointwise(name, fn, (x, *rest), x.dtype, out=(x,))
        else:
            results.append(_pointwise(name, fn, (x, *rest), x.dtype))
    return None if inplace else results


def _foreach(name, fn, overloads, *, alpha=False):
    """Register ``_foreach_<name>`` and ``_foreach_<name>_`` for the overload names."""
    for suffix in overloads:
        dotted = f".{suffix}" if suffix else ""
        if alpha:
            def functional(self, other, alpha=1):
                return _each(name, fn, self, other, alpha, inplace=False)

            def inplace(self, other, alpha=1):
                return _each(name, fn, self, other, alpha, inplace=True)
        else:
            def functional(self, *others):
                return _each(name, fn, self, *others, inplace=False)

            def inplace(self, *others):
                return _each(name, fn, self, *others, inplace=True)
        native_or_cpu(f"_foreach_{name}{dotted}")(functional)
        native_or_cpu(f"_foreach_{name}_{dotted}")(inplace)


_foreach("add", _add, ("List", "Tensor"), alpha=True)
_foreach("add", lambda g, x, y: x + cast(y, x.dtype), ("Scalar", "ScalarList"))
_foreach("sub", lambda g, x, y, alpha: x - cast(y, x.dtype) * cast(alpha, x.dtype),
         ("List",), alpha=True)
_foreach("sub", lambda g, x, y: x - cast(y, x.dtype), ("Scalar", "ScalarList"))
_foreach("mul", _mul, ("Scalar", "List", "ScalarList", "Tensor"))
_foreach("div", _div, ("Scalar", "List", "ScalarList", "Tensor"))
_foreach("maximum", _maximum, ("List", "Scalar", "ScalarList"))
_foreach("sqrt", _sqrt, ("",))
_foreach("neg", _neg, ("",))
_foreach("lerp", _lerp, ("Scalar", "List", "ScalarList"))


def _foreach_ternary(name, fn):
    def functional(self, tensor1, tensor2, value=1):
        return _each(name, fn, self, tensor1, tensor2, _values(value, self),
                     inplace=False)

    def inplace(self, tensor1, tensor2, value=1):
        return _each(name, fn, self, tensor1, tensor2, _values(value, self), inplace=True)

    for suffix in ("Scalar", "ScalarList", "Tensor"):
        native_or_cpu(f"_foreach_{name}.{suffix}")(functional)
        native_or_cpu(f"_foreach_{name}_.{suffix}")(inplace)


def _values(value, tensors):
    """A ScalarList as given; a 1-D CPU tensor of scalars (the .Tensor overloads) as
    numbers; one scalar for every tensor."""
    if isinstance(value, torch.Tensor):
        return value.tolist() if value.dim() else value
    return value


_foreach_ternary("addcmul", _addcmul)
_foreach_ternary("addcdiv", _addcdiv)


@native_or_cpu("_foreach_zero_")
def _foreach_zero_(self):
    for x in self:
        x.zero_()


@native_or_cpu("_foreach_copy_")
def _foreach_copy_(self, src, non_blocking=False):
    for x, s in zip(self, src):
        x.copy_(s)


__all__ = ["addcdiv", "addcmul", "lerp"]
