"""``addcmul``/``addcdiv``/``lerp`` and the optimizers' ``_foreach_*`` ops.

A foreach entry takes lists of graph tensors (and numbers, or lists of numbers) and returns
the list of results: each ``self[i]``'s op in its own dtype, computed in opmath. The
per-tensor math (:data:`MATH`) is shared with the eager device, which runs one program per
tensor of a list.
"""

from __future__ import annotations

import torch

from hologram_torch.lowering.common import (
    Tensor,
    Unsupported,
    aten,
    cast,
    is_float,
    is_number,
    isa,
    opmath,
    register,
    result_type,
)
from hologram_torch.lowering.elementwise import torch_max

# --- per-tensor math: values already in the compute dtype ----------------------------------


def addcmul_math(g, x, a, b, value):
    return x + a * b * cast(value, x.dtype)


def addcdiv_math(g, x, a, b, value):
    return x + a / b * cast(value, x.dtype)


def lerp_math(g, x, end, weight):
    # torch's formula: exact at weight 0 and 1, symmetric rounding around 0.5
    weight = cast(weight, x.dtype)
    diff = end - x
    if not isinstance(weight, Tensor):  # a Python number: the branch is known
        return x + weight * diff if abs(weight) < 0.5 else end - diff * (1.0 - weight)
    return g.where(g.binary("lt", abs(weight), 0.5), x + weight * diff,
                   end - diff * (1.0 - weight))


def add_math(g, x, y, alpha=1):
    y = cast(y, x.dtype)
    return x + (y if _one(alpha) else y * cast(alpha, x.dtype))


def sub_math(g, x, y, alpha=1):
    y = cast(y, x.dtype)
    return x - (y if _one(alpha) else y * cast(alpha, x.dtype))


def mul_math(g, x, y):
    return x * cast(y, x.dtype)


def div_math(g, x, y):
    return x / cast(y, x.dtype)


def maximum_math(g, x, y):
    return torch_max(g, x, cast(y, x.dtype))


def sqrt_math(g, x):
    return g.unary("sqrt", x)


def neg_math(g, x):
    return -x


def _one(x) -> bool:
    return not isinstance(x, Tensor) and x == 1


#: ``_foreach_<name>``'s per-tensor math.
MATH = {"add": add_math, "sub": sub_math, "mul": mul_math, "div": div_math,
        "maximum": maximum_math, "sqrt": sqrt_math, "neg": neg_math, "lerp": lerp_math,
        "addcmul": addcmul_math, "addcdiv": addcdiv_math}


def _floats(*xs) -> None:
    """The tensors among ``xs`` are float (numbers may be anything real)."""
    if not all(is_float(x) for x in xs if isinstance(x, Tensor) and not is_number(x)):
        raise Unsupported("a non-float tensor")


def _apply(fn, args, result):
    compute = opmath(result)
    g = next(a.graph for a in args if isinstance(a, Tensor))
    return cast(fn(g, *(cast(a, compute) for a in args)), result)


# --- single-tensor ops --------------------------------------------------------------------

def _ternary_result(self, a, b) -> torch.dtype:
    result = result_type(self, a)
    if not is_number(b):
        result = torch.promote_types(result, result_type(a, b))
    return result


def _value_op(fn):
    def entry(g, self, tensor1, tensor2, value=1):  # value: keyword-only in ATen
        _floats(self, tensor1, tensor2, value)
        result = isa(torch.promote_types(result_type(self, tensor1),
                                         result_type(tensor1, tensor2)))
        return _apply(fn, (self, tensor1, tensor2, value), result)

    return entry


addcmul = register(aten.addcmul.default)(_value_op(addcmul_math))
addcdiv = register(aten.addcdiv.default)(_value_op(addcdiv_math))


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(g, self, end, weight):
    _floats(self, end, weight)
    return _apply(lerp_math, (self, end, weight), isa(_ternary_result(self, end, weight)))


# --- foreach ------------------------------------------------------------------------------

def _column(x, n: int) -> list:
    """A list argument as it is; one value (a number, a tensor) for every tensor."""
    return list(x) if isinstance(x, (list, tuple)) else [x] * n


def _each(name: str, self, *others):
    fn = MATH[name]
    columns = [_column(o, len(self)) for o in others]
    results = []
    for x, *rest in zip(self, *columns):
        _floats(x, *rest)
        results.append(_apply(fn, (x, *rest), x.dtype))
    return results


def _foreach(name: str, overloads: str, alpha: bool = False):
    ops = getattr(aten, f"_foreach_{name}")
    if alpha:
        def entry(g, self, other, *, alpha=1):
            return _each(name, self, other, alpha)
    else:
        def entry(g, self, *others):
            return _each(name, self, *others)
    register(*(getattr(ops, o) for o in overloads.split()))(entry)
    return entry


_foreach("add", "List Tensor", alpha=True)
_foreach("add", "Scalar ScalarList")
_foreach("sub", "List", alpha=True)
_foreach("sub", "Scalar ScalarList")
_foreach("mul", "Scalar List ScalarList Tensor")
_foreach("div", "Scalar List ScalarList Tensor")
_foreach("maximum", "List Scalar ScalarList")
_foreach("sqrt", "default")
_foreach("neg", "default")
_foreach("lerp", "Scalar List ScalarList")


def _foreach_value(name: str):
    ops = getattr(aten, f"_foreach_{name}")

    @register(ops.Scalar, ops.ScalarList, ops.Tensor)
    def entry(g, self, tensor1, tensor2, value=1):
        if isinstance(value, Tensor):  # .Tensor: a 1-D tensor of the scalars
            if value.ndim != 1 or value.shape[0] != len(self):
                raise Unsupported("scalars of another length")  # torch raises
            value = [value[i] for i in range(len(self))]
        return _each(name, self, tensor1, tensor2, value)

    return entry


_foreach_value("addcmul")
_foreach_value("addcdiv")
