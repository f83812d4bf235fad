"""Joining and index-based selection and writes: ``cat``, ``index.Tensor`` (advanced
indexing), ``index_select``, ``gather``; ``index_put``, ``scatter`` (``src``, ``value``
and ``reduce=`` forms), ``scatter_add``, ``scatter_reduce`` (``.two``), ``index_add``,
``index_copy``, ``index_fill``; ``slice_scatter``, ``select_scatter`` and their
gradients ``slice_backward``, ``select_backward``; ``arange``.

``cat`` is one program: a kernel per non-empty input stores it (cast to the promoted
dtype) into its slice of a temporary; the output kernel writes that to the result.

Selections (``index.Tensor``, ``index_select``, ``gather``) are the ISA's ``gather``
(:meth:`hologram.frontend.graph.Graph.gather`): one kernel over the result reading each
selected element once, O(numel(out)), exact (-0.0, NaN payloads aside, come back as
they are). Writes by index are the ISA's ``scatter``
(:meth:`hologram.frontend.graph.Graph.scatter`): ``self`` copied, then one kernel over
the index writing each element once, O(numel(self) + numel(index)), in index order:
duplicates keep the last write (``scatter``, ``index_put``, ``index_copy``; torch's CPU
kernels do so along ``dim``), reductions (``scatter_add``, ``index_add``, ``index_put``
with ``accumulate``, ``scatter_reduce``) combine in order, as torch's CPU kernels loop:
in self's dtype, except that float16 and bfloat16 accumulate in float32, rounded once at
the end, in the scatter family and ``index_add`` of slices (``index_put``'s accumulation
and ``index_add`` of a vector round after every step, as their CPU kernels do).

Index *values* are not checked here (torch raises for out-of-range ones; the eager device
checks them before it launches): negative indices count from the end where torch allows
them (``index.Tensor``, ``index_put``, ``index_fill``); beyond that a selection reads the
gather's clamped element and a write goes to the scatter's clamped element.
:class:`Unsupported`: index dtypes torch rejects (and boolean masks, whose positions are
data: the eager device turns them into indices first), shapes torch rejects.
"""

from __future__ import annotations

import math

import torch

from hologram.errors import ShapeError
from hologram.frontend.graph import broadcast_shapes
from hologram.isa import dtypes as dt
from hologram_torch.lowering.common import (
    Tensor,
    Unsupported,
    aten,
    cast,
    is_number,
    isa,
    opmath,
    register,
    result_type,
    zeros,
)
from hologram_torch.lowering.views import slice_bounds

_SELECT_INDEX = (dt.int64, dt.int32)  # torch's index dtypes for index_select/index_add
_SCATTER_INDEX = (dt.int64,)  # and for gather, index_copy, index_fill (scatters: both)


def _dim(x, dim: int) -> int:
    rank = max(x.ndim, 1)
    if not -rank <= dim < rank:
        raise Unsupported(f"dim {dim} out of range")  # torch raises
    return dim % rank


# --- cat --------------------------------------------------------------------------------

@register(aten.cat.default)
def cat(g, tensors, dim=0):
    """The tensors joined along ``dim``, in their promoted dtype (1-D empty tensors are
    skipped, torch's legacy rule)."""
    tensors = list(tensors)
    if not tensors:
        raise Unsupported("cat of no tensors")  # torch raises
    dtype = isa(result_type(*tensors))
    parts = [x for x in tensors if x.shape != (0,)]
    ref = parts[0] if parts else tensors[0]
    if ref.ndim == 0:
        raise Unsupported("cat of 0-d tensors")  # torch raises
    dim = _dim(ref, dim)
    for x in parts:
        if x.ndim != ref.ndim or any(n != m for d, (n, m) in enumerate(zip(x.shape, ref.shape))
                                     if d != dim):
            raise Unsupported("cat of tensors whose shapes differ off dim")  # torch raises
    shape = list(ref.shape)
    shape[dim] = sum(x.shape[dim] for x in parts)
    shape = tuple(shape)
    joined = g._temp(dtype, shape)
    start = 0
    for x in parts:
        n = x.shape[dim]
        if math.prod(x.shape):
            part = joined[(slice(None),) * dim + (slice(start, start + n),)]
            k = g.builder.kernel(x.shape)
            value = g._load(k, x)
            value = value if x.dtype is dtype else k.cast(value, dtype)
            k.store(part.buffer, value, part.offset, part.strides, part.shape)
        start += n
    return g.copy(joined)


