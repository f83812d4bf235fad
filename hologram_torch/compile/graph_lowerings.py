"""Lowerings only compiled graphs need: the factories and the functional ``copy`` that
AOTAutograd's decompositions leave in a graph (``full``, ``zeros_like``, ``scalar_tensor``,
``copy``, ...). Eagerly these ops allocate and fill tensors and never build a program, so
they are kept here rather than in :mod:`hologram_torch.lowering`, whose table is the one the
eager device and its tests share. Also Adam's ``prims.fma`` and ``pow.Scalar``, and forms
of ``mm``, ``sum`` and layer norm's backward that reach BLAS where the compiler would
generate a strided, unvectorized kernel (the section "products with a unit dimension").
:func:`get` looks here first, then in that table."""

from __future__ import annotations

import math

import torch

from hologram_torch import lowering, memory
from hologram_torch.lowering.common import Tensor, Unsupported, cast, isa, opmath, result_type

aten = torch.ops.aten
EXTRA: dict = {}
#: Entries for operators that another module defines, by their names (``prims::fma``
#: comes with ``torch._inductor``, whose import takes seconds: a graph holding the
#: operator has imported it, and ``import hologram_torch`` does not).
BY_NAME: dict = {}


def _register(*ops):
    def decorate(fn):
        for op in ops:
            (BY_NAME if isinstance(op, str) else EXTRA)[op] = fn
        return fn

    return decorate


def _extra(op):
    fn = EXTRA.get(op)
    if fn is None and isinstance(op, torch._ops.OpOverload):
        fn = BY_NAME.get(op.name())
    return fn


def get(op):
    """The lowering of ``op`` for compiled graphs, or None."""
    return _extra(op) or lowering.get(op)


def lower(op, g, *args, **kwargs):
    """``op`` on graph values, as :func:`hologram_torch.lowering.lower` (raises
    :class:`~hologram_torch.lowering.Unsupported`)."""
    fn = _extra(op)
    if fn is None:
        return lowering.lower(op, g, *args, **kwargs)
    result = fn(g, *args, **kwargs)
    if result is NotImplemented:
        raise Unsupported(f"{op}: these arguments have no lowering")
    return result


def _default_dtype(value) -> torch.dtype:
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    if isinstance(value, float):
        return torch.get_default_dtype()
    raise Unsupported(f"fill value {value!r}")


def full_of(g, shape, value, dtype: torch.dtype):
    """A tensor of ``shape`` holding ``value`` exactly (a select, not arithmetic, so -0.0,
    NaN and infinities keep their bits), broadcast from one element: the program stores it
    where it is used and never materializes the broadcast."""
    if not isinstance(value, (bool, int, float)):
        raise Unsupported(f"fill value {value!r}")
    target = isa(dtype)
    index = g.arange(1)
    one = g.where(g.binary("lt", index, 0), cast(index, target), cast(value, target))
    return one.reshape().broadcast_to(tuple(shape))


