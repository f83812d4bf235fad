"""Joining and index-based selection: ``cat`` (so ``stack``/``hstack``/``vstack``, which
torch decomposes into views and ``cat``), ``index_select``, ``gather``, ``index_add``,
``scatter`` (``src``, ``value`` and ``reduce=`` forms) and ``scatter_add``, each with its
``.out`` (and in-place) overloads.

``cat`` is one program: a kernel per non-empty input stores it (cast to the promoted
dtype) into its slice of a temporary; the output kernel writes that to the result.

The Atlas IR has no gather or indexed load, so index-based ops are written as one-hot
selections (as ``hologram.functional.cross_entropy`` picks class log-probabilities): the
kernel runs over the output positions times the candidate positions ``n`` along ``dim``,
compares ``index == n`` and reduces the selected values (sum, or max for bool, whose
sum does not exist). That costs O(numel(out) * size) for a selection along a dimension
of ``size`` (``gather``/``index_select``), and O(numel(region) * K) for a scatter of
``K`` indices along ``dim`` into a region of ``self``. Because non-selected candidates
are masked out before the sum, NaN and inf elsewhere never leak in; a selected -0.0
comes back as +0.0 (the sum starts from +0.0).

``scatter`` with duplicate indices keeps the last write along ``dim``, as torch's CPU
kernel does. Indices are validated first (their min and max, computed on the device),
so out-of-range indices raise torch's exception type and message.
"""

from __future__ import annotations

import math

import torch

from hologram.isa import dtypes as dt
from hologram_torch.aten import program
from hologram_torch.aten.linalg import infer, kernels, launch
from hologram_torch.aten.program import ISA, cast
from hologram_torch.aten.tensor import clone, copy_into
from hologram_torch.fallback import run_on_cpu

OPINFO = ("cat", "stack", "hstack", "vstack", "index_select", "gather", "index_add",
          "scatter", "scatter_add")


# --- cat --------------------------------------------------------------------------------

def _cat_build(g, *args):
    *xs, dim, shape, dtype = args
    joined = g._temp(dtype, shape)
    start = 0
    for x in xs:
        if x.shape == (0,) and len(shape) != 1:  # torch's legacy: 1-D empties are skipped
            continue
        n = x.shape[dim]
        if math.prod(x.shape):
            part = joined[(slice(None),) * dim + (slice(start, start + n),)]
            k = g.builder.kernel(x.shape)
            value = g._load(k, x)
            value = value if x.dtype is dtype else k.cast(value, dtype)
            k.store(part.buffer, value, part.offset, part.strides, part.shape)
        start += n
    return g.copy(joined)


def _cat(op, tensors, dim=0, out=None):
    kwargs = {} if out is None else {"out": out}
    tensors = list(tensors)
    if not program.supported(*tensors):
        return run_on_cpu(op, tensors, dim, **kwargs)
    meta = infer(op, tensors, dim, **({} if out is None else {"out": out}))
    dim = dim % max(meta.dim(), 1)
    return launch(op, (tensors, dim), kwargs, "shape.cat", _cat_build, tuple(tensors),
                  (dim, tuple(meta.shape), ISA[meta.dtype if out is None else out.dtype]), out)


kernels("cat", _cat)


# --- index validation -------------------------------------------------------------------

def _bounds_build(g, index):
    index = cast(index, dt.int64)
    return g.reduce("min", index), g.reduce("max", index)


def _check(index: torch.Tensor, size: int, dim: int, what: str) -> None:
    """Raise torch's error if an entry of ``index`` is outside ``[0, size)``."""
    if index.numel() == 0:
        return
    low, high = (t.cpu().item() for t in program.run("shape.bounds", _bounds_build, (index,)))
    if low < 0 or high >= size:
        if what == "select":
            raise IndexError("index out of range in self")
        bad = low if low < 0 else high
        raise RuntimeError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


# --- one-hot selection ------------------------------------------------------------------