# --- writes into a slice (the autograd of slicing) ----------------------------------

@register(aten.slice_scatter.default)
def slice_scatter(g, self, src, dim=0, start=None, end=None, step=1):
    """``self`` with ``self[..., start:end:step, ...]`` (along ``dim``) replaced by ``src``,
    cast to ``self``'s dtype. A unit step (or a single position) is a ``cat`` of
    ``self``'s two sides and ``src``, elementwise and so fused with its neighbours; a
    longer step is the ISA's scatter at the computed positions."""
    if step <= 0 or self.ndim == 0:
        raise Unsupported("slice_scatter of a 0-d tensor or with a step below 1")  # torch
    d = _dim(self, dim)
    n = self.shape[d]
    start, end = slice_bounds(n, start, end)
    count = len(range(start, end, step))
    if src.shape != self.shape[:d] + (count,) + self.shape[d + 1:]:
        raise Unsupported("slice_scatter: src is not the slice's shape")  # torch raises
    if src.dtype is not self.dtype:
        src = cast(src, self.dtype)
    if count == 0:
        return g.copy(self)
    if step == 1 or count == 1:
        lead = (slice(None),) * d
        return cat(g, [self[lead + (slice(0, start),)], src,
                       self[lead + (slice(start + count, n),)]], d)
    at = g.binary("add", g.binary("mul", g.arange(count), step), start)
    at = at.reshape(count, *(1,) * (self.ndim - d - 1))
    coords = tuple(at if a == d else a for a in range(self.ndim))
    return g.scatter(self, coords, src, src.shape)


@register(aten.select_scatter.default)
def select_scatter(g, self, src, dim, index):
    """``self`` with ``self.select(dim, index)`` replaced by ``src``."""
    d = _dim(self, dim)
    n = self.shape[d]
    if not -n <= index < n or src.shape != self.shape[:d] + self.shape[d + 1:]:
        raise Unsupported("select_scatter: index out of range or src of another shape")
    index %= n
    src = src._view(src.shape[:d] + (1,) + src.shape[d:],
                    src.strides[:d] + (0,) + src.strides[d:], src.offset)
    return slice_scatter(g, self, src, d, index, index + 1)


@register(aten.slice_backward.default)
def slice_backward(g, grad_output, input_sizes, dim, start, end, step):
    """The gradient of ``slice``: ``grad_output`` in its place among zeros."""
    return slice_scatter(g, zeros(g, grad_output.dtype, input_sizes), grad_output, dim,
                         start, end, step)


@register(aten.select_backward.default)
def select_backward(g, grad_output, input_sizes, dim, index):
    """The gradient of ``select``: ``grad_output`` in its place among zeros."""
    return select_scatter(g, zeros(g, grad_output.dtype, input_sizes), grad_output, dim,
                          index)


# --- selection (the ISA's gather) ------------------------------------------------------

def _vectors(self, index):
    """0-d ``self``/``index`` as 1-element vectors (torch allows dim 0 or -1 there)."""
    return (self.reshape(1) if self.ndim == 0 else self,
            index.reshape(1) if index.ndim == 0 else index)


