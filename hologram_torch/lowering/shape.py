"""Joining and index-based selection: ``cat``, ``index.Tensor`` (advanced indexing),
``index_select``, ``gather``, ``index_add``, ``scatter`` (``src``, ``value`` and
``reduce=`` forms) and ``scatter_add``; ``arange``.

``cat`` is one program: a kernel per non-empty input stores it (cast to the promoted
dtype) into its slice of a temporary; the output kernel writes that to the result.

Selections (``index.Tensor``, ``index_select``, ``gather``) are the ISA's ``gather``
(:meth:`hologram.frontend.graph.Graph.gather`): one kernel over the result reading each
selected element once, O(numel(out)), exact (-0.0, NaN payloads aside, come back as
they are). Scatters have no indexed store: they are one-hot, a kernel over the region's
positions times the ``K`` candidate indices compares ``index == position`` and reduces
the hits (sum, or max for bool, whose sum does not exist), O(numel(region) * K);
non-selected candidates are masked out before the sum, so NaN and inf elsewhere never
leak in. ``scatter`` with duplicate indices keeps the last write along ``dim``, as torch's
CPU kernel does.

Index *values* are not checked here (torch raises for out-of-range ones; the eager device
checks them before it launches): negative indices count from the end where torch allows
them (``index.Tensor``); beyond that a selection reads the gather's clamped element and a
scatter writes nothing. :class:`Unsupported`: index dtypes torch rejects (and boolean
masks, whose result's shape is data), a ``reduce`` other than "add"/"multiply", shapes
torch rejects.
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
)

_SELECT_INDEX = (dt.int64, dt.int32)  # torch's index dtypes for index_select/index_add
_SCATTER_INDEX = (dt.int64,)  # and for gather/scatter


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


@register(aten.index.Tensor)
def index(g, self, indices):
    """Advanced indexing, ``self[indices]``: ``indices`` holds an integer tensor or None
    (the whole dimension) per leading dimension of ``self``. The index tensors broadcast
    to one shape ``B``; where they index adjacent dimensions ``B`` replaces them in the
    result, else it comes first (NumPy's and PyTorch's rule). Negative indices count from
    the end."""
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
    return g.gather(self, tuple(coords), shape)


#: The most terms per group :func:`row_sums` adds (one gather and one addition each, in
#: one elementwise kernel over the result).
MAX_TERMS = 16


def row_sums(g, src, order, starts, counts, terms: int):
    """Sums of rows of ``src`` ([K, D]) grouped by a row index, from the index sorted:
    ``order`` ([K], int64) lists the rows of ``src`` grouped by their index value,
    ``starts[v]`` and ``counts[v]`` ([V], int64) say where group ``v`` begins in it and
    how many it holds (a count of 0 drops a group), and ``terms`` (at most
    :data:`MAX_TERMS`) bounds the counts. Result ``[V, D]`` in ``src``'s dtype:
    ``src[order[starts[v]]] + ...`` added in ``order``'s order, one addition at a time
    into +0.0, as a loop adding into zeros would (a row with no terms is +0.0).

    A scatter-add with no indexed store in the ISA: ``terms`` gathers and additions per
    result element, O(V * D * terms), each term's row found once per result row. The
    caller sorts the index (a host step: eager only) and keeps ``terms`` small (a
    frequent index makes every row pay for it)."""
    rows, (count, width) = starts.shape[0], src.shape
    if count == 0 or not 1 <= terms <= MAX_TERMS:
        raise Unsupported(f"row sums of {count} rows in groups of up to {terms}")
    starts, counts = starts.reshape(rows, 1), counts.reshape(rows, 1)
    total = 0.0
    for j in range(terms):
        at = g.gather(order, (starts + j,), (rows, 1))
        value = g.gather(src, (at, 1), (rows, width))
        total = g.where(g.binary("gt", counts, j), value + total, total)
    return total


# --- one-hot scatter ---------------------------------------------------------------------

def along(t, dim: int, shape: tuple[int, ...], extra: int | None = None):
    """View ``t`` over ``shape + (n,)``: the same element for every position along ``dim``
    (stride 0), and the last axis walking ``t`` along ``dim`` (``extra`` elements)."""
    strides = tuple(0 if d == dim else s for d, s in enumerate(t.strides))
    n = t.shape[dim] if extra is None else extra
    return t._view(shape + (n,), strides + (t.strides[dim],), t.offset)


# --- scatters ---------------------------------------------------------------------------

def _scatter(g, self, index, src, alpha, dim, mode, index_add):
    """``self`` with a region rewritten from ``src`` (a tensor, or a 0-d value).

    Scatter: the region is ``index.shape`` with ``dim`` widened to ``self``'s; candidate
    ``k`` of position ``q`` hits when ``index[q with q[dim] := k] == q[dim]`` and brings
    ``src`` at the same place. ``index_add``: the region is all of ``self``, candidate
    ``k`` hits when ``index[k] == q[dim]`` and brings ``src[q with q[dim] := k]``.
    ``mode``: "add"/"multiply" reduce the hits into ``self``; "replace" keeps the last hit
    along ``dim`` (torch's CPU order)."""
    dtype = self.dtype
    math_dtype = opmath(dtype)
    if index_add:
        region, count = self.shape, math.prod(index.shape)
        flat = index.reshape(count) if index.ndim else index.reshape(1)
        idx = flat._view(region + (count,), (0,) * len(region) + flat.strides, flat.offset)
    else:
        region = tuple(self.shape[d] if d == dim else n for d, n in enumerate(index.shape))
        count = index.shape[dim]
        idx = along(index, dim, region, count)
    rank = len(region)
    base = cast(self[tuple(slice(0, n) for n in region)], math_dtype)
    candidates = along(src, dim, region, count) if src.ndim else src._aligned(rank + 1)

    # Casts are kernels of their own: made before the kernels that read them.
    idx, candidates = cast(idx, dt.int64), cast(candidates, math_dtype)

    def kernel():
        k = g.builder.kernel(region + (count,))
        hit = k.eq(g._load(k, idx), k.index(dim, dt.int64))
        return k, hit, g._load(k, candidates)

    def reduced(k, kind, value, neutral, result_dtype):
        out = g._temp(result_dtype, region)
        k.store(out.buffer, k.reduce(kind, k.select(
            value[0], value[1], k.const(neutral, result_dtype)), rank))
        return out

    boolean = math_dtype is dt.bool_
    if mode == "replace":
        k, hit, _ = kernel()
        last = reduced(k, "max", (hit, k.index(rank, dt.int64)), -1, dt.int64)
        k, _, value = kernel()
        pick = k.eq(g._load(k, last._view(region + (1,), last.strides + (0,), 0)),
                    k.index(rank, dt.int64))
        values = reduced(k, "max" if boolean else "sum", (pick, value), False if boolean
                         else 0, math_dtype)
        updated = g.where(g.binary("ge", last, 0), values, base)
    else:
        kind, neutral, combine = {
            ("add", False): ("sum", 0, "add"), ("multiply", False): ("prod", 1, "mul"),
            ("add", True): ("max", False, "or"), ("multiply", True): ("min", True, "and"),
        }[mode, boolean]
        k, hit, value = kernel()
        total = reduced(k, kind, (hit, value), neutral, math_dtype)
        if index_add and not (not isinstance(alpha, Tensor) and alpha == 1):
            total = g.binary("and" if boolean else "mul", total, cast(alpha, math_dtype))
        updated = g.binary(combine, base, total)
    if region == self.shape:
        return cast(updated, dtype)
    # Only part of self changes: copy self, then overwrite the region (two writers keep
    # the temporary materialized).
    result = g._temp(dtype, self.shape)
    for source, target in ((self, result), (cast(updated, dtype),
                                            result[tuple(slice(0, n) for n in region)])):
        if math.prod(source.shape):
            k = g.builder.kernel(source.shape)
            k.store(target.buffer, g._load(k, source), target.offset, target.strides,
                    target.shape)
    return g.copy(result)


def scatter_into(g, self, dim, index, src, mode: str, index_add: bool = False, alpha=1):
    """The scatter family's common entry (see :func:`_scatter`): ``src`` a tensor of
    self's dtype or a number; 0-d operands as 1-element vectors; an empty index leaves
    ``self`` as it is."""
    if index.dtype not in (_SELECT_INDEX if index_add else _SCATTER_INDEX):
        raise Unsupported(f"index of {index.dtype}")  # torch raises
    if mode not in ("replace", "add", "multiply"):
        raise Unsupported(f"reduce={mode!r}")  # torch raises
    dim = _dim(self, dim)
    if math.prod(index.shape) == 0:  # nothing scattered (index may even have another rank)
        return g.copy(self)
    tensor_src = isinstance(src, Tensor) and not is_number(src)
    if tensor_src and src.dtype is not self.dtype:
        raise Unsupported("src of another dtype")  # torch raises
    if not isinstance(src, Tensor):  # a Python number: a 0-d value of self's dtype
        zero = cast(g.arange(1), self.dtype)[0]
        src = g.where(g.binary("eq", zero, zero), cast(src, self.dtype), zero)
    scalar = self.ndim == 0
    if scalar:
        self, index = self.reshape(1), index.reshape(1)
        src = src.reshape(1) if tensor_src and src.ndim == 0 else src
    r = _scatter(g, self, index, src, alpha, dim, mode, index_add)
    return r.reshape() if scalar else r


@register(aten.scatter.src, aten.scatter.value)
def scatter(g, self, dim, index, src):
    return scatter_into(g, self, dim, index, src, "replace")


@register(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce(g, self, dim, index, src, *, reduce):
    return scatter_into(g, self, dim, index, src, reduce)


@register(aten.scatter_add.default)
def scatter_add(g, self, dim, index, src):
    return scatter_into(g, self, dim, index, src, "add")


@register(aten.index_add.default)
def index_add(g, self, dim, index, source, *, alpha=1):
    if index.ndim > 1:
        raise Unsupported("index_add index of more than 1 dimension")  # torch raises
    return scatter_into(g, self, dim, index, source, "add", index_add=True, alpha=alpha)


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
