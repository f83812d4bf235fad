"""The strides of a kernel's fresh results: the layouts PyTorch's CPU kernels give.

PyTorch does not return every result contiguous. An elementwise op (TensorIterator) lays
its output out like its inputs when they agree (``x + x`` of a channels_last ``x`` is
channels_last, ``a.t() * 2`` is transposed); ``clone``, ``dropout`` and ``_to_copy`` keep
their input's layout (``empty_like``); pooling, upsampling, batch norm and ``cat`` keep a
channels_last input channels_last; softmax, layer norm and reductions return contiguous
results. Code that checks ``is_contiguous(memory_format=...)``, and PyTorch's own tests of
memory formats, see the difference.

A device kernel's layout is decided once, when its program is compiled (its key holds every
operand's strides, so the decision holds for every later call):

* :func:`of_op`: an aten op's results are laid out as its meta kernel lays them out (the
  meta kernels are TensorIterator's and the structured kernels' own code, so they agree
  with the CPU's);
* :func:`elementwise`: TensorIterator's rule, for kernels that are not one aten op
  (a ``_foreach`` element, an eval-mode dropout).

Only dense layouts (every element once, no gaps) are taken; anything else is contiguous.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch._prims_common as _prims

from hologram_torch.memory import contiguous_strides, dense

Strides = tuple[int, ...]
_META = torch.device("meta")


def contiguous(shape: Sequence[int]) -> Strides:
    """PyTorch's contiguous strides (a dimension of size 0 or 1 counts as 1)."""
    return tuple(contiguous_strides(shape))


def _permuted(shape: Sequence[int], fastest_first: Sequence[int]) -> Strides:
    """Dense strides with the dimensions ordered ``fastest_first`` (innermost first)."""
    strides = [0] * len(shape)
    step = 1
    for d in fastest_first:
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


def _channels_last(shape: Sequence[int]) -> Strides:
    """Channels-last strides (NHWC, NDHWC) for a 4-d or 5-d ``shape``."""
    order = [1, *range(len(shape) - 1, 1, -1), 0]  # C fastest, then W, H, (D), N
    strides = [0] * len(shape)
    step = 1
    for d in order:
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def elementwise(shape: Sequence[int], operands: Sequence) -> Strides:
    """TensorIterator's strides for a fresh output of ``shape`` computed elementwise from
    ``operands`` (tensors broadcast to ``shape``; anything else is ignored).

    Its fast path first: operands of one shape that are all contiguous, all channels_last,
    or all dense with equal strides give that layout. Otherwise the dimensions are sorted,
    fastest first, by the operands' strides (the first operand that tells two dimensions
    apart decides; broadcast dimensions tell nothing), and the output is dense in that
    order (``TensorIteratorBase::reorder_dimensions``)."""
    shape = tuple(shape)
    tensors = [t for t in operands if isinstance(t, torch.Tensor)]
    ndim = len(shape)
    if not tensors or ndim == 0:
        return contiguous(shape)
    if all(tuple(t.shape) == tuple(tensors[0].shape) for t in tensors):
        for fmt in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d):
            if all(t.is_contiguous(memory_format=fmt) for t in tensors):
                return (contiguous(shape) if fmt is torch.contiguous_format
                        else _channels_last(shape))
        first = tuple(tensors[0].stride())
        if (tuple(tensors[0].shape) == shape and dense(shape, first)
                and all(tuple(t.stride()) == first for t in tensors)):
            return first
    if ndim == 1:
        return (1,)
    strides = []  # each operand's strides over shape's dimensions; 0 where broadcast
    for t in tensors:
        pad = ndim - t.dim()
        strides.append([0] * pad + [0 if n == 1 and shape[pad + i] != 1 else s
                                    for i, (n, s) in enumerate(zip(t.shape, t.stride()))])

    def should_swap(d0: int, d1: int) -> int:
        for s in strides:
            a, b = s[d0], s[d1]
            if a == 0 or b == 0:
                continue
            if a != b:
                return 1 if a > b else -1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(range(ndim - 1, -1, -1))  # fastest first
    for i in range(1, ndim):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    if perm == list(range(ndim - 1, -1, -1)):
        return contiguous(shape)
    return _permuted(shape, perm)