@register(aten.gather.default)
def gather(g, self, dim, index, *, sparse_grad=False):
    """``out[i] = self[i with i[dim] := index[i]]``."""
    if index.dtype not in _SCATTER_INDEX:
        raise Unsupported(f"gather index of {index.dtype}")  # torch raises
    dim = _dim(self, dim)
    src, idx = _vectors(self, index)
    if idx.ndim != src.ndim or any(n > m for d, (n, m) in enumerate(zip(idx.shape, src.shape))
                                   if d != dim):
        raise Unsupported("gather index of another rank or larger")  # torch raises
    coords = tuple(idx if d == dim else d for d in range(src.ndim))
    r = g.gather(src, coords, idx.shape)
    return r.reshape(*index.shape) if index.ndim == 0 else r


@register(aten.index_select.default)
def index_select(g, self, dim, index):
    """``self`` at ``index`` (a vector or a 0-d tensor) along ``dim``."""
    if index.dtype not in _SELECT_INDEX or index.ndim > 1:
        raise Unsupported("index_select index")  # torch raises
    dim = _dim(self, dim)
    src = self.reshape(1) if self.ndim == 0 else self
    k = math.prod(index.shape)
    shape = src.shape[:dim] + (k,) + src.shape[dim + 1:]
    flat = index.reshape(k) if index.ndim else index.reshape(1)
    idx = flat._view(tuple(k if d == dim else 1 for d in range(len(shape))),
                     tuple(flat.strides[0] if d == dim else 0 for d in range(len(shape))),
                     flat.offset)
    r = g.gather(src, tuple(idx if d == dim else d for d in range(src.ndim)), shape)
    return r.reshape() if self.ndim == 0 else r


def _advanced(self, indices):
    """The positions of advanced indexing, ``self[indices]``: ``(shape, coords)``, the
    result's shape and one coordinate per dimension of ``self`` as
    :meth:`~hologram.frontend.graph.Graph.gather` and ``scatter`` take them. ``indices``
    holds an integer tensor or None (the whole dimension) per leading dimension. The index
    tensors broadcast to one shape ``B``; where they index adjacent dimensions ``B``
    replaces them in the result, else it comes first (NumPy's and PyTorch's rule)."""
    indices = list(indices)
    if len(indices) > max(self.ndim, 1) or not any(i is not None for i in indices):
        raise Unsupported("index: more indices than dimensions, or none")  # torch raises
    for i in indices:
        if i is not None and i.dtype not in _SELECT_INDEX:
            raise Unsupported(f"index of {i.dtype} (a mask's result shape is data)")
    if self.ndim == 0:  # x[i] of a 0-d x: torch treats it as a 1-element vector
        raise Unsupported("index of a 0-d tensor")
    indices += [None] * (self.ndim - len(indices))
    dims = [d for d, i in enumerate(indices) if i is not None]
    tensors = [indices[d] for d in dims]
    try:
        batch = broadcast_shapes([t.shape for t in tensors])
    except ShapeError:
        raise Unsupported("index tensors that do not broadcast") from None  # torch raises
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    kept = [d for d in range(self.ndim) if indices[d] is None]
    before = [d for d in kept if d < dims[0]] if adjacent else []
    after = [d for d in kept if d not in before]
    shape = (tuple(self.shape[d] for d in before) + batch
             + tuple(self.shape[d] for d in after))
    lead, trail = len(before), len(after)
    coords = []
    for d in range(self.ndim):
        if indices[d] is None:
            coords.append(before.index(d) if d in before else lead + len(batch)
                          + after.index(d))
        else:
            t = indices[d]._aligned(len(batch))
            coords.append(t._view((1,) * lead + t.shape + (1,) * trail,
                                  (0,) * lead + t.strides + (0,) * trail, t.offset))
    return shape, tuple(coords)


@register(aten.index.Tensor)
def index(g, self, indices):
    """Advanced indexing, ``self[indices]`` (:func:`_advanced`): one gather. Negative
    indices count from the end."""
    shape, coords = _advanced(self, indices)
    return g.gather(self, coords, shape)


# --- scatters: the ISA's scatter ---------------------------------------------------------

#: torch's reduction names -> the ISA's scatter modes.
_MODES = {"replace": "replace", "add": "add", "sum": "add", "multiply": "mul", "prod": "mul",
          "amax": "max", "amin": "min"}


