"""Pooling: max pooling with indices, average pooling and adaptive average pooling over 2
or 3 spatial dimensions (PyTorch's 1-d pools reach the 2-d ops), with their backward.

Pools are strided window reductions. The input is copied into a buffer with the padding
around it (-inf, or the dtype's least value, for max pooling; 0 for averages), and the
windows are a view of that buffer: ``lead + outputs + kernel`` with the output axes
stepping by ``stride`` and the kernel axes by ``dilation``; one reduction over the kernel
axes pools. Max pooling's index is torch's CPU rule: the first element equal to the
maximum, except that NaN wins and then the *last* NaN is the index (torch's loop takes
``val > max || isnan(val)``); padding never counts. The value is the ISA's max, so where
a window's maximum is a zero of both signs its sign may differ from torch's (which keeps
the first).

Backward ops scatter each output's gradient back over its window: one strided store per
kernel offset into a zero buffer of the padded shape (windows that do not overlap write
disjoint elements; overlapping windows get one buffer per offset, summed), then the
padding is cropped. Adaptive pools have windows of varying start and size
(``floor(o I / O)`` to ``ceil((o + 1) I / O)``): one masked sum per spatial dimension,
divided by the window's element count, unless every window has the same size (``I`` a
multiple of ``O``), when they are an average pool.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from hologram.isa import dtypes as dt
from hologram_torch.lowering.common import Unsupported, aten, cast, opmath, register

#: Above every flat index (the neutral element of the first-maximum search).
_NO_INDEX = 1 << 62


@dataclass(frozen=True)
class Window:
    """One spatial dimension of a pool: input size, kernel, stride, padding, dilation,
    output size."""

    size: int
    kernel: int
    stride: int
    padding: int
    dilation: int
    out: int

    @property
    def extent(self) -> int:
        """The padded extent the windows read (the ceil mode's last window included)."""
        reach = (self.out - 1) * self.stride + (self.kernel - 1) * self.dilation + 1
        return max(self.padding + self.size, reach)

    def starts(self, o: int) -> list[int]:
        return [o * self.stride - self.padding + k * self.dilation for k in range(self.kernel)]


def _expand(values, n: int, name: str, default=None) -> tuple[int, ...]:
    values = tuple(values) if values is not None else ()
    if not values and default is not None:
        values = default
    if len(values) == 1:
        values = values * n
    if len(values) != n:
        raise Unsupported(f"{name} of {len(values)} values")  # torch raises
    return tuple(int(v) for v in values)


def _out_size(size, kernel, stride, padding, dilation, ceil_mode) -> int:
    """at::native's pooling_output_shape."""
    out = (size + 2 * padding - dilation * (kernel - 1) - 1
           + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def geometry(x, n: int, kernel_size, stride, padding, dilation, ceil_mode) -> list[Window]:
    """The windows of an ``n``-d pool of ``x`` (``(C, *spatial)`` or ``(N, C, *spatial)``);
    :class:`Unsupported` for what torch rejects, and for windows lying wholly in the
    padding (possible with dilation, where torch's index is not an element's)."""
    if x.ndim not in (n + 1, n + 2) or 0 in x.shape[-n - 1:]:
        raise Unsupported(f"pool input of shape {x.shape}")  # torch raises
    kernel = _expand(kernel_size, n, "kernel_size")
    stride = _expand(stride, n, "stride", kernel)
    padding = _expand(padding, n, "padding")
    dilation = _expand(dilation, n, "dilation")
    windows = []
    for size, k, s, p, d in zip(x.shape[-n:], kernel, stride, padding, dilation):
        if k <= 0 or s <= 0 or d <= 0 or p < 0 or p > ((k - 1) * d + 1) // 2:
            raise Unsupported("pool arguments")  # torch raises
        out = _out_size(size, k, s, p, d, ceil_mode)
        if out < 1:
            raise Unsupported("pool output size")  # torch raises
        w = Window(size, k, s, p, d, out)
        if any(not any(0 <= i < size for i in w.starts(o)) for o in range(out)):
            raise Unsupported("a pooling window of padding only")
        windows.append(w)
    return windows


# --- views of padded buffers ---------------------------------------------------------------

def _padded(g, x, windows: list[Window], fill, dtype: dt.DType):
    """``x`` in ``dtype``, with ``fill`` around it up to each window's extent."""
    n = len(windows)
    lead = x.shape[:-n]
    if all(w.padding == 0 and w.extent == w.size for w in windows):
        return cast(x, dtype)
    buf = g._temp(dtype, lead + tuple(w.extent for w in windows))
    k = g.builder.kernel(buf.shape)
    k.store(buf.buffer, k.const(fill, dtype), shape=buf.shape)
    inner = buf[(slice(None),) * len(lead)
                + tuple(slice(w.padding, w.padding + w.size) for w in windows)]
    if math.prod(x.shape):
        k = g.builder.kernel(x.shape)
        value = g._load(k, x)
        value = value if x.dtype is dtype else k.cast(value, dtype)
        k.store(inner.buffer, value, inner.offset, inner.strides, inner.shape)
    return buf


def _windows(t, windows: list[Window]):
    """``t`` (``lead + extents``) viewed as ``lead + outputs + kernel``."""
    n = len(windows)
    lead, spatial = t.strides[:-n], t.strides[-n:]
    return t._view(t.shape[:-n] + tuple(w.out for w in windows)
                   + tuple(w.kernel for w in windows),
                   lead + tuple(st * w.stride for st, w in zip(spatial, windows))
                   + tuple(st * w.dilation for st, w in zip(spatial, windows)), t.offset)


def _on_axes(t, shape: tuple[int, ...], axes: tuple[int, ...]):
    """A contiguous ``t`` viewed over ``shape``, its dimensions on ``axes`` (broadcast
    along the others)."""
    strides = [0] * len(shape)
    for a, s in zip(axes, t.strides):
        strides[a] = s
    return t._view(shape, tuple(strides), t.offset)


def _grid(g, windows: list[Window]):
    """(flat input index, inside the input) of every window element, shaped ``outputs +
    kernel``: the index as torch's max pooling returns it (row-major over the spatial
    dimensions)."""
    n = len(windows)
    shape = tuple(w.out for w in windows) + tuple(w.kernel for w in windows)
    flat = valid = None
    inner = 1
    for j in reversed(range(n)):
        w = windows[j]
        pos = (g.arange(w.out).reshape(w.out, 1) * w.stride
               + g.arange(w.kernel).reshape(1, w.kernel) * w.dilation - w.padding)
        inside = g.binary("and", g.binary("ge", pos, 0), g.binary("lt", pos, w.size))
        pos, inside = _on_axes(pos, shape, (j, n + j)), _on_axes(inside, shape, (j, n + j))
        flat = pos * inner if flat is None else flat + pos * inner
        valid = inside if valid is None else g.binary("and", valid, inside)
        inner *= w.size
    return flat, valid


def overlaps(windows: list[Window]) -> bool:
    """Do neighbouring windows share input elements?"""
    return any(w.stride < (w.kernel - 1) * w.dilation + 1 for w in windows)


def tiles(windows: list[Window]) -> bool:
    """Do the windows cover the padded extent element for element, once each?"""
    return all(w.dilation == 1 and w.stride == w.kernel and w.out * w.stride == w.extent
               for w in windows)


def _scatter(g, values_at, lead: tuple[int, ...], windows: list[Window], dtype: dt.DType):
    """The input-shaped sum of ``values_at(offset)`` (``lead + outputs``, one per kernel
    offset) stored at the input elements each offset's windows read."""
    offsets = list(itertools.product(*(range(w.kernel) for w in windows)))
    spatial = tuple(w.extent for w in windows)
    overlap = overlaps(windows)
    layers = (len(offsets),) if overlap else ()
    buf = g._temp(dtype, layers + lead + spatial)
    if overlap or not tiles(windows):  # some elements are in no window: zeros first
        k = g.builder.kernel(buf.shape)
        k.store(buf.buffer, k.const(0, dtype), shape=buf.shape)
    for i, offset in enumerate(offsets):
        value = values_at(offset)
        if not math.prod(value.shape):
            continue
        target = buf[((i,) if overlap else ()) + (slice(None),) * len(lead) + tuple(
            slice(o * w.dilation, o * w.dilation + (w.out - 1) * w.stride + 1, w.stride)
            for o, w in zip(offsets[i], windows))]
        k = g.builder.kernel(value.shape)
        k.store(target.buffer, g._load(k, value), target.offset, target.strides,
                target.shape)
    total = g.reduce("sum", buf, 0) if overlap else buf
    return total[(slice(None),) * len(lead)
                 + tuple(slice(w.padding, w.padding + w.size) for w in windows)]


# --- max pooling ---------------------------------------------------------------------------

def max_pool(g, x, n, kernel_size, stride, padding, dilation, ceil_mode):
    if x.dtype.is_bool:
        raise Unsupported("max pooling of bools")  # torch raises
    windows = geometry(x, n, kernel_size, stride, padding, dilation, ceil_mode)
    view = _windows(_padded(g, x, windows, x.dtype.min, x.dtype), windows)
    axes = tuple(range(view.ndim - n, view.ndim))
    top = g.reduce("max", view, axes)
    flat, valid = _grid(g, windows)
    tops = top._view(view.shape, top.strides + (0,) * n, top.offset)
    hit = g.binary("and", valid, g.binary("eq", view, tops))
    index = g.reduce("min", g.where(hit, flat, _NO_INDEX), axes)
    if x.dtype.is_float:
        nan = g.binary("and", valid, g.binary("ne", view, view))
        last_nan = g.reduce("max", g.where(nan, flat, -1), axes)
        index = g.where(g.binary("ge", last_nan, 0), last_nan, index)
    return top, index


def max_pool_backward(g, grad_output, x, n, kernel_size, stride, padding, dilation,
                      ceil_mode, indices):
    windows = geometry(x, n, kernel_size, stride, padding, dilation, ceil_mode)
    out_shape = x.shape[:-n] + tuple(w.out for w in windows)
    if (grad_output.shape != out_shape or indices.shape != out_shape
            or indices.dtype is not dt.int64 or not grad_output.dtype.is_float):
        raise Unsupported("max pooling backward operands")  # torch raises
    acc = opmath(grad_output.dtype)
    grad = cast(grad_output, acc)
    flat, _ = _grid(g, windows)

    def values_at(offset):
        here = flat[(slice(None),) * n + offset]
        return g.where(g.binary("eq", indices, here), grad, 0.0)

    return cast(_scatter(g, values_at, x.shape[:-n], windows, acc), grad_output.dtype)


# --- average pooling -----------------------------------------------------------------------

def _accumulator(x) -> dt.DType:
    if x.dtype.is_float:
        return opmath(x.dtype)
    if x.dtype is dt.int64:
        return dt.int64  # integer sums, divided as C++ divides integers (truncation)
    raise Unsupported(f"average pooling of {x.dtype}")  # torch raises


def _divisor(g, windows: list[Window], count_include_pad: bool, divisor_override):
    """The divisor of every output (``outputs``-shaped int64, or a number)."""
    if divisor_override is not None:
        if divisor_override == 0:
            raise Unsupported("divisor_override of 0")  # torch raises
        return int(divisor_override)
    shape = tuple(w.out for w in windows)
    total = None
    for j, w in enumerate(windows):
        start = g.arange(w.out) * w.stride - w.padding
        end = g.minimum(start + w.kernel, w.size + w.padding)
        # torch's window size: with the padding (not past it), or the input's part
        inside = g.minimum(end, w.size) - g.maximum(start, 0)
        size = end - start if count_include_pad else inside
        size = _on_axes(size, shape, (j,))
        total = size if total is None else total * size
    return total


def _average(total, divisor, acc: dt.DType):
    return total / (divisor if isinstance(divisor, int) else cast(divisor, acc))


def avg_pool(g, x, n, kernel_size, stride, padding, ceil_mode, count_include_pad,
             divisor_override):
    acc = _accumulator(x)
    windows = geometry(x, n, kernel_size, stride, padding, (1,), ceil_mode)
    view = _windows(_padded(g, x, windows, 0, acc), windows)
    total = g.reduce("sum", view, tuple(range(view.ndim - n, view.ndim)))
    divisor = _divisor(g, windows, count_include_pad, divisor_override)
    return cast(_average(total, divisor, acc), x.dtype)


def avg_pool_backward(g, grad_output, x, n, kernel_size, stride, padding, ceil_mode,
                      count_include_pad, divisor_override):
    windows = geometry(x, n, kernel_size, stride, padding, (1,), ceil_mode)
    if grad_output.shape != x.shape[:-n] + tuple(w.out for w in windows) \
            or not grad_output.dtype.is_float:
        raise Unsupported("average pooling backward operands")  # torch raises
    acc = opmath(grad_output.dtype)
    share = _average(cast(grad_output, acc),
                     _divisor(g, windows, count_include_pad, divisor_override), acc)
    return cast(_scatter(g, lambda offset: share, x.shape[:-n], windows, acc),
                grad_output.dtype)


# --- adaptive average pooling --------------------------------------------------------------

def _adaptive_check(x, n: int, output_size) -> tuple[int, ...]:
    out = tuple(int(o) for o in output_size)
    if (len(out) != n or x.ndim not in (n + 1, n + 2) or 0 in x.shape[-n - 1:]
            or min(out) < 1 or not x.dtype.is_float):
        raise Unsupported("adaptive pooling arguments")  # torch raises (or empty output)
    if n == 3 and opmath(x.dtype) is not x.dtype:
        # torch's 3-d kernel adds half values in the half type one after the other (each
        # sum rounded): an order no reduction reproduces
        raise Unsupported("3-d adaptive average pooling of half types")
    return out


def _uniform(x, n: int, out: tuple[int, ...]) -> list[Window] | None:
    """The windows of an adaptive pool whose windows all have one size, else None."""
    sizes = x.shape[-n:]
    if any(i % o for i, o in zip(sizes, out)):
        return None
    return [Window(i, i // o, i // o, 0, 1, o) for i, o in zip(sizes, out)]


def _membership(g, size: int, out: int):
    """``[out, size]``: is input element i in adaptive window o? ``floor(o I / O) <= i <
    ceil((o + 1) I / O)``, in integers: ``o I < (i + 1) O`` and ``i O < (o + 1) I``."""
    o = g.arange(out).reshape(out, 1)
    i = g.arange(size).reshape(1, size)
    return g.binary("and", g.binary("lt", o * size, (i + 1) * out),
                    g.binary("lt", i * out, (o + 1) * size))


def _mask_sum(g, t, axis: int, mask):
    """Sum ``t`` along ``axis`` into ``mask.shape[0]`` rows, row r over the elements
    ``mask[r]`` marks: the new axis takes ``axis``'s place."""
    rows, cols = mask.shape
    shape = t.shape[:axis] + (rows,) + t.shape[axis + 1:] + (cols,)
    strides = t.strides[:axis] + (0,) + t.strides[axis + 1:] + (t.strides[axis],)
    view = t._view(shape, strides, t.offset)
    after = t.ndim - axis - 1
    m = mask._view((rows,) + (1,) * after + (cols,),
                   (mask.strides[0],) + (0,) * after + (mask.strides[1],), mask.offset)
    return g.reduce("sum", g.where(m, view, 0.0), view.ndim - 1)


def _counts(g, windows_mask, n: int, out: tuple[int, ...]):
    """Elements per adaptive window (``outputs``-shaped, in i64)."""
    total = None
    for j, mask in enumerate(windows_mask):
        count = _on_axes(g.reduce("sum", cast(mask, dt.int64), 1), out, (j,))
        total = count if total is None else total * count
    return total


def adaptive_avg_pool(g, x, n, output_size):
    out = _adaptive_check(x, n, output_size)
    windows = _uniform(x, n, out)
    if windows is not None:
        return avg_pool(g, x, n, [w.kernel for w in windows], [w.stride for w in windows],
                        (0,), False, True, None)
    acc = opmath(x.dtype)
    t = cast(x, acc)
    masks = [_membership(g, i, o) for i, o in zip(x.shape[-n:], out)]
    for j, mask in enumerate(masks):
        t = _mask_sum(g, t, x.ndim - n + j, mask)
    return cast(t / cast(_counts(g, masks, n, out), acc), x.dtype)


def adaptive_avg_pool_backward(g, grad_output, x, n):
    out = tuple(grad_output.shape[-n:]) if grad_output.ndim == x.ndim else ()
    _adaptive_check(x, n, out)
    if grad_output.shape != x.shape[:-n] + out or not grad_output.dtype.is_float:
        raise Unsupported("adaptive pooling backward operands")  # torch raises
    windows = _uniform(x, n, out)
    if windows is not None:
        return avg_pool_backward(g, grad_output, x, n, [w.kernel for w in windows],
                                 [w.stride for w in windows], (0,), False, True, None)
    acc = opmath(grad_output.dtype)
    masks = [_membership(g, i, o) for i, o in zip(x.shape[-n:], out)]
    t = cast(grad_output, acc) / cast(_counts(g, masks, n, out), acc)
    for j, mask in enumerate(masks):
        t = _mask_sum(g, t, x.ndim - n + j, mask.T)
    return cast(t, grad_output.dtype)


# --- the table -----------------------------------------------------------------------------

def _register(dims: int) -> None:
    mp, mpb = (getattr(aten, f"max_pool{dims}d_with_indices"),
               getattr(aten, f"max_pool{dims}d_with_indices_backward"))
    ap, apb = getattr(aten, f"avg_pool{dims}d"), getattr(aten, f"avg_pool{dims}d_backward")
    aap, aapb = (getattr(aten, f"_adaptive_avg_pool{dims}d"),
                 getattr(aten, f"_adaptive_avg_pool{dims}d_backward"))

    @register(mp.default)
    def max_pool_nd(g, self, kernel_size, stride=(), padding=(0,), dilation=(1,),
                    ceil_mode=False):
        return max_pool(g, self, dims, kernel_size, stride, padding, dilation, ceil_mode)

    @register(mpb.default)
    def max_pool_nd_backward(g, grad_output, self, kernel_size, stride, padding, dilation,
                             ceil_mode, indices):
        return max_pool_backward(g, grad_output, self, dims, kernel_size, stride, padding,
                                 dilation, ceil_mode, indices)

    @register(ap.default)
    def avg_pool_nd(g, self, kernel_size, stride=(), padding=(0,), ceil_mode=False,
                    count_include_pad=True, divisor_override=None):
        return avg_pool(g, self, dims, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override)

    @register(apb.default)
    def avg_pool_nd_backward(g, grad_output, self, kernel_size, stride, padding, ceil_mode,
                             count_include_pad, divisor_override):
        return avg_pool_backward(g, grad_output, self, dims, kernel_size, stride, padding,
                                 ceil_mode, count_include_pad, divisor_override)

    @register(aap.default)
    def adaptive_avg_pool_nd(g, self, output_size):
        return adaptive_avg_pool(g, self, dims, output_size)

    @register(aapb.default)
    def adaptive_avg_pool_nd_backward(g, grad_output, self):
        return adaptive_avg_pool_backward(g, grad_output, self, dims)


_register(2)
_register(3)