def _meta(x):
    if isinstance(x, torch.Tensor) and not x.is_cpu:
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=_META)
    if isinstance(x, (list, tuple)):
        return type(x)(_meta(v) for v in x)
    return x


def of_op(op: torch._ops.OpOverload, args: Sequence, kwargs: dict,
          shapes: Sequence[Sequence[int]]) -> list[Strides] | None:
    """The strides of ``op(*args, **kwargs)``'s results as its meta kernel lays them out,
    one per entry of ``shapes`` (the kernel's results, which must be the op's tensor
    results in order); None where the meta kernel fails or disagrees on the results.
    Empty results of pointwise ops follow TensorIterator (:func:`pointwise`), as the CPU's
    kernels do: the meta kernels lay them out otherwise (an empty channels_last ``x``:
    ``x * w[0]`` is channels_last on the CPU and contiguous in meta, ``x + x`` the
    reverse)."""
    if torch.Tag.pointwise in op.tags and any(0 in tuple(s) for s in shapes):
        return pointwise(args, (), shapes)
    try:
        result = op(*_meta(list(args)), **{k: _meta(v) for k, v in kwargs.items()})
    except Exception:  # no meta kernel, or arguments it takes differently
        if torch.Tag.pointwise in op.tags:
            return pointwise(args, (), shapes)
        return None
    results = result if isinstance(result, (tuple, list)) else (result,)
    results = [r for r in results if isinstance(r, torch.Tensor)]
    if len(results) != len(shapes):
        return None
    strides = []
    for r, shape in zip(results, shapes):
        if tuple(r.shape) != tuple(shape):
            return None
        s = tuple(r.stride())
        strides.append(s if dense(shape, s) else contiguous(shape))
    return strides


def pointwise(args: Sequence, static: tuple, shapes: Sequence[Sequence[int]]
              ) -> list[Strides]:
    """:func:`runner.run`'s ``layout`` for an elementwise kernel: :func:`elementwise`
    for each result."""
    return [elementwise(shape, args) for shape in shapes]


def preserved(args: Sequence, static: tuple, shapes: Sequence[Sequence[int]]
              ) -> list[Strides]:
    """:func:`runner.run`'s ``layout`` for a copy of its first operand laid out as
    ``empty_like(x)`` (``clone``): ``x``'s own strides when they are dense (an empty or
    size-1 dimension's stride included), else TensorIterator's order of ``x``'s."""
    x = args[0]
    stride = tuple(x.stride())
    if dense(x.shape, stride):
        return [stride for _ in shapes]
    return [elementwise(shape, (x,)) for shape in shapes]


def suggested(x: torch.Tensor, shape: Sequence[int] | None = None) -> Strides:
    """Contiguous strides for ``shape`` (default ``x``'s) in ``x``'s suggested memory
    format (channels_last when ``x``'s strides are channels_last-like, else contiguous):
    what batch norm, pooling, upsampling and pixel shuffles allocate
    (``empty(shape, memory_format=x.suggest_memory_format())``)."""
    shape = tuple(x.shape if shape is None else shape)
    if _prims.suggest_memory_format(x) is torch.contiguous_format or len(shape) != x.dim():
        return contiguous(shape)
    return _channels_last(shape)


def like_first(args: Sequence, static: tuple, shapes: Sequence[Sequence[int]]
               ) -> list[Strides | None]:
    """:func:`runner.run`'s ``layout`` for kernels that lay out results shaped as their
    first operand in its suggested memory format (:func:`suggested`)."""
    first = args[0]
    return [suggested(first) if tuple(shape) == tuple(first.shape) else None
            for shape in shapes]