def _mode(reduce: str, dtype: dt.DType) -> str:
    """The ISA's scatter mode for a torch reduction on ``dtype``: on bool, torch's ``+=``
    is or (the ISA's max) and ``*=`` is and (min)."""
    mode = _MODES[reduce]
    if dtype.is_bool and mode in ("add", "mul"):
        return "max" if mode == "add" else "min"
    return mode


def _slices(index, dim: int, region: tuple[int, ...]):
    """A 1-d (or 0-d) ``index`` viewed over ``region`` walking ``dim`` (the index of
    ``index_add``, ``index_copy``, ``index_fill``: slice ``i`` of the source goes to slice
    ``index[i]`` of self)."""
    count = math.prod(index.shape)
    flat = index.reshape(count) if index.ndim else index.reshape(1)
    return flat._view(tuple(count if d == dim else 1 for d in range(len(region))),
                      tuple(flat.strides[0] if d == dim else 0 for d in range(len(region))),
                      flat.offset)


def _values(self, src, region: tuple[int, ...]):
    """What a scatter writes: ``src``'s leading ``region`` block (a tensor of self's dtype)
    or a number (a Python one, or a runtime :class:`Number`) in self's dtype."""
    if isinstance(src, Tensor) and not is_number(src):
        if src.dtype is not self.dtype:
            raise Unsupported("src of another dtype")  # torch raises
        if src.ndim == 0:  # index_fill's value tensor: one value for every point
            return src
        if src.ndim != len(region):
            raise Unsupported("src of another rank")  # torch raises
        return src[tuple(slice(0, n) for n in region)]
    return cast(src, self.dtype)


def scatter_into(g, self, dim, index, src, mode: str, slices: bool = False, alpha=1,
                 stepwise: bool = False):
    """The scatter family, one ISA ``scatter`` (:meth:`hologram.frontend.graph.Graph
    .scatter`): ``self`` copied, then written at ``index`` in index order, O(numel(self)
    + numel(index)).

    ``slices`` False (``scatter``, ``scatter_add``, ``scatter_reduce``): point ``q`` of
    ``index`` writes ``src[q]`` to ``self[q with q[dim] := index[q]]``. True
    (``index_add``, ``index_copy``, ``index_fill``): slice ``i`` of ``src`` along
    ``dim`` goes to slice ``index[i]`` of ``self`` (``alpha`` scales it, ``index_add``'s).
    ``src``: a tensor of self's dtype or a number. ``mode``: "replace" (the last write
    wins, torch's CPU order), or a reduction ("add"/"sum", "multiply"/"prod", "amax",
    "amin"), each write made in index order in self's dtype, float16 and bfloat16 in
    float32 rounded once at the end (as torch's CPU kernels of this family compute them),
    or with ``stepwise`` rounded at every write (``index_add`` of a vector: that CPU
    kernel's scalar loop). 0-d operands are 1-element vectors; an empty index leaves
    ``self`` as it is."""
    if mode not in _MODES:
        raise Unsupported(f"reduce={mode!r}")  # torch raises
    dim = _dim(self, dim)
    if math.prod(index.shape) == 0:  # nothing scattered (index may even have another rank)
        return g.copy(self)
    scalar = self.ndim == 0
    if scalar:
        self, index = self.reshape(1), index.reshape(1)
        if isinstance(src, Tensor) and not is_number(src) and src.ndim == 0:
            src = src.reshape(1)
    if slices:
        if index.ndim > 1:
            raise Unsupported("an index of more than 1 dimension")  # torch raises
        region = tuple(math.prod(index.shape) if d == dim else n
                       for d, n in enumerate(self.shape))
        coords = tuple(_slices(index, dim, region) if d == dim else d
                       for d in range(self.ndim))
    else:
        if index.ndim != self.ndim:
            raise Unsupported("an index of another rank")  # torch raises
        region = tuple(index.shape)
        coords = tuple(index if d == dim else d for d in range(self.ndim))
    values = _values(self, src, region)
    if not (not isinstance(alpha, Tensor) and alpha == 1):  # index_add's alpha
        if self.dtype.is_bool:
            values = g.binary("and", values, cast(alpha, dt.bool_))
        else:
            acc = opmath(self.dtype)
            # (stepwise, the CPU's scalar loop scales by alpha in self's dtype)
            scale = cast(cast(alpha, self.dtype), acc) if stepwise else cast(alpha, acc)
            values = cast(cast(values, acc) * scale, self.dtype)
    how = _mode(mode, self.dtype)
    acc = opmath(self.dtype)
    if how != "replace" and acc is not self.dtype and not stepwise:
        # torch's CPU kernels of this family accumulate half types in float32 and round
        # once at the end (index_put's accumulation, below, rounds every step instead)
        r = cast(g.scatter(cast(self, acc), coords, cast(values, acc), region, how),
                 self.dtype)
    else:
        r = g.scatter(self, coords, values, region, how)
    return r.reshape() if scalar else r


