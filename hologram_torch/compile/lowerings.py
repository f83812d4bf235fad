"""Lowerings only compiled graphs need: the factories and the functional ``copy`` that
AOTAutograd's decompositions leave in a graph (``full``, ``zeros_like``, ``scalar_tensor``,
``copy``, ...). Eagerly these ops allocate and fill tensors and never build a program, so
they are kept here rather than in :mod:`hologram_torch.lowering`, whose table is the one the
eager device and its tests share. :func:`get` looks here first, then in that table."""

from __future__ import annotations

import torch

from hologram_torch import lowering
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
