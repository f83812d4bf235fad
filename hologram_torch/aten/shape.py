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
Boolean and byte masks become long indices first (their nonzero positions, read on the
host: the result's shape is data), with PyTorch's deprecation warning for byte masks.
Indexing forms the gather does not take run through the fallback: CPU index tensors, 0-d
``self``.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

from hologram_torch import memory
from hologram_torch.aten import layout, runner
from hologram_torch.aten.linalg import _shares_memory, infer, kernels, launch
from hologram_torch.aten.registry import aten, composed, impl, overload
from hologram_torch.aten.runner import ISA
from hologram_torch.aten.tensor import clone, copy_into
from hologram_torch.fallback import cpu_view, run_on_cpu
from hologram_torch.lowering import Number, Unsupported, lower
from hologram_torch.lowering import shape as lowering_shape
from hologram_torch.lowering.common import broadcast_shapes

OPINFO = ("cat", "stack", "hstack", "vstack", "index_select", "gather", "index_add",
          "scatter", "scatter_add", "__getitem__", "index_put", "index_copy", "index_fill",
          "scatter_reduce.sum", "scatter_reduce.prod", "scatter_reduce.mean",
          "scatter_reduce.amax", "scatter_reduce.amin")


# --- cat --------------------------------------------------------------------------------

def _cat_build(g, *args):
    *xs, dim, _shape, _dtype = args  # shape and dtype: part of the kernel's key
    return lower(aten.cat.default, g, xs, dim)


def _cat(op, tensors, dim=0, out=None):
    kwargs = {} if out is None else {"out": out}
    tensors = list(tensors)
    if not runner.supported(*tensors):
        return run_on_cpu(op, tensors, dim, **kwargs)
    meta = infer(op, tensors, dim, **({} if out is None else {"out": out}))
    dim = dim % max(meta.dim(), 1)
    return launch(op, (tensors, dim), kwargs, "shape.cat", _cat_build, tuple(tensors),
                  (dim, tuple(meta.shape), ISA[meta.dtype if out is None else out.dtype]), out,
                  meta=meta if out is None else None)


kernels("cat", _cat)


# --- index validation -------------------------------------------------------------------

def in_bounds(index: torch.Tensor, low: int, high: int) -> bool:
    """Are all of the device tensor ``index``'s values in ``[low, high)``? Read on the
    host through a CPU view of the device memory (on host memory: no launch, no copy)."""
    if index.numel() == 0:
        return True
    least, most = torch.aminmax(memory.cpu_alias(index, read_only=True))
    return low <= int(least) and int(most) < high


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


def _select(name: str, build, index_dtypes, op, self, dim, index, kwargs: dict):
    """gather's and index_select's kernel: ``self``'s elements along ``dim`` that ``index``
    names, by ``build``. Index values out of range raise torch's error; index dtypes
    outside ``index_dtypes`` and operands the device cannot take go to torch's kernel."""
    if not runner.supported(self, index) or index.dtype not in index_dtypes:
        return run_on_cpu(op, self, dim, index, **kwargs)
    infer(op, self, dim, index, **kwargs)
    dim = dim % max(self.dim(), 1)
    if not in_bounds(index, 0, self.shape[dim]):
        return cpu_error(op, self, dim, index, **kwargs)
    return launch(op, (self, dim, index), kwargs, name, build, (self, index), (dim,),
                  kwargs.get("out"))


def _gather(op, self, dim, index, *, sparse_grad=False, out=None):
    kwargs = {"sparse_grad": sparse_grad, **({} if out is None else {"out": out})}
    return _select("shape.gather", _gather_build, _SCATTER_INDEX, op, self, dim, index,
                   kwargs)


def _index_select(op, self, dim, index, out=None):
    kwargs = {} if out is None else {"out": out}
    return _select("shape.index_select", _index_select_build, _SELECT_INDEX, op, self, dim,
                   index, kwargs)


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


def check_index_shapes(tensors: list[torch.Tensor]) -> None:
    """PyTorch's IndexError for index tensors that do not broadcast together (its meta
    kernel words it differently, as a RuntimeError)."""
    if any(t.shape != tensors[0].shape for t in tensors):
        try:
            broadcast_shapes(*(t.shape for t in tensors))
        except RuntimeError:
            listed = ", ".join(str(list(t.shape)) for t in tensors)
            raise IndexError("shape mismatch: indexing tensors could not be broadcast "
                             f"together with shapes {listed}") from None


_MASKS = (torch.bool, torch.uint8)


def _expand_masks(self: torch.Tensor, indices: list) -> list | None:
    """``indices`` with their boolean and byte masks as the long indices of their nonzero
    positions (:func:`_mask_indices`), with PyTorch's deprecation warning for each byte
    mask, as its own expansion warns; ``indices`` as given where none is a mask or a mask
    is 0-d (PyTorch's kernel takes those). None for a mask whose shape does not match:
    the caller has PyTorch's kernel raise (it warns about byte masks itself)."""
    masks = [i for i in indices if i is not None and i.dtype in _MASKS]
    if not masks or any(m.dim() == 0 for m in masks) or not runner.supported(self):
        return indices
    expanded = _mask_indices(self, indices)
    if expanded is None:
        return None
    for m in masks:
        if m.dtype is torch.uint8:  # the CPU kernel's own warning, worded by it
            aten.index.Tensor(torch.empty(1), [torch.zeros(1, dtype=torch.uint8)])
    return expanded


def _index(op, self, indices, out=None):
    """``self[indices]`` (advanced indexing) as one gather, after the bounds check; masks
    become long indices on the host first (their nonzero positions: the result's shape is
    data)."""
    kwargs = {} if out is None else {"out": out}
    expanded = _expand_masks(self, list(indices))
    if expanded is None:
        return cpu_error(op, self, indices, **kwargs)
    indices = expanded
    tensors = [i for i in indices if i is not None]
    if not any(t.dtype in _MASKS for t in tensors):
        check_index_shapes(tensors)
    if (not tensors or self.dim() == 0 or len(indices) > self.dim()
            or not runner.supported(self, *tensors)
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


# --- writes by index: the lowerings' ISA scatter ------------------------------------------

def _writes_build(g, self, index, src, alpha, dim, how, dtype, kind, include_self, number,
                  scaled):
    """The index writes (:mod:`hologram_torch.lowering.shape`): ``src`` a runtime number
    when ``number`` (a Python one, or a CPU 0-d tensor: torch's wrapped scalar);
    ``alpha`` index_add's, used when ``scaled`` (else 1: nothing to scale)."""
    src = Number.of(src) if number else src
    if kind == "two":
        return lowering_shape.scatter_reduce_two(g, self, dim, index, src, how,
                                                 include_self=include_self)
    slices = kind in ("index_add", "index_copy", "index_fill")
    alpha = Number.of(alpha) if scaled else 1
    return lowering_shape.scatter_into(g, self, dim, index, src, how, slices, alpha,
                                       stepwise=kind == "index_add" and self.ndim <= 1)


#: Per kind of index write: the index dtypes torch takes, and whether negative indices
#: count from the end (else torch raises for them).
_WRITE_INDEX = {"index_add": (_SELECT_INDEX, False), "index_fill": (_SCATTER_INDEX, True),
                "index_copy": (_SCATTER_INDEX, False)}
_REDUCTIONS = {"reduce": ("add", "multiply"), "two": ("sum", "prod", "mean", "amax", "amin")}


def _writes(kind: str):
    """The kernel of an index write. ``kind``: "scatter" (``src``/``value``: replace),
    "reduce" (``scatter(reduce=)``: add or multiply), "add" (``scatter_add``), "two"
    (``scatter_reduce.two``), "index_add", "index_copy", "index_fill"."""
    mode = {"scatter": "replace", "add": "add", "index_add": "add",
            "index_copy": "replace", "index_fill": "replace"}.get(kind)
    # (the scatter family takes int32 indices too: torch's meta kernel rejects what its
    # CPU kernel does)
    index_dtypes, negative = _WRITE_INDEX.get(kind, (_SELECT_INDEX, False))

    def kernel(op, self, dim, index, src, reduce=None, *, alpha=1, include_self=True,
               out=None):
        args = (self, dim, index, src) + ((reduce,) if kind == "two" else ())
        kwargs = {k: v for k, v in (("alpha", alpha if kind == "index_add" else None),
                                    ("reduce", reduce if kind == "reduce" else None),
                                    ("include_self", include_self if kind == "two" else None),
                                    ("out", out)) if v is not None}
        how = mode if mode is not None else (reduce if reduce in _REDUCTIONS[kind] else None)
        tensors = (self, index) + ((src,) if isinstance(src, torch.Tensor) else ())
        if (not runner.supported(*tensors) or how is None or index.dtype not in index_dtypes
                or isinstance(alpha, complex) or isinstance(src, complex)):
            return run_on_cpu(op, *args, **kwargs)
        infer(op, *args, **kwargs)
        if index.numel() == 0:  # nothing written (index may even have another rank)
            if out is None:
                return clone(self)
            if out.shape != self.shape:
                out.resize_(self.shape)
            return copy_into(out, self)
        dim = dim % max(self.dim(), 1)
        n = self.shape[dim] if self.dim() else 1
        if not in_bounds(index, -n if negative else 0, n):
            return cpu_error(op, *args, **kwargs)
        if isinstance(src, torch.Tensor) and src.is_cpu:  # a wrapped number
            src = src.item()
        if not isinstance(src, torch.Tensor) and self.dtype is torch.bool:
            src = bool(src)
        number = not isinstance(src, torch.Tensor)
        if kind == "two" and number:
            return run_on_cpu(op, *args, **kwargs)
        scaled = kind == "index_add" and not (isinstance(alpha, (bool, int, float))
                                              and alpha == 1)
        static = (dim, how, ISA[self.dtype], kind, bool(include_self), number, scaled)
        try:
            return launch(op, args, kwargs, f"shape.{kind}", _writes_build,
                          (self, index, src, alpha if scaled else 1), static, out)
        except (Unsupported, runner.Unsupported):  # shapes the lowering does not take
            return run_on_cpu(op, *args, **kwargs)

    return kernel


for _name, _kind in (("scatter.src", "scatter"), ("scatter.value", "scatter"),
                     ("scatter.reduce", "reduce"), ("scatter.value_reduce", "reduce"),
                     ("scatter_add", "add"), ("scatter_reduce.two", "two"),
                     ("index_add", "index_add"), ("index_copy", "index_copy")):
    kernels(_name, _writes(_kind))


def _index_fill_kernels(name: str) -> None:
    """:func:`linalg.kernels` for an index_fill overload, whose in-place form also writes
    an expanded ``self`` as PyTorch does (warning that this is deprecated): through its
    CPU kernel on aliases of the memory (a program may not store to one location twice)."""
    fn = _writes("index_fill")
    functional, out_op = overload(name), overload(f"{name}_out")
    base, _, variant = name.partition(".")
    inplace_op = overload(f"{base}_.{variant}")
    impl(name)(lambda *a, **k: fn(functional, *a, **k))
    impl(f"{name}_out")(lambda *a, **k: fn(out_op, *a, **k))

    def inplace(self, dim, index, value):
        if memory.internal_overlap(self):
            storages: dict = {}

            def alias(t):
                return cpu_view(t, storages) if isinstance(t, torch.Tensor) and not t.is_cpu \
                    else t

            written = alias(self)
            written.index_fill_(dim, alias(index), alias(value))
            memory.write_back(written)
            return self
        if any(_shares_memory(self, t) for t in (index, value)):
            return run_on_cpu(inplace_op, self, dim, index, value)  # PyTorch's overlap rules
        return copy_into(self, fn(functional, self, dim, index, value))

    impl(f"{base}_.{variant}")(inplace)


_index_fill_kernels("index_fill.int_Scalar")
_index_fill_kernels("index_fill.int_Tensor")


# --- index_put: x[idx] = v, x[idx] += v, x[mask] = v -----------------------------------------

def _index_put_build(g, self, values, *rest):
    *tensors, present, accumulate, number = rest
    given = iter(tensors)
    indices = [next(given) if p else None for p in present]
    values = Number.of(values) if number else values
    return lower(aten.index_put.default, g, self, indices, values, accumulate)


def _mask_indices(self: torch.Tensor, indices: list) -> list | None:
    """``indices`` with each boolean mask replaced by the long index tensors of its
    ``nonzero()`` positions (PyTorch's own expansion), computed on the host through a
    CPU view; None where a mask's shape does not match the dimensions it indexes (torch
    raises)."""
    expanded, d = [], 0
    for i in indices:
        if i is None or i.dtype not in _MASKS:
            expanded.append(i)
            d += 1
            continue
        if i.dim() == 0 or tuple(i.shape) != tuple(self.shape[d:d + i.dim()]):
            return None
        found = (memory.cpu_alias(i, read_only=True) if not i.is_cpu else i).nonzero()
        expanded += [memory.from_cpu(found[:, j].contiguous()) for j in range(i.dim())]
        d += i.dim()
    return expanded


@impl("_index_put_impl_")
def _index_put_impl_(self, indices, values, accumulate=False, unsafe=False):
    """``self[indices] = values`` (``+=`` with ``accumulate``) in place: one ISA scatter
    (:func:`hologram_torch.lowering.shape.index_put`), duplicates written in index order
    (the last wins; accumulated in order). Boolean masks become indices on the host first
    (a host read of the mask, as PyTorch's own expansion does); index values are checked
    before the launch, an index out of range making PyTorch's CPU kernel raise."""
    op = aten._index_put_impl_.default
    given = [i for i in indices if i is not None]
    if (not accumulate and isinstance(values, torch.Tensor) and values.numel() == 1
            and len(given) == 1 and given[0].dtype is torch.uint8
            and given[0].device == self.device):
        # PyTorch's CPU writes one value through one mask as masked_fill_, which refuses
        # a byte mask: its error (``x[byte_mask] = 1.0``)
        return cpu_error(op, self, indices, values, accumulate, unsafe)
    expanded = _expand_masks(self, list(indices))
    if expanded is None:
        return cpu_error(op, self, indices, values, accumulate, unsafe)
    indices = expanded
    args = (self, indices, values, accumulate, unsafe)
    tensors = [i for i in indices if i is not None]
    value_tensor = isinstance(values, torch.Tensor) and not (values.is_cpu
                                                             and values.dim() == 0)
    if (not tensors or self.dim() == 0 or len(indices) > self.dim()
            or not runner.supported(self, *tensors, *([values] if value_tensor else []))
            or any(t.dtype not in _SELECT_INDEX or t.is_cpu for t in tensors)
            or (value_tensor and (values.dtype is not self.dtype or values.is_cpu))
            or memory.internal_overlap(self)):
        return run_on_cpu(op, *args)
    for d, i in enumerate(indices):
        n = self.shape[d]
        if i is not None and not in_bounds(i, -n, n):
            return cpu_error(op, *args)
    if self.numel() == 0:
        return self
    if not value_tensor:
        values = values.item() if isinstance(values, torch.Tensor) else values
        if self.dtype is torch.bool:
            values = bool(values)
        if isinstance(values, complex):
            return run_on_cpu(op, *args)
    present = tuple(i is not None for i in indices)
    try:
        runner.run("shape.index_put", _index_put_build, (self, values, *tensors),
                    (present, bool(accumulate), not value_tensor), out=(self,))
    except (Unsupported, runner.Unsupported):  # values that do not broadcast: torch raises
        return run_on_cpu(op, *args)
    return self


__all__ = ["OPINFO"]




# --- pixel shuffles ------------------------------------------------------------------------
# The CPU's kernels lay their result out in the input's suggested memory format (a
# channels_last input gives a channels_last result); PyTorch's generic version, which a
# device without these kernels gets, is always contiguous. Each is one copy of a view of
# the input into a view of the result.

def _shuffle_result(op, self: torch.Tensor, factor: int) -> torch.Tensor:
    """The fresh result, or the CPU kernel's error (the meta kernel words it otherwise):
    that kernel rejects the shape before it allocates, so it runs on a stand-in."""
    try:
        if factor <= 0:  # (the meta kernel divides by it)
            raise RuntimeError(f"{op}: factor {factor}")
        meta = infer(op, self, factor)
    except RuntimeError:
        op(torch.zeros((), dtype=self.dtype).expand(self.shape), factor)
        raise
    return memory.empty(meta.shape, self.dtype, layout.suggested(self, meta.shape))


def _pixel_shuffle(op, self: torch.Tensor, factor: int, split, order) -> torch.Tensor:
    """``op``'s result: the input's (c, h, w) split into five dimensions (``split(c, h, w)``),
    permuted by ``order`` and copied into the result, viewed as that permutation."""
    out = _shuffle_result(op, self, factor)
    if out.numel():
        *batch, c, h, w = self.shape
        n = len(batch)
        src = self.reshape(*batch, *split(c, h, w)).permute(*range(n), *(n + k for k in order))
        copy_into(out.view(src.shape), src)
    return out


@composed("pixel_shuffle")
def pixel_shuffle(self, upscale_factor):
    r = upscale_factor
    # (..., c/r², r, r, h, w) -> (..., c/r², h, r, w, r)
    return _pixel_shuffle(aten.pixel_shuffle.default, self, r,
                          lambda c, h, w: (c // (r * r), r, r, h, w), (0, 3, 1, 4, 2))


@composed("channel_shuffle")
def channel_shuffle(self, groups):
    """(n, g * k, *) -> channels regrouped as (n, k * g, *), as the CPU kernel: laid out in
    the input's suggested memory format, an empty input's view of itself, and its errors
    (raised by the CPU kernel on a stand-in)."""
    if self.dim() <= 2 or groups <= 0 or self.shape[1] % groups:
        aten.channel_shuffle.default(torch.zeros((), dtype=self.dtype).expand(self.shape),
                                     groups)
    if not self.numel():
        return self.view(self.shape)
    n, c, *rest = self.shape
    out = memory.empty(self.shape, self.dtype, layout.suggested(self))
    # input channel j * k + i becomes output channel i * g + j
    copy_into(out.view(n, c // groups, groups, *rest),
              self.unflatten(1, (groups, c // groups)).transpose(1, 2))
    return out


@composed("pixel_unshuffle")
def pixel_unshuffle(self, downscale_factor):
    r = downscale_factor
    # (..., c, h/r, r, w/r, r) -> (..., c, r, r, h/r, w/r)
    return _pixel_shuffle(aten.pixel_unshuffle.default, self, r,
                          lambda c, h, w: (c, h // r, r, w // r, r), (0, 2, 4, 1, 3))
