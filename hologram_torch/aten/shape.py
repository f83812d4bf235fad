"""Joining and index-based selection: ``cat`` (so ``stack``/``hstack``/``vstack``, which
torch decomposes into views and ``cat``), ``index.Tensor`` (advanced indexing:
``x[idx]``, ``x[i, :, j]``), ``index_select``, ``gather``, ``index_add``, ``scatter``
(``src``, ``value`` and ``reduce=`` forms) and ``scatter_add``, each with its ``.out``
(and in-place) overloads.

The programs are the ops' entries in :mod:`hologram_torch.lowering.shape` (the table
torch.compile lowers through too); this module validates arguments (torch's meta kernels,
index bounds), handles ``out=``/in-place forms and falls back to the CPU.

``cat`` is one program: a kernel per non-empty input stores it (cast to the promoted
dtype) into its slice of a temporary; the output kernel writes that to the result.

Selections are the ISA's ``gather``, O(numel(out)); scatters are one-hot selections, a
kernel over the region's positions times the ``K`` indices comparing ``index ==
position``, O(numel(region) * K) (see :mod:`hologram_torch.lowering.shape`).
``scatter`` with duplicate indices keeps the last write along ``dim``, as torch's CPU
kernel does.

Index values are checked before a launch (their minimum and maximum, read through a CPU
view of the device memory); an index out of range sends the call to the CPU fallback,
where PyTorch's own kernel raises its own exception and message (``IndexError: index 5
is out of bounds for dimension 0 with size 3``), so the device never launches with one.
Indexing forms the gather does not take run through the fallback too: boolean masks
(their result's shape is data), CPU index tensors, 0-d ``self``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils._pytree import tree_map

from hologram_torch import memory
from hologram_torch.aten import program
from hologram_torch.aten.linalg import infer, kernels, launch
from hologram_torch.aten.program import ISA
from hologram_torch.aten.registry import aten
from hologram_torch.aten.tensor import clone, copy_into
from hologram_torch.fallback import cpu_view, run_on_cpu
from hologram_torch.lowering import Number, lower
from hologram_torch.lowering import shape as lowering_shape

OPINFO = ("cat", "stack", "hstack", "vstack", "index_select", "gather", "index_add",
          "scatter", "scatter_add", "__getitem__")


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

def in_bounds(index: torch.Tensor, low: int, high: int) -> bool:
    """Are all of the device tensor ``index``'s values in ``[low, high)``? Read on the
    host through a CPU view of the device memory (the device's memory is host memory and
    its kernels have finished when they return): no launch, no copy."""
    if index.numel() == 0:
        return True
    least, most = torch.aminmax(memory.cpu_alias(index))
    return low <= int(least) and int(most) < high


def index_counts(index: torch.Tensor, rows: int,
                 drop: int = -1) -> tuple[np.ndarray, np.ndarray, int]:
    """The values of ``index`` (a device tensor of values in ``[-rows, rows)``, negative
    ones counted from the end) as a NumPy array, read through a CPU view, how often each
    row occurs (row ``drop`` not at all, e.g. an embedding's ``padding_idx``), and the
    largest count rounded up to a power of two (the terms per row of
    :func:`hologram_torch.lowering.shape.row_sums`, a program compiled per power)."""
    values = memory.cpu_alias(index).numpy().reshape(-1).astype(np.int64)
    values[values < 0] += rows
    counts = np.bincount(values, minlength=rows)
    if 0 <= drop < rows:
        counts[drop] = 0
    return values, counts, 1 << max(int(counts.max()) - 1, 0).bit_length()


def sorted_groups(values: np.ndarray, counts: np.ndarray) -> torch.Tensor:
    """What :func:`hologram_torch.lowering.shape.row_sums` reads, from
    :func:`index_counts`: one int64 device tensor holding ``order`` (the positions of
    ``values`` sorted by value, stably), then each row's ``starts`` and ``counts``.
    NumPy, not torch: a few µs at a thousand indices, where each small torch call costs
    several."""
    n, rows = values.size, counts.size
    groups = memory.empty((n + 2 * rows,), torch.int64, [1])
    table = memory.cpu_alias(groups).numpy()
    table[:n] = np.argsort(values, kind="stable")
    table[n + rows:] = counts
    starts = table[n:n + rows]
    np.cumsum(np.bincount(values, minlength=rows), out=starts)  # dropped rows included
    starts -= np.bincount(values, minlength=rows)
    return groups


def cpu_error(op, *args, **kwargs):
    """PyTorch's own error for arguments its kernel rejects (an index out of range): its
    CPU kernel run on CPU views of the device tensors, which raises. Not a fallback (no
    result is used, nothing is counted or warned about); should the kernel not raise, the
    call runs through the counted fallback after all."""
    op(*tree_map(lambda x: cpu_view(x) if isinstance(x, torch.Tensor) and not x.is_cpu
                 else x, args))
    return run_on_cpu(op, *args, **kwargs)


# --- selection: the lowerings of hologram_torch.lowering.shape ---------------------------

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
    if not in_bounds(index, 0, self.shape[dim]):
        return cpu_error(op, self, dim, index, **kwargs)
    return launch(op, (self, dim, index), kwargs, "shape.gather", _gather_build,
                  (self, index), (dim,), out)


def _index_select(op, self, dim, index, out=None):
    kwargs = {} if out is None else {"out": out}
    if not program.supported(self, index) or index.dtype not in _SELECT_INDEX:
        return run_on_cpu(op, self, dim, index, **kwargs)
    infer(op, self, dim, index, **kwargs)
    dim = dim % max(self.dim(), 1)
    if not in_bounds(index, 0, self.shape[dim]):
        return cpu_error(op, self, dim, index, **kwargs)
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


def _index_build(g, src, *rest):
    *tensors, present = rest
    given = iter(tensors)
    return lower(aten.index.Tensor, g, src, [next(given) if p else None for p in present])


def _index(op, self, indices, out=None):
    """``self[indices]`` (advanced indexing) as one gather, after the bounds check."""
    kwargs = {} if out is None else {"out": out}
    indices = list(indices)
    tensors = [i for i in indices if i is not None]
    if (not tensors or self.dim() == 0 or len(indices) > self.dim()
            or not program.supported(self, *tensors)
            or any(t.dtype not in _SELECT_INDEX or t.is_cpu for t in tensors)):
        return run_on_cpu(op, self, indices, **kwargs)  # masks, CPU indices: torch's kernel
    for d, i in enumerate(indices):
        n = self.shape[d]
        if i is not None and not in_bounds(i, -n, n):
            return cpu_error(op, self, indices, **kwargs)
    present = tuple(i is not None for i in indices)
    return launch(op, (self, indices), kwargs, "shape.index", _index_build, (self, *tensors),
                  (present,), out)


kernels("index.Tensor", _index)


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
        if not in_bounds(index, 0, self.shape[dim]):
            return cpu_error(op, *args, **kwargs)
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