def _along(t, dim: int, shape: tuple[int, ...], extra: int | None = None):
    """View ``t`` over ``shape + (n,)``: the same element for every position along ``dim``
    (stride 0), and the last axis walking ``t`` along ``dim`` (``extra`` elements)."""
    strides = tuple(0 if d == dim else s for d, s in enumerate(t.strides))
    n = t.shape[dim] if extra is None else extra
    return t._view(shape + (n,), strides + (t.strides[dim],), t.offset)


def _pick(g, src, index, dtype):
    """Kernel over ``src.shape`` (last axis: candidates): where ``index == position along
    the last axis`` keep ``src``, reduce over the candidates. ``index`` is broadcast over
    the last axis. Returns the reduced tensor, shape ``src.shape[:-1]``."""
    shape = src.shape
    index = cast(index, dt.int64)  # a kernel of its own: before the one that reads it
    k = g.builder.kernel(shape)
    value = g._load(k, src)
    hit = k.eq(g._load(k, index), k.index(len(shape) - 1, dt.int64))
    if dtype is dt.bool_:
        value = k.reduce("max", k.select(hit, value, k.const(False, dt.bool_)), len(shape) - 1)
    else:
        value = k.reduce("sum", k.select(hit, value, k.const(0, dtype)), len(shape) - 1)
    out = g._temp(dtype, shape[:-1])
    k.store(out.buffer, value)
    return out


def _gather_build(g, src, index, dim):
    shape = index.shape
    view = _along(src, dim, shape)
    return _pick(g, view, index._view(shape + (1,), index.strides + (0,), index.offset),
                 src.dtype)


def _index_select_build(g, src, index, dim):
    k = math.prod(index.shape)
    shape = src.shape[:dim] + (k,) + src.shape[dim + 1:]
    flat = index.reshape(k) if index.ndim else index.reshape(1)
    idx = flat._view(shape + (1,), tuple(flat.strides[0] if d == dim else 0
                                         for d in range(len(shape))) + (0,), flat.offset)
    return _pick(g, _along(src, dim, shape), idx, src.dtype)


# torch's index dtypes per op; anything else goes to torch's kernel, which raises.
_SELECT_INDEX = (torch.int64, torch.int32)
_SCATTER_INDEX = (torch.int64,)


def _gather(op, self, dim, index, *, sparse_grad=False, out=None):
    kwargs = {"sparse_grad": sparse_grad, **({} if out is None else {"out": out})}
    if not program.supported(self, index) or index.dtype not in _SCATTER_INDEX:
        return run_on_cpu(op, self, dim, index, **kwargs)
    infer(op, self, dim, index, **kwargs)
    dim = dim % max(self.dim(), 1)
    _check(index, self.shape[dim], dim, "gather")
    return launch(op, (self, dim, index), kwargs, "shape.gather", _gather_build,
                  (self, index), (dim,), out)


def _index_select(op, self, dim, index, out=None):
    kwargs = {} if out is None else {"out": out}
    if not program.supported(self, index) or index.dtype not in _SELECT_INDEX:
        return run_on_cpu(op, self, dim, index, **kwargs)
    infer(op, self, dim, index, **kwargs)
    dim = dim % max(self.dim(), 1)
    _check(index, self.shape[dim], dim, "select")
    return launch(op, (self, dim, index), kwargs, "shape.index_select", _index_select_build,
                  (self, index), (dim,), out)


def _scalars_as_vectors(fn):
    """Run ``fn`` on 0-d ``self`` (torch allows ``dim`` 0 or -1 there) as on 1-element
    vectors: 0-d tensor arguments become shape (1,), the result gets torch's shape."""

    def kernel(op, self, dim, index, *rest, out=None, **kwargs):
        if self.dim() != 0 or out is not None:
            return fn(op, self, dim, index, *rest, out=out, **kwargs)
        meta = infer(op, self, dim, index, *rest, **kwargs)
        rest = [x.reshape(1) if isinstance(x, torch.Tensor) and x.dim() == 0 and not x.is_cpu
                else x for x in rest]
        return fn(op, self.reshape(1), dim, index.reshape(-1), *rest, **kwargs).reshape(
            meta.shape)

    return kernel


