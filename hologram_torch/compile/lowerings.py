"""Lowerings only compiled graphs need: the factories and the functional ``copy`` that
AOTAutograd's decompositions leave in a graph (``full``, ``zeros_like``, ``scalar_tensor``,
``copy``, ...). Eagerly these ops allocate and fill tensors and never build a program, so
they are kept here rather than in :mod:`hologram_torch.lowering`, whose table is the one the
eager device and its tests share. :func:`get` looks here first, then in that table."""

from __future__ import annotations

import math

import torch

from hologram_torch import lowering, memory
from hologram_torch.lowering.common import Tensor, Unsupported, cast, isa, opmath, result_type

aten = torch.ops.aten
EXTRA: dict = {}


def _register(*ops):
    def decorate(fn):
        for op in ops:
            EXTRA[op] = fn
        return fn

    return decorate


def get(op):
    """The lowering of ``op`` for compiled graphs, or None."""
    return EXTRA.get(op) or lowering.get(op)


def lower(op, g, *args, **kwargs):
    """``op`` on graph values, as :func:`hologram_torch.lowering.lower` (raises
    :class:`~hologram_torch.lowering.Unsupported`)."""
    fn = EXTRA.get(op)
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

@_register(torch.ops.prims.fma.default)
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
    (:func:`blas_product`)."""
    if _gemm_operands(self, other) and self.shape[1] == other.shape[0]:
        return blas_product(g, self, other)
    return lowering.lower(aten.mm.default, g, self, other)


@_register(aten.sum.dim_IntList)
def sum_dim(g, self, dim, keepdim=False, *, dtype=None):
    """The table's ``sum``, except that a float sum over leading dimensions (a bias
    gradient, ``sum(dy, [0])``) is ``ones[1, rows] @ x[rows, cols]`` through
    :func:`blas_product`: summing a column reads it with a stride of ``cols``."""
    from hologram_torch.lowering.reduction import dims, sum_dtype

    axes = dims(self, dim) if isinstance(self, Tensor) and self.ndim else None
    lead = len(axes or ())
    if (lead and axes == tuple(range(lead)) and self.dtype.name in ("f32", "f64")
            and sum_dtype(self, dtype) is self.dtype):
        rows, cols = math.prod(self.shape[:lead]), math.prod(self.shape[lead:])
        ones = full_of(g, (1, rows), 1, lowering.common.TORCH[self.dtype])
        dense = self.strides == tuple(memory.contiguous_strides(self.shape))
        # A matrix is read through its strides; more dimensions only when they are a view.
        x = self if self.ndim == 2 else self.reshape(rows, cols) if dense else None
        if x is not None and _strided_vector_product(ones, x):
            total = blas_product(g, ones, x)
            return total.reshape(*((1,) * lead if keepdim else ()), *self.shape[lead:])
    return lowering.lower(aten.sum.dim_IntList, g, self, dim, keepdim, dtype=dtype)
