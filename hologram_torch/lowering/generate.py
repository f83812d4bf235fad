"""Generated and rearranged tensors: ``linspace``, ``logspace``, ``eye`` (values computed
from positions) and ``flip``, ``roll`` (a tensor read in another order).

``linspace`` is PyTorch's CPU kernel, bit for bit: it computes from both ends, ``start +
step*i`` for ``i < steps/2`` and ``end - step*(steps-1-i)`` otherwise, in the result's
dtype, each product and sum rounded once (the CPU build contracts them into a fused
multiply-add); integer dtypes compute in float64 and truncate; float16 and bfloat16 round
to their format after every operation (c10's half arithmetic). ``logspace`` raises
``base`` to those exponents in float64 (``pow``), then converts. ``flip`` is a load
through negative strides; ``roll`` joins the two slices of each rolled dimension in the
other order (``cat``: contiguous copies, ~5x faster than a gather at computed
coordinates).
"""

from __future__ import annotations

from hologram.frontend.graph import Tensor
from hologram.isa import dtypes as dt
from hologram_torch.lowering.common import Unsupported, aten, cast, is_number, isa, register
from hologram_torch.lowering.shape import cat

_HALF = (dt.float16, dt.bfloat16)


def _dims(x, dims) -> list[int]:
    """``dims`` wrapped to ``x``'s rank; Unsupported where torch raises (out of range,
    repeated)."""
    rank = max(x.ndim, 1)
    if not all(-rank <= d < rank for d in dims):
        raise Unsupported(f"dims {list(dims)} out of range")
    wrapped = [d % rank for d in dims]
    if len(set(wrapped)) != len(wrapped):
        raise Unsupported(f"dims {list(dims)} repeat a dimension")
    return wrapped


@register(aten.flip.default)
def flip(g, self, dims):
    wrapped = _dims(self, dims)
    if self.ndim == 0:
        return g.copy(self)
    return g.copy(self[tuple(slice(None, None, -1) if d in wrapped else slice(None)
                             for d in range(self.ndim))])


@register(aten.roll.default)
def roll(g, self, shifts, dims=()):
    shifts, dims = list(shifts), list(dims)
    if not dims:
        if len(shifts) != 1:
            raise Unsupported("roll: shifts and dims do not match")  # torch raises
        return roll(g, self.reshape(-1), shifts, [0]).reshape(*self.shape)
    if len(shifts) != len(dims) or not shifts:
        raise Unsupported("roll: shifts and dims do not match")  # torch raises
    wrapped = _dims(self, dims)
    if self.ndim == 0 or 0 in self.shape:
        return g.copy(self)
    result = self
    for d, shift in zip(wrapped, shifts):
        n = self.shape[d]
        split = (n - int(shift) % n) % n  # result[i] = self[(i - shift) mod n]
        if split:
            before = (slice(None),) * d
            result = cat(g, [result[(*before, slice(split, None))],
                             result[(*before, slice(0, split))]], d)
    return result if result is not self else g.copy(self)


# --- linspace / logspace ----------------------------------------------------------------

def _scalar(g, x):
    """A runtime number (a 0-d graph tensor) as it is; a Python number as a 0-d graph
    tensor of float64 (int64 for an int), exactly (-0.0, inf and NaN included)."""
    if not is_number(x) or isinstance(x, Tensor):
        return x
    kind = dt.int64 if isinstance(x, int) else dt.float64
    one = cast(g.arange(1), kind)[0] * 0 + 1
    return one * x  # 1 * x is exact


def _number(x, dtype: dt.DType):
    """A 0-d graph number in ``dtype`` as torch's ``Scalar.to<T>()`` converts a double:
    float16/bfloat16 through float32 (c10's half types convert from float)."""
    if dtype in _HALF:
        return cast(cast(x, dt.float32), dtype)
    return cast(x, dtype)


def _half_op(op: str, a, b, dtype: dt.DType):
    """``a op b`` as c10's half arithmetic computes it: in float32, rounded to ``dtype``."""
    return cast(a.graph.binary(op, cast(a, dt.float32), cast(b, dt.float32)), dtype)