kernels("gather", _scalars_as_vectors(_gather))
kernels("index_select", _scalars_as_vectors(_index_select))


# --- scatters ---------------------------------------------------------------------------

def _scatter_build(g, self, index, src, alpha, dim, mode, dtype, index_add):
    """``self`` with a region rewritten from ``src`` (a tensor, or a 0-d value).

    Scatter: the region is ``index.shape`` with ``dim`` widened to ``self``'s; candidate
    ``k`` of position ``q`` hits when ``index[q with q[dim] := k] == q[dim]`` and brings
    ``src`` at the same place. ``index_add``: the region is all of ``self``, candidate
    ``k`` hits when ``index[k] == q[dim]`` and brings ``src[q with q[dim] := k]``.
    ``mode``: "add"/"multiply" reduce the hits into ``self``; "replace" keeps the last hit
    along ``dim`` (torch's CPU order)."""
    math_dtype = program.opmath(dtype)
    if index_add:
        region, count = self.shape, math.prod(index.shape)
        flat = index.reshape(count) if index.ndim else index.reshape(1)
        idx = flat._view(region + (count,), (0,) * len(region) + flat.strides, flat.offset)
    else:
        region = tuple(self.shape[d] if d == dim else n for d, n in enumerate(index.shape))
        count = index.shape[dim]
        idx = _along(index, dim, region, count)
    rank = len(region)
    base = cast(self[tuple(slice(0, n) for n in region)], math_dtype)
    candidates = _along(src, dim, region, count) if src.ndim else src._aligned(rank + 1)

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
        if index_add:
            total = g.binary("and" if boolean else "mul", total, cast(alpha, math_dtype))
        updated = g.binary(combine, base, total)
    if region == self.shape:
        return updated
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


def _scatter(mode: str, index_add: bool = False):
    """A kernel of the scatter family. ``mode``: "add", "replace", or "reduce" (taken
    from the ``reduce=`` argument: "add" or "multiply")."""

    def kernel(op, self, dim, index, src, *, alpha=1, reduce=None, out=None):
        args = (self, dim, index, src)
        kwargs = {k: v for k, v in (("alpha", alpha if index_add else None),
                                    ("reduce", reduce), ("out", out)) if v is not None}
        how = mode if mode != "reduce" else {"add": "add", "multiply": "multiply"}.get(reduce)
        tensors = (self, index) + ((src,) if isinstance(src, torch.Tensor) else ())
        if (not program.supported(*tensors) or how is None or index.dtype not in (
                _SELECT_INDEX if index_add else _SCATTER_INDEX)
                or isinstance(alpha, complex) or isinstance(src, complex)):
            return run_on_cpu(op, *args, **kwargs)
        infer(op, *args, **kwargs)
        if index.numel() == 0:  # nothing scattered (index may even have another rank)
            if out is None:
                return clone(self)
            if out.shape != self.shape:
                out.resize_(self.shape)
            return copy_into(out, self)
        dim = dim % self.dim()
        _check(index, self.shape[dim], dim, "select" if index_add else "scatter")
        if isinstance(src, torch.Tensor) and src.is_cpu:  # a wrapped number
            src = src.item()
        if not isinstance(src, torch.Tensor) and self.dtype is torch.bool:
            src = bool(src)
        static = (dim, how, ISA[self.dtype], index_add)
        return launch(op, args, kwargs, "shape.scatter", _scatter_build,
                      (self, index, src, alpha), static, out)

    return kernel


for _name, _mode in (("scatter.src", "replace"), ("scatter.value", "replace"),
                     ("scatter.reduce", "reduce"), ("scatter.value_reduce", "reduce"),
                     ("scatter_add", "add"), ("index_add", "add")):
    kernels(_name, _scalars_as_vectors(_scatter(_mode, index_add=_name == "index_add")))

__all__ = ["OPINFO"]