@_register(aten.full.default)
def full(g, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return full_of(g, size, fill_value, dtype or _default_dtype(fill_value))


def _constant_factory(value):
    def factory(g, size, *, dtype=None, layout=None, device=None, pin_memory=None):
        return full_of(g, size, value, dtype or torch.get_default_dtype())

    return factory


EXTRA[aten.zeros.default] = _constant_factory(0)
EXTRA[aten.ones.default] = _constant_factory(1)


def _like_factory(value):
    def factory(g, self, *, dtype=None, layout=None, device=None, pin_memory=None,
                memory_format=None):
        return full_of(g, self.shape, value, dtype or lowering.common.TORCH[self.dtype])

    return factory


# empty_like's values are unspecified: zeros are one choice of them.
EXTRA[aten.zeros_like.default] = _like_factory(0)
EXTRA[aten.empty_like.default] = _like_factory(0)
EXTRA[aten.ones_like.default] = _like_factory(1)


@_register(aten.full_like.default)
def full_like(g, self, fill_value, *, dtype=None, layout=None, device=None,
              pin_memory=None, memory_format=None):
    return full_of(g, self.shape, fill_value, dtype or lowering.common.TORCH[self.dtype])


@_register(aten.scalar_tensor.default)
def scalar_tensor(g, s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return full_of(g, (), s, dtype or torch.get_default_dtype())


@_register(aten.copy.default)
def copy(g, self, src, non_blocking=False):
    """The functional ``copy``: ``src`` broadcast to ``self``'s shape, in its dtype."""
    return g.copy(cast(src, self.dtype).broadcast_to(self.shape))


@_register(aten.lift_fresh_copy.default)
def lift_fresh_copy(g, self):
    return g.copy(self)


# --- what optimizers' graphs leave (Adam's lerp and bias correction) -----------------------

@_register("prims::fma")
def fma(g, a, b, c):
    """``a * b + c`` rounded once (decomposed ``lerp`` leaves it), in opmath."""
    if not isinstance(a, Tensor):
        a, b = b, a
    if not isinstance(a, Tensor):
        return NotImplemented
    target = isa(result_type(a, b, c))
    if not target.is_float:
        return NotImplemented
    compute = opmath(target)
    return cast(g.fma(cast(a, compute), cast(b, compute), cast(c, compute)), target)


@_register(aten.pow.Scalar)
def pow_scalar(g, self, exponent):
    """A number to a tensor's powers (``beta ** step``): the table's ``pow`` with the number
    as a 0-d tensor of the result's dtype."""
    if not isinstance(self, (int, float)) or isinstance(self, bool):
        return NotImplemented
    base = full_of(g, (), self, result_type(self, exponent))
    return lowering.lower(aten.pow.Tensor_Tensor, g, base, exponent)


# --- products with a unit dimension, and column sums, as BLAS calls -----------------------

#: Fewest terms and outputs for which a product with a unit M or N is worth a BLAS call
#: (below, the generated kernel costs about what the call does).
BLAS_MIN = 16


def _gemm_operands(a, b) -> bool:
    """Are ``a`` and ``b`` 2-D tensors of one dtype BLAS multiplies (f32, f64)?"""
    return (isinstance(a, Tensor) and isinstance(b, Tensor) and a.ndim == b.ndim == 2
            and a.dtype is b.dtype and a.dtype.name in ("f32", "f64"))


def _strided_vector_product(a, b) -> bool:
    """Is ``a[m, k] @ b[k, n]`` a matrix-vector product (m or n is 1) whose terms a
    generated kernel would read with a stride (``sum(dy, 0)`` as ``ones @ dy``, the weight
    gradient ``dy.T @ x`` of a layer with one output)? The compiler squeezes the unit
    dimension and keeps such a contraction as a kernel, which reads it unvectorized:
    67 µs for 64 x 512 terms, against ~7 µs for BLAS."""
    (m, k), n = a.shape, b.shape[1]
    if k < BLAS_MIN:
        return False
    # The other operand strided along k, and laid out as BLAS takes a matrix (one unit
    # stride, rows or columns apart by at least their length).
    if m == 1:
        return n >= BLAS_MIN and b.strides[1] == 1 and b.strides[0] >= n
    return n == 1 and m >= BLAS_MIN and a.strides[0] == 1 and a.strides[1] >= m


def blas_product(g, a, b):
    """``a @ b`` for :func:`_gemm_operands`, a strided matrix-vector product made a matrix
    product: the unit dimension padded to two (the operand broadcast to two rows or
    columns, a copy of k elements), which the compiler hands to BLAS, and the first
    row or column of its result taken."""
    if not _strided_vector_product(a, b):
        return g.matmul(a, b)
    m, k = a.shape
    if m == 1:
        return g.matmul(g.copy(a.broadcast_to((2, k))), b)[0:1]
    return g.matmul(a, g.copy(b.broadcast_to((k, 2))))[:, 0:1]


@_register(aten.mm.default)
def mm(g, self, other):
    """The table's ``mm``, except that a strided matrix-vector product goes to BLAS
    (:func:`blas_product`) and an outer product (k = 1: one term per element, so the same
    values) is a broadcast multiply, which fuses, where BLAS takes 20 µs for 64 x 512."""
    if _gemm_operands(self, other) and self.shape[1] == other.shape[0]:
        if self.shape[1] == 1:
            return self * other  # [m, 1] * [1, n]
        return blas_product(g, self, other)
    return lowering.lower(aten.mm.default, g, self, other)


def column_sum(g, x, lead: int):
    """``x`` (f32 or f64) summed over its first ``lead`` dimensions as ``ones[1, rows] @
    x[rows, cols]`` through :func:`blas_product` (summing a column reads it with a stride
    of ``cols``), or None where that is no BLAS call (small, or laid out so that the
    kernel's reduction reads contiguously)."""
    if not 0 < lead < x.ndim or x.dtype.name not in ("f32", "f64"):
        return None
    rows, cols = math.prod(x.shape[:lead]), math.prod(x.shape[lead:])
    ones = full_of(g, (1, rows), 1, lowering.common.TORCH[x.dtype])
    if x.ndim == 2:
        matrix = x  # read through its strides
    elif x.strides == tuple(memory.contiguous_strides(x.shape)):
        matrix = x.reshape(rows, cols)  # a view
    else:
        return None  # the reshape would be a copy
    if not _strided_vector_product(ones, matrix):
        return None
    return blas_product(g, ones, matrix)[0].reshape(*x.shape[lead:])


@_register(aten.sum.dim_IntList)
def sum_dim(g, self, dim, keepdim=False, *, dtype=None):
    """The table's ``sum``, except that a float sum over leading dimensions (a bias
    gradient, ``sum(dy, [0])``) is a :func:`column_sum`."""
    from hologram_torch.lowering.reduction import dims, sum_dtype

    axes = dims(self, dim) if isinstance(self, Tensor) and self.ndim else None
    lead = len(axes or ())
    if lead and axes == tuple(range(lead)) and sum_dtype(self, dtype) is self.dtype:
        total = column_sum(g, self, lead)
        if total is not None:
            return total.reshape(*((1,) * lead if keepdim else ()), *self.shape[lead:])
    return lowering.lower(aten.sum.dim_IntList, g, self, dim, keepdim, dtype=dtype)


@_register(aten.native_layer_norm_backward.default)
def layer_norm_backward(g, grad_out, input, normalized_shape, mean, rstd, weight, bias,
                        output_mask):
    """The table's, except that the weight's and the bias's gradients, sums over the
    leading dimensions of ``dy * x_hat`` and ``dy``, are :func:`column_sum` products
    (the table's reductions read each column with a stride and recompute ``x_hat`` per
    term: ~0.1 ms per layer norm of 512 x 64 against ~10 µs). ``x_hat`` is rounded as
    the table rounds it, ``fma(x, rstd, -rstd * mean)``, as torch's CPU kernel does."""
    op = aten.native_layer_norm_backward.default
    args = (grad_out, input, normalized_shape, mean, rstd, weight, bias)
    wanted = (bool(output_mask[1]) and weight is not None,
              bool(output_mask[2]) and bias is not None)
    lead = input.ndim - len(normalized_shape) if isinstance(input, Tensor) else 0
    parameters = [p for p in (weight, bias) if p is not None]
    same = all(isinstance(t, Tensor) and t.dtype is input.dtype
               for t in (grad_out, mean, rstd, *parameters))
    if not any(wanted) or lead < 1 or not same or input.dtype.name not in ("f32", "f64"):
        return lowering.lower(op, g, *args, output_mask)
    dx = lowering.lower(op, g, *args, [output_mask[0], False, False])[0]
    dw = db = None
    if wanted[0]:
        stats = input.shape[:lead] + (1,) * len(normalized_shape)
        m, r = mean.reshape(*stats), rstd.reshape(*stats)
        dw = _lead_sum(g, grad_out * g.fma(input, r, -(r * m)), lead)
    if wanted[1]:
        db = _lead_sum(g, grad_out, lead)
    return dx, dw, db


def _lead_sum(g, x, lead: int):
    """``x`` summed over its first ``lead`` dimensions: a :func:`column_sum` where that is
    a BLAS call, else the graph's reduction."""
    total = column_sum(g, x, lead)
    return total if total is not None else g.reduce("sum", x, tuple(range(lead)))