def linspace_math(g, start, end, steps: int, dtype: dt.DType):
    """``steps`` values from ``start`` to ``end`` (runtime or Python numbers) in
    ``dtype``, as torch's CPU kernel computes them (module docstring)."""
    if steps == 0:
        return cast(g.arange(0), dtype)
    start, end = _scalar(g, start), _scalar(g, end)
    position = g.arange(steps)
    if steps == 1:  # torch fills with start
        return _number(start, dtype).broadcast_to((1,))
    from_end = g.binary("ge", position, steps // 2)
    countdown = (steps - 1) - position
    if dtype.is_float and dtype not in _HALF:
        s, e = _number(start, dtype), _number(end, dtype)
        step = (e - s) / float(steps - 1)
        first = g.fma(step.broadcast_to((steps,)), cast(position, dtype), s)
        second = g.fma((-step).broadcast_to((steps,)), cast(countdown, dtype), e)
        return g.where(from_end, second, first)
    if dtype in _HALF:
        s, e = _number(start, dtype), _number(end, dtype)
        span = _half_op("sub", e, s, dtype)
        step = _half_op("div", span, _number(_scalar(g, float(steps - 1)), dtype), dtype)
        index = _number(g.where(from_end, countdown, position), dtype)
        offset = _half_op("mul", step.broadcast_to((steps,)), index, dtype)
        return g.where(from_end, _half_op("sub", e, offset, dtype),
                       _half_op("add", s, offset, dtype))
    # integers: the bounds converted to the dtype, the values computed in float64 and
    # truncated toward zero
    s = cast(_number(start, dtype), dt.float64)
    e = cast(_number(end, dtype), dt.float64)
    step = (e - s) / float(steps - 1)
    first = g.fma(step.broadcast_to((steps,)), cast(position, dt.float64), s)
    second = g.fma((-step).broadcast_to((steps,)), cast(countdown, dt.float64), e)
    return cast(g.where(from_end, second, first), dtype)


def logspace_math(g, start, end, steps: int, base, dtype: dt.DType):
    """``base ** e`` for the ``steps`` exponents from ``start`` to ``end``, as torch's CPU
    kernel computes them: the bounds converted to ``dtype``, their difference taken in
    ``dtype``, the exponents (from both ends, as :func:`linspace_math`) and the power in
    float64, then rounded to ``dtype``: float32, float16 and bfloat16 only. (float64
    results would need a correctly rounded float64 ``pow``, as glibc's, to match; integer
    results truncate it, so an exact power one ulp low, 999.99..., would give 999.)"""
    if dtype not in (dt.float32, *_HALF):
        raise Unsupported(f"logspace of {dtype}: the CPU's")
    if steps == 0:
        return cast(g.arange(0), dtype)
    start, end, base = _scalar(g, start), _scalar(g, end), _scalar(g, base)
    base = cast(base, dt.float64)
    if steps == 1:  # torch fills with base ** start, start taken as a double
        value = g.binary("pow", base, cast(start, dt.float64))
        return _number(value, dtype).broadcast_to((1,))
    s, e = _number(start, dtype), _number(end, dtype)
    span = _half_op("sub", e, s, dtype) if dtype in _HALF else e - s
    step = cast(span, dt.float64) / float(steps - 1)
    position = g.arange(steps)
    from_end = g.binary("ge", position, steps // 2)
    first = g.fma(step.broadcast_to((steps,)), cast(position, dt.float64),
                  cast(s, dt.float64))
    second = g.fma((-step).broadcast_to((steps,)), cast((steps - 1) - position, dt.float64),
                   cast(e, dt.float64))
    value = g.binary("pow", base.broadcast_to((steps,)), g.where(from_end, second, first))
    return _number(value, dtype)


def eye_math(g, n: int, m: int, dtype: dt.DType):
    """The ``n`` x ``m`` identity: ones where row == column."""
    diagonal = g.binary("eq", g.arange(n).reshape(n, 1), g.arange(m).reshape(1, m))
    return cast(diagonal, dtype)


def _dtype(dtype) -> dt.DType:
    import torch

    return isa(torch.get_default_dtype() if dtype is None else dtype)


def _bounds_ok(*bounds) -> None:
    if not all(is_number(b) and not isinstance(b, bool) for b in bounds):
        raise Unsupported("bounds must be real numbers")  # complex: not native


@register(aten.linspace.default)
def linspace(g, start, end, steps, *, dtype=None, layout=None, device=None,
             pin_memory=None):
    _bounds_ok(start, end)
    dtype = _dtype(dtype)
    if steps < 0 or dtype.is_bool:
        raise Unsupported("linspace: negative steps or bool")  # torch raises
    return linspace_math(g, start, end, int(steps), dtype)


@register(aten.logspace.default)
def logspace(g, start, end, steps, base=10.0, *, dtype=None, layout=None, device=None,
             pin_memory=None):
    _bounds_ok(start, end, base)
    dtype = _dtype(dtype)
    if steps < 0 or dtype.is_bool:
        raise Unsupported("logspace: negative steps or bool")  # torch raises
    return logspace_math(g, start, end, int(steps), base, dtype)


@register(aten.eye.default, aten.eye.m)
def eye(g, n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    m = n if m is None else m
    if n < 0 or m < 0:
        raise Unsupported("eye: negative size")  # torch raises
    return eye_math(g, int(n), int(m), _dtype(dtype))