@register(aten.scatter.src, aten.scatter.value)
def scatter(g, self, dim, index, src):
    if index.dtype not in _SELECT_INDEX:
        raise Unsupported(f"index of {index.dtype}")  # torch raises
    return scatter_into(g, self, dim, index, src, "replace")


@register(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce(g, self, dim, index, src, *, reduce):
    if index.dtype not in _SELECT_INDEX or reduce not in ("add", "multiply"):
        raise Unsupported(f"scatter reduce={reduce!r}, index of {index.dtype}")  # torch raises
    return scatter_into(g, self, dim, index, src, reduce)


@register(aten.scatter_add.default)
def scatter_add(g, self, dim, index, src):
    if index.dtype not in _SELECT_INDEX:
        raise Unsupported(f"index of {index.dtype}")  # torch raises
    return scatter_into(g, self, dim, index, src, "add")


#: What ``scatter_reduce(include_self=False)`` first writes where ``src`` will go
#: (torch's CPU kernel does the same), per reduction: its identity.
def _identity(reduce: str, t: dt.DType):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    largest = reduce == "amin"
    if t.is_bool:
        return largest
    if t.is_float:
        return math.inf if largest else -math.inf
    return t.max if largest else t.min


@register(aten.scatter_reduce.two)
def scatter_reduce_two(g, self, dim, index, src, reduce, *, include_self=True):
    """``scatter_reduce``: "sum", "prod", "amax", "amin" are one scatter of that mode (with
    ``include_self=False`` the reached elements are first set to the reduction's
    identity); "mean" is the sum over the count of values each element got (itself
    included), floor-divided for integers, as torch's CPU kernel computes it."""
    if (index.dtype not in _SELECT_INDEX or reduce not in ("sum", "prod", "mean", "amax",
                                                           "amin")
            or not isinstance(src, Tensor) or is_number(src)
            or (reduce == "mean" and self.dtype.is_bool)):
        raise Unsupported(f"scatter_reduce {reduce!r}")  # torch raises (bool mean: its own)
    if math.prod(index.shape) == 0:
        return g.copy(self)
    base = self
    if not include_self:
        base = scatter_into(g, self, dim, index, _identity(reduce, self.dtype), "replace")
    if reduce != "mean":
        return scatter_into(g, base, dim, index, src, reduce)
    total = scatter_into(g, base, dim, index, src, "sum")
    zero = zeros(g, self.dtype, self.shape)
    count = scatter_into(g, cast(zero, self.dtype) + (1 if include_self else 0), dim, index,
                         1, "sum")
    count = g.where(g.binary("eq", count, 0), cast(1, self.dtype), count)
    if self.dtype.is_float:
        acc = opmath(self.dtype)
        return cast(cast(total, acc) / cast(count, acc), self.dtype)
    quotient = g.binary("div", total, count)  # truncated; floor it (count > 0)
    if self.dtype.kind == "u":
        return quotient
    inexact = g.binary("and", g.binary("ne", g.binary("mod", total, count), 0),
                       g.binary("lt", total, 0))
    return g.where(inexact, quotient - 1, quotient)


@register(aten.index_add.default)
def index_add(g, self, dim, index, source, *, alpha=1):
    if index.dtype not in _SELECT_INDEX:
        raise Unsupported(f"index of {index.dtype}")  # torch raises
    # (the CPU kernel adds a vector's elements one by one in its dtype, rounding each
    # sum; slices of a larger tensor it adds in float32, rounded once)
    return scatter_into(g, self, dim, index, source, "add", slices=True, alpha=alpha,
                        stepwise=self.ndim <= 1)


@register(aten.index_copy.default)
def index_copy(g, self, dim, index, source):
    """``self`` with slice ``index[i]`` along ``dim`` replaced by ``source``'s slice
    ``i`` (duplicates: the last wins)."""
    if index.dtype not in _SCATTER_INDEX:
        raise Unsupported(f"index of {index.dtype}")  # torch raises
    return scatter_into(g, self, dim, index, source, "replace", slices=True)


@register(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(g, self, dim, index, value):
    """``self`` with the slices ``index`` (negative ones counted from the end) along
    ``dim`` set to ``value``."""
    if index.dtype not in _SCATTER_INDEX:
        raise Unsupported(f"index of {index.dtype}")  # torch raises
    if isinstance(value, Tensor) and not is_number(value):
        if value.ndim:
            raise Unsupported("index_fill value with dimensions")  # torch raises
        value = cast(value, self.dtype)
    return scatter_into(g, self, dim, index, value, "replace", slices=True)


@register(aten.index_put.default, aten._index_put_impl.default)
def index_put(g, self, indices, values, accumulate=False, unsafe=False):
    """``self[indices] = values`` (``+=`` with ``accumulate``): the positions of advanced
    indexing (:func:`index`), ``values`` broadcast to them, written in index order (the
    last duplicate wins; accumulated ones add in order, in self's dtype)."""
    shape, coords = _advanced(self, indices)
    if isinstance(values, Tensor) and not is_number(values):
        if values.dtype is not self.dtype:
            raise Unsupported("values of another dtype")  # torch raises
        try:
            if broadcast_shapes([values.shape, shape]) != shape:
                raise ShapeError("")
        except ShapeError:
            raise Unsupported("values that do not broadcast to the indexed shape") from None
    else:
        values = cast(values, self.dtype)
    return g.scatter(self, coords, values, shape, _mode("add" if accumulate else "replace",
                                                        self.dtype))


# --- creation ---------------------------------------------------------------------------

def arange_math(g, start, step, n: int, compute):
    """``start + i * step`` for i < n in ``compute`` (float64 or int64, as torch's CPU
    kernel computes), the eager device's ``arange`` too."""
    return cast(start, compute) + cast(g.arange(n), compute) * cast(step, compute)


@register(aten.arange.default, aten.arange.start, aten.arange.start_step)
def arange(g, *bounds, dtype=None, layout=None, device=None, pin_memory=None):
    """``arange(end)``, ``arange(start, end)``, ``arange(start, end, step)``: Python
    numbers (the length is torch's, from its meta kernel)."""
    if not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds):
        raise Unsupported("arange bounds must be Python numbers")
    start, end, step = (0, bounds[0], 1) if len(bounds) == 1 else (*bounds, 1)[:3]
    if dtype is None:
        floating = any(isinstance(b, float) for b in bounds)
        dtype = torch.get_default_dtype() if floating else torch.int64
    result = isa(dtype)
    if result.is_bool:
        raise Unsupported("a bool arange")
    n = torch.arange(start, end, step, dtype=dtype, device="meta").numel()
    compute = dt.float64 if result.is_float else dt.int64
    return cast(arange_math(g, start, step, n, compute), result)
