"""Convolutions: ``convolution`` and ``convolution_backward``, 1-3 spatial dimensions, any
stride, padding, dilation and groups, transposed or not.

A convolution is a product with the input's columns (im2col): the input, zero-padded into
a temporary, is read through a strided view of shape ``(G, Cg, *kernel, N, *out)`` (one
window element per kernel offset and output position) and copied contiguously, so that
``weight (G, Og, Cg*K) @ columns (G, Cg*K, N*out)`` is one batched GEMM that the CPU
backend hands to BLAS. Its gradients are products too: the weight's is ``grad_out (G, Og,
N*out) @ columns^T``, the input's is ``weight^T @ grad_out`` (the columns' gradient) added
back into the padded input's positions by one scatter-add (col2im), the padding sliced
off. A transposed convolution's forward is that input gradient; its own input gradient is
the forward convolution of ``grad_out``, its weight gradient the weight gradient with the
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
from dataclasses import dataclass

from hologram.isa import dtypes as dt
from hologram_torch.lowering.common import Unsupported, aten, cast, opmath, register

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


def _zeros(g, dtype, shape):
    return cast(g.arange(1), dtype)[0].broadcast_to(tuple(shape))


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
    zero = _zeros(g, dtype, ())
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


def _columns(g, x, conv: _Conv, out, dtype):
    """The im2col matrix of ``x`` (N, C, *spatial) for output sizes ``out``: contiguous
    (G, Cg*K, N*out) in ``dtype``, element ``[g, (c, k), (n, o)]`` the padded input at
    ``o * stride + k * dilation`` of channel ``g * Cg + c`` of sample ``n``."""
    xp = _padded(g, x, conv.padding, dtype)
    n, c = x.shape[:2]
    cg = c // conv.groups
    sn, sc, *ss = xp.strides
    view = xp._view(
        (conv.groups, cg, *conv.kernel, n, *out),
        (cg * sc, sc, *(d * s for d, s in zip(conv.dilation, ss)), sn,
         *(st * s for st, s in zip(conv.stride, ss))),
        xp.offset)
    cols = g.copy(view) if view.dtype is dtype else g.cast(view, dtype)
    return cols.reshape(conv.groups, cg * math.prod(conv.kernel), n * math.prod(out))


def _grouped(g, w, conv: _Conv, dtype):
    """The weight (O, Cg, *kernel) as (G, Og, Cg*K) in ``dtype``."""
    o, cg = w.shape[:2]
    return cast(w, dtype).reshape(conv.groups, o // conv.groups, cg * math.prod(conv.kernel))


def _grouped_grad(g, grad_out, groups: int, dtype):
    """``grad_out`` (N, O, *out) as contiguous (G, Og, N*out) in ``dtype``."""
    n, o, *out = grad_out.shape
    sn, so, *ss = grad_out.strides
    view = grad_out._view((groups, o // groups, n, *out), (o // groups * so, so, sn, *ss),
                          grad_out.offset)
    rows = g.copy(view) if view.dtype is dtype else g.cast(view, dtype)
    return rows.reshape(groups, o // groups, n * math.prod(out))


def _forward(g, x, w, conv: _Conv, out, dtype):
    """The convolution of ``x`` by ``w`` (no bias): (N, O, *out) in ``dtype``."""
    n = x.shape[0]
    o = w.shape[0]
    if n == 0:
        return _zeros(g, dtype, (0, o, *out))
    product = g.matmul(_grouped(g, w, conv, dtype), _columns(g, x, conv, out, dtype))
    # (G, Og, N, *out) read as (N, G*Og, *out): G and Og merge into one stride
    size = math.prod(out)
    spatial = tuple(math.prod(out[i + 1:]) for i in range(len(out)))
    return product._view((n, o, *out), (size, n * size, *spatial), product.offset)


def _weight_grad(g, x, grad_out, conv: _Conv, dtype):
    """The gradient of the weight (O, Cg, *kernel) of a convolution of ``x`` whose output
    has gradient ``grad_out``, in ``dtype``."""
    o = grad_out.shape[1]
    cg = x.shape[1] // conv.groups
    if x.shape[0] == 0:
        return _zeros(g, dtype, (o, cg, *conv.kernel))
    cols = _columns(g, x, conv, grad_out.shape[2:], dtype)
    product = g.matmul(_grouped_grad(g, grad_out, conv.groups, dtype), cols.permute(0, 2, 1))
    return product.reshape(o, cg, *conv.kernel)


def _input_grad(g, grad_out, w, conv: _Conv, sizes, dtype):
    """The gradient of the input (N, C, *sizes) of a convolution by ``w`` whose output has
    gradient ``grad_out``, in ``dtype``: the columns' gradient, then col2im (one
    scatter-add into the padded input; windows overlap where the stride is below the
    dilated kernel)."""
    n, _, *out = grad_out.shape
    groups = conv.groups
    cg = w.shape[1]
    if n == 0:
        return _zeros(g, dtype, (0, groups * cg, *sizes))
    weight = _grouped(g, w, conv, dtype).permute(0, 2, 1)
    cols = g.matmul(weight, _grouped_grad(g, grad_out, groups, dtype))
    dims = len(sizes)
    shape = (groups, cg, *conv.kernel, n, *out)
    cols = cols.reshape(*shape)
    padded = tuple(s + 2 * p for s, p in zip(sizes, conv.padding))
    coords = []
    for i in range(dims):
        # o * stride + k * dilation, k at axis 2 + i and o at axis 3 + dims + i
        k = g.binary("mul", g.arange(conv.kernel[i]), conv.dilation[i])
        o = g.binary("mul", g.arange(out[i]), conv.stride[i])
        k = k.reshape(conv.kernel[i], *(1,) * (dims - 1 - i + 1 + dims))
        o = o.reshape(out[i], *(1,) * (dims - 1 - i))
        coords.append(k + o)
    target = _zeros(g, dtype, (n, groups, cg, *padded))
    summed = g.scatter(target, (2 + dims, 0, 1, *coords), cols, shape, mode="add")
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
