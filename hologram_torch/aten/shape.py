"""Joining and index-based selection: ``cat`` (so ``stack``/``hstack``/``vstack``, which
torch decomposes into views and ``cat``), ``index_select``, ``gather``, ``index_add``,
``scatter`` (``src``, ``value`` and ``reduce=`` forms) and ``scatter_add``, each with its
``.out`` (and in-place) overloads.

The programs are the ops' entries in :mod:`hologram_torch.lowering.shape` (the table
torch.compile lowers through too); this module validates arguments (torch's meta kernels,
index bounds), handles ``out=``/in-place forms and falls back to the CPU.

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

import torch

from hologram.isa import dtypes as dt
from hologram_torch.aten import program
from hologram_torch.aten.linalg import infer, kernels, launch
from hologram_torch.aten.program import ISA, cast
from hologram_torch.aten.registry import aten
from hologram_torch.aten.tensor import clone, copy_into
from hologram_torch.fallback import run_on_cpu
from hologram_torch.lowering import Number, lower
from hologram_torch.lowering import shape as lowering_shape

OPINFO = ("cat", "stack", "hstack", "vstack", "index_select", "gather", "index_add",
          "scatter", "scatter_add")


# --- cat --------------------------------------------------------------------------------

def _cat_build(g, *args):
    *xs, dim, _shape, _dtype = args  # shape and dtype: part of the kernel's key
    return lower(aten.cat.default, g, xs, dim)


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


# --- one-hot selection: the lowerings of hologram_torch.lowering.shape -------------------

def _gather_build(g, src, index, dim):
    return lower(aten.gather.default, g, src, dim, index)


def _index_select_build(g, src, index, dim):
    return lower(aten.index_select.default, g, src, dim, index)


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
    """The scatter family (:func:`hologram_torch.lowering.shape.scatter_into`): ``src``
    0-d is a number (a wrapped or Python one); ``alpha`` is index_add's."""
    src = Number.of(src) if src.ndim == 0 else src
    return lowering_shape.scatter_into(g, self, dim, index, src, mode, index_add,
                                       Number.of(alpha) if index_add else 1)


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
