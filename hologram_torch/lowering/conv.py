"""Convolutions: ``convolution`` and ``convolution_backward``, 1-3 spatial dimensions, any
stride, padding, dilation and groups, transposed or not.

A convolution is a product with the input's columns (im2col): the input, zero-padded into
a temporary, is read through a strided view of shape ``(N, G, Cg, *kernel, *out)`` (one
window element per kernel offset and output position) and copied contiguously (no copy
for a 1x1 kernel at stride 1 without padding), so that ``weight (Og, Cg*K) @ columns
(Cg*K, out)`` per sample and group is a batched GEMM that the CPU backend hands to BLAS,
written straight into the output's layout. Its gradients:

- the weight's, ``grad_out (G, Og, N*out) @ columns^T``: one GEMM per group, both
  operands copied into those layouts (for a 1x1 kernel at stride 1 without padding,
  whose columns are the input itself, one GEMM per sample and group summed over the
  samples, without copies);
- the input's, at stride 1 (padding within the dilated kernel), the "full" convolution
  of ``grad_out`` by the weight flipped in space with its channel axes swapped (a forward
  convolution); otherwise ``weight^T @ grad_out`` per sample and group (the columns'
  gradient) added back into the padded input's positions by one scatter-add (col2im),
  the padding sliced off.

Depthwise convolutions (one input channel per group) have products as short as the
kernel, too short for a GEMM: they are multiplications of the windows by the weight and
sums over the kernel (forward), over the batch and positions (the weight's gradient), a
multiplication for the columns' gradient.

A transposed convolution's forward is that input gradient; its own input gradient is the
forward convolution of ``grad_out``, its weight gradient the weight gradient with the
roles of input and ``grad_out`` exchanged.

float16/bfloat16 compute in float32 and round once, as torch's CPU kernels do.
:class:`Unsupported` (the eager device runs PyTorch's CPU kernel, which raises where it
must): other dtypes (complex, integers), operands of different dtypes, an unbatched input,
shapes or parameters torch rejects, an empty channel dimension, and a float16/bfloat16
transposed convolution whose ``output_padding`` reaches its stride (torch's CPU rounds
that one's intermediate sums to the half type). Padding modes and double
backward are composite ops above these two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hologram.isa import dtypes as dt
from hologram_torch.lowering.common import Unsupported, aten, cast, opmath, register, zeros

_FLOATS = (dt.float16, dt.bfloat16, dt.float32, dt.float64)


@dataclass(frozen=True)
class _Conv:
    """A (non-transposed) convolution's geometry: ``groups`` and, per spatial dimension,
    the kernel extent, stride, padding and dilation."""

    groups: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]

    def out_sizes(self, sizes) -> tuple[int, ...]:
        """The output's spatial extents for an input of spatial extents ``sizes``."""
        return tuple((n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, s, p, d in zip(
            sizes, self.kernel, self.stride, self.padding, self.dilation))


def _expand(name: str, values, dims: int) -> tuple[int, ...]:
    values = tuple(int(v) for v in values)
    if len(values) == 1:  # torch's expand_param_if_needed
        values *= dims
    if len(values) != dims:
        raise Unsupported(f"{name} of {len(values)} entries for {dims} spatial dims")
    return values


def _geometry(input, weight, stride, padding, dilation, transposed, output_padding,
              groups) -> tuple[_Conv, tuple[int, ...]]:
    """The convolution's geometry and its output's spatial sizes, after torch's checks
    (a failing one is :class:`Unsupported`: torch's kernel raises its error)."""
    dims = weight.ndim - 2
    if not 1 <= dims <= 3 or input.ndim != weight.ndim:
        raise Unsupported("convolution: only batched 1-3d inputs are lowered")
    if input.dtype not in _FLOATS or weight.dtype is not input.dtype:
        raise Unsupported(f"convolution of {input.dtype.name} by {weight.dtype.name}")
    conv = _Conv(int(groups), weight.shape[2:], _expand("stride", stride, dims),
                 _expand("padding", padding, dims), _expand("dilation", dilation, dims))
    out_padding = _expand("output_padding", output_padding, dims)
    if (conv.groups < 1 or min(conv.stride) < 1 or min(conv.dilation) < 1
            or min(conv.padding) < 0 or min(out_padding) < 0 or 0 in weight.shape[:2]):
        raise Unsupported("convolution parameters torch rejects (or an empty channel)")
    sizes = input.shape[2:]
    if transposed:
        if input.shape[1] != weight.shape[0] or weight.shape[0] % conv.groups or any(
                op >= max(s, d) for op, s, d in zip(out_padding, conv.stride, conv.dilation)):
            raise Unsupported("transposed convolution shapes torch rejects")
        if input.dtype in (dt.float16, dt.bfloat16) and any(
                op >= s for op, s in zip(out_padding, conv.stride)):
            # torch's CPU takes its slow path here, which rounds the columns and the sum
            # before the bias to the half type: left to it, for its results
            raise Unsupported("a half-type transposed convolution with output_padding "
                              "not below the stride")
        out = tuple((n - 1) * s - 2 * p + d * (k - 1) + op + 1 for n, k, s, p, d, op in zip(
            sizes, conv.kernel, conv.stride, conv.padding, conv.dilation, out_padding))
    else:
        if input.shape[1] != weight.shape[1] * conv.groups or weight.shape[0] % conv.groups:
            raise Unsupported("convolution shapes torch rejects")
        padded = (n + 2 * p for n, p in zip(sizes, conv.padding))
        if any(n < d * (k - 1) + 1 for n, k, d in zip(padded, conv.kernel, conv.dilation)):
            raise Unsupported("a kernel larger than the padded input")  # torch raises
        out = conv.out_sizes(sizes)
    if min(out) < 1:
        raise Unsupported("an empty convolution output")  # torch raises
    return conv, out


def _out_channels(weight, transposed: bool, groups: int) -> int:
    return weight.shape[1] * groups if transposed else weight.shape[0]


def _store(g, target, value) -> None:
    """One kernel writing ``value`` (cast to ``target``'s dtype) into the view
    ``target``."""
    if math.prod(target.shape):
        k = g.builder.kernel(target.shape)
        loaded = g._load(k, value)
        if value.dtype is not target.dtype:
            loaded = k.cast(loaded, target.dtype)
        k.store(target.buffer, loaded, target.offset, target.strides, target.shape)


def _padded(g, x, padding, dtype):
    """``x`` (N, C, *spatial) zero-padded by ``padding`` on both sides of each spatial
    dimension, in ``dtype``: one temporary, written by a kernel per border slab and one
    for the interior (no element twice, so the writes need no order)."""
    if not any(padding):
        return x
    shape = x.shape[:2] + tuple(n + 2 * p for n, p in zip(x.shape[2:], padding))
    out = g._temp(dtype, shape)
    zero = zeros(g, dtype, ())
    # The slabs of dimension i cover the full extent of the dimensions after it and the
    # interior of those before it, so they tile the border exactly once.
    interior = [slice(None), slice(None)] + [slice(p, p + n) for n, p in
                                             zip(x.shape[2:], padding)]
    for i, (n, p) in enumerate(zip(x.shape[2:], padding)):
        if p:
            lead = tuple(interior[:2 + i])
            for side in (slice(0, p), slice(p + n, n + 2 * p)):
                _store(g, out[lead + (side,)], zero)
    _store(g, out[tuple(interior)], x)
    return out


def _windows(g, x, conv: _Conv, out, dtype):
    """The windows of ``x`` (N, C, *spatial) for output sizes ``out``: a view of shape (N,
    G, Cg, *kernel, *out) of the zero-padded input (in ``dtype`` where padded, else ``x``
    itself), element ``[n, g, c, k, o]`` at ``o * stride + k * dilation`` of channel ``g *
    Cg + c``. Made contiguous, it is im2col's matrix."""
    xp = _padded(g, x, conv.padding, dtype)
    n, c = x.shape[:2]
    cg = c // conv.groups
    sn, sc, *ss = xp.strides
    return xp._view(
        (n, conv.groups, cg, *conv.kernel, *out),
        (sn, cg * sc, sc, *(d * s for d, s in zip(conv.dilation, ss)),
         *(st * s for st, s in zip(conv.stride, ss))),
        xp.offset)


def _by_group(t, groups: int):
    """``t`` (N, G * Cg, *rest) viewed as (N, G, Cg, *rest)."""
    n, c, *rest = t.shape
    sn, sc, *ss = t.strides
    return t._view((n, groups, c // groups, *rest), (sn, c // groups * sc, sc, *ss), t.offset)


def _matrices(t, dims: int, dtype):
    """``t`` (..., *spatial) in ``dtype`` with its last ``dims`` dimensions as one: a copy
    only where its layout needs one (e.g. im2col's), so that products reach BLAS."""
    return cast(t, dtype).reshape(*t.shape[:t.ndim - dims], math.prod(t.shape[t.ndim - dims:]))


def _grouped(g, w, conv: _Conv, dtype):
    """The weight (O, Cg, *kernel) as (G, Og, Cg*K) in ``dtype``."""
    o, cg = w.shape[:2]
    return cast(w, dtype).reshape(conv.groups, o // conv.groups, cg * math.prod(conv.kernel))


#: The least product length (output positions) per sample for which a 1x1 convolution's
#: weight gradient is one product per sample and a sum, instead of one long product of
#: copied operands (shorter products pay more per call than the copies cost).
_PER_SAMPLE = 64


def _unfolded(conv: _Conv) -> bool:
    """Are the input's windows the input itself (a 1x1 kernel, stride 1, no padding)?"""
    return (all(k == 1 for k in conv.kernel) and all(s == 1 for s in conv.stride)
            and not any(conv.padding))


def _depthwise(conv: _Conv, cg: int) -> bool:
    """One input channel per group: the products would be as long as the kernel, too short
    for a GEMM to pay; these convolutions are multiplications and sums over windows."""
    return cg == 1 and conv.groups > 1


def _forward(g, x, w, conv: _Conv, out, dtype):
    """The convolution of ``x`` by ``w`` (no bias): (N, O, *out) in ``dtype``."""
    n = x.shape[0]
    o = w.shape[0]
    dims = len(out)
    if n == 0:
        return zeros(g, dtype, (0, o, *out))
    windows = _windows(g, x, conv, out, dtype)  # (N, G, Cg, *kernel, *out)
    if _depthwise(conv, w.shape[1]):
        # out[n, g, j, o] = sum_k w[g, j, k] window[n, g, o, k], for j < O / G
        m = o // conv.groups
        windows = windows.permute(0, 1, 2, *range(3 + dims, 3 + 2 * dims),
                                  *range(3, 3 + dims))
        windows = windows.broadcast_to((n, conv.groups, m, *out, *conv.kernel))
        weight = _grouped(g, w, conv, dtype).reshape(conv.groups, m, *(1,) * dims,
                                                     *conv.kernel)
        total = g.sum(cast(windows, dtype) * weight, tuple(range(3 + dims, 3 + 2 * dims)))
        return total.reshape(n, o, *out)
    # one GEMM per sample and group: weight (Og, Cg*K) @ columns (Cg*K, out), written as
    # the output's (N, O, out) layout; the columns are copied unless the input's layout
    # is theirs already (a 1x1 kernel at stride 1 without padding)
    cols = _matrices(windows, dims, dtype).reshape(n, conv.groups, -1, math.prod(out))
    product = g.matmul(_grouped(g, w, conv, dtype), cols)
    return product.reshape(n, o, *out)


def _weight_grad(g, x, grad_out, conv: _Conv, dtype):
    """The gradient of the weight (O, Cg, *kernel) of a convolution of ``x`` whose output
    has gradient ``grad_out``, in ``dtype``."""
    n, o, *out = grad_out.shape
    dims = len(out)
    groups = conv.groups
    cg = x.shape[1] // groups
    if n == 0:
        return zeros(g, dtype, (o, cg, *conv.kernel))
    windows = _windows(g, x, conv, out, dtype)  # (N, G, Cg, *kernel, *out)
    if _depthwise(conv, cg):
        # dw[g, j, k] = sum_{n, o} grad_out[n, g, j, o] window[n, g, o, k]
        m = o // groups
        windows = windows.permute(0, 1, 2, *range(3 + dims, 3 + 2 * dims),
                                  *range(3, 3 + dims))
        windows = windows.broadcast_to((n, groups, m, *out, *conv.kernel))
        dy = _by_group(grad_out, groups).reshape(n, groups, m, *out, *(1,) * dims)
        total = g.sum(cast(windows, dtype) * cast(dy, dtype),
                      (0, *range(3, 3 + dims)))
        return total.reshape(o, 1, *conv.kernel)
    if _unfolded(conv) and n > 1 and math.prod(out) >= _PER_SAMPLE:
        # a 1x1 kernel at stride 1 without padding: the columns are the input itself, so
        # one product per sample and group, (Og, out) @ (out, Cg), summed over the
        # samples, copies neither operand (the single product below copies both)
        p = math.prod(out)
        dy = cast(_by_group(grad_out, groups).reshape(n, groups, o // groups, p), dtype)
        cols = cast(windows.reshape(n, groups, cg, p), dtype)
        return g.sum(g.matmul(dy, cols.permute(0, 1, 3, 2)), (0,)).reshape(
            o, cg, *conv.kernel)
    # (G, Og, N*out) @ (G, N*out, Cg*K): both operands copied into those layouts
    dy = _by_group(grad_out, groups).permute(1, 2, 0, *range(3, 3 + dims))
    dy = _matrices(dy, dims + 1, dtype)
    cols = windows.permute(1, 2, *range(3, 3 + dims), 0, *range(3 + dims, 3 + 2 * dims))
    cols = _matrices(cols, dims + 1, dtype).reshape(groups, -1, n * math.prod(out))
    return g.matmul(dy, cols.permute(0, 2, 1)).reshape(o, cg, *conv.kernel)


def _input_grad(g, grad_out, w, conv: _Conv, sizes, dtype):
    """The gradient of the input (N, C, *sizes) of a convolution by ``w`` whose output has
    gradient ``grad_out``, in ``dtype``: the columns' gradient, then col2im (one
    scatter-add into the padded input; windows overlap where the stride is below the
    dilated kernel)."""
    n, o, *out = grad_out.shape
    dims = len(out)
    groups = conv.groups
    cg = w.shape[1]
    if n == 0:
        return zeros(g, dtype, (0, groups * cg, *sizes))
    full = replace(conv, padding=tuple(d * (k - 1) - p for k, p, d in zip(
        conv.kernel, conv.padding, conv.dilation)))
    if conv.stride == (1,) * dims and min(full.padding) >= 0 and \
            full.out_sizes(out) == tuple(sizes):
        # At stride 1 the gradient is the "full" convolution of grad_out by the weight
        # flipped in space, its channel axes swapped within each group: a forward
        # convolution, with no scatter.
        grouped = w._view((groups, o // groups, cg, *conv.kernel),
                          (o // groups * w.strides[0], *w.strides), w.offset)
        flipped = grouped.permute(0, 2, 1, *range(3, 3 + dims))[
            (slice(None),) * 3 + (slice(None, None, -1),) * dims]
        flipped = flipped.reshape(groups * cg, o // groups, *conv.kernel)
        return _forward(g, grad_out, flipped, full, tuple(sizes), dtype)
    dy = _by_group(grad_out, groups)  # (N, G, Og, *out)
    if _depthwise(conv, cg):
        # dcols[n, g, 0, k, o] = sum_j w[g, j, k] grad_out[n, g, j, o]
        m = o // groups
        weight = _grouped(g, w, conv, dtype).permute(0, 2, 1)  # (G, K, m)
        weight = weight.reshape(groups, 1, *conv.kernel, *(1,) * dims, m)
        dy = dy.permute(0, 1, *range(3, 3 + dims), 2)
        dy = dy._view((n, groups, 1, *(1,) * dims, *out, m),
                      (*dy.strides[:2], 0, *(0,) * dims, *dy.strides[2:]), dy.offset)
        cols = cast(dy, dtype) * weight
        cols = g.sum(cols, cols.ndim - 1) if m > 1 else cols.reshape(*cols.shape[:-1])
    else:
        # one GEMM per sample and group: weight^T (Cg*K, Og) @ grad_out (Og, out)
        weight = _grouped(g, w, conv, dtype).permute(0, 2, 1)
        cols = g.matmul(weight, _matrices(dy, dims, dtype))
        cols = cols.reshape(n, groups, cg, *conv.kernel, *out)
    if conv.kernel == (1,) * dims and conv.stride == (1,) * dims and not any(conv.padding):
        return cols.reshape(n, groups * cg, *sizes)  # each window is one input element
    padded = tuple(s + 2 * p for s, p in zip(sizes, conv.padding))
    coords = []
    for i in range(dims):
        # o * stride + k * dilation, k at axis 3 + i and o at axis 3 + dims + i
        k = g.binary("mul", g.arange(conv.kernel[i]), conv.dilation[i])
        o = g.binary("mul", g.arange(out[i]), conv.stride[i])
        k = k.reshape(conv.kernel[i], *(1,) * (2 * dims - 1 - i))
        o = o.reshape(out[i], *(1,) * (dims - 1 - i))
        coords.append(k + o)
    target = zeros(g, dtype, (n, groups, cg, *padded))
    summed = g.scatter(target, (0, 1, 2, *coords), cols, cols.shape, mode="add")
    summed = summed.reshape(n, groups * cg, *padded)
    return summed[(slice(None), slice(None))
                  + tuple(slice(p, p + s) for s, p in zip(sizes, conv.padding))]


def _bias_grad(g, grad_out, dtype):
    return g.sum(cast(grad_out, dtype), (0, *range(2, grad_out.ndim)))


@register(aten.convolution.default)
def convolution(g, input, weight, bias, stride, padding, dilation, transposed,
                output_padding, groups):
    conv, out = _geometry(input, weight, stride, padding, dilation, transposed,
                          output_padding, groups)
    dtype = input.dtype
    acc = opmath(dtype)
    channels = _out_channels(weight, transposed, conv.groups)
    if bias is not None and (bias.dtype is not dtype or bias.shape != (channels,)):
        raise Unsupported("a bias of another dtype or shape")  # torch raises
    if transposed:
        result = _input_grad(g, input, weight, conv, out, acc)
    else:
        result = _forward(g, input, weight, conv, out, acc)
    if bias is not None:
        result = result + cast(bias, acc).reshape(channels, *(1,) * len(out))
    return cast(result, dtype)


@register(aten.convolution_backward.default)
def convolution_backward(g, grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    """(grad_input, grad_weight, grad_bias), None where ``output_mask`` is off."""
    conv, out = _geometry(input, weight, stride, padding, dilation, transposed,
                          output_padding, groups)
    dtype = input.dtype
    acc = opmath(dtype)
    channels = _out_channels(weight, transposed, conv.groups)
    if grad_output.dtype is not dtype or grad_output.shape != (input.shape[0], channels, *out):
        raise Unsupported("a grad_output of another dtype or shape")  # torch raises
    results: list = [None, None, None]
    if output_mask[0]:
        if transposed:
            dx = _forward(g, grad_output, weight, conv, input.shape[2:], acc)
        else:
            dx = _input_grad(g, grad_output, weight, conv, input.shape[2:], acc)
        results[0] = cast(dx, dtype)
    if output_mask[1]:
        if transposed:
            dw = _weight_grad(g, grad_output, input, conv, acc)
        else:
            dw = _weight_grad(g, input, grad_output, conv, acc)
        results[1] = cast(dw, dtype)
    if output_mask[2]:
        results[2] = cast(_bias_grad(g, grad_output, acc), dtype)
    return tuple(results)
