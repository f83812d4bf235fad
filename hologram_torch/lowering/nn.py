"""Neural-network ops: softmax and log-softmax (and their backward), losses (MSE, negative
log-likelihood, binary cross-entropy with and without logits, smooth L1, Huber) with their
backward, layer normalization, embedding lookups and their gradient, dropout's backward.

Arithmetic runs in opmath (float32 for half types) and results take torch's dtypes; where
torch's CPU kernel stores a half-type intermediate, the lowering rounds it too
(:func:`_rounded`), so half results agree to the last bits that matter.

An embedding lookup and a class in ``nll_loss`` (its forward) are the ISA's ``gather``:
each output element reads its own element, O(indices x width). The embedding's gradient
(a sum per row of the table over the indices that name it) is the ISA's ``scatter``
adding rows in index order, O(indices x width + table). ``nll_loss``'s backward, dense
over [N, C] anyway, compares an ``arange`` of the classes with the target (O(N x C), the
size of its result). Torch's checks
of index *values* (targets and embedding indices in range, BCE probabilities in [0, 1])
are not part of a lowering: the eager device makes them on the host first; here an
out-of-range index selects nothing (its loss term is 0) or, in an embedding, reads the
gather's clamped element.
"""

from __future__ import annotations

import math

import torch

from hologram.frontend import functional
from hologram.frontend.graph import broadcast_shapes
from hologram.isa import dtypes as dt
from hologram_torch.lowering.common import (
    TORCH,
    Tensor,
    Unsupported,
    aten,
    cast,
    isa,
    opmath,
    register,
    zeros,
)

NONE, MEAN = 0, 1  # at::Reduction (2 is sum)


def _floats(*values) -> None:
    """Every (optional) value is a float tensor or a number (:class:`Unsupported` if not)."""
    for v in values:
        if hasattr(v, "dtype") and not v.dtype.is_float:
            raise Unsupported(f"a {v.dtype} operand where torch takes floats")


def _or(t, neutral: float):
    """An optional tensor (a weight, a bias) or the number that leaves the formula as is."""
    return neutral if t is None else t


def _reduce(g, loss, reduction: int):
    """at::apply_loss_reduction: elementwise, sum, or mean (NaN for an empty mean)."""
    if reduction not in (0, 1, 2):
        raise Unsupported(f"reduction {reduction}")  # torch raises
    if reduction == NONE:
        return loss
    total = g.reduce("sum", loss, None)
    return total / math.prod(loss.shape) if reduction == MEAN else total


def _loss_scale(reduction: int, numel: int) -> float:
    """The factor a loss gradient carries: 1/n for a mean."""
    return 1.0 / numel if reduction == MEAN and numel else 1.0


def _rounded(t, dtype):
    """``t`` (in opmath) rounded to ``dtype`` and back: where torch's CPU kernels compute a
    half-type step in float32 and store it as half, the next step sees the rounding."""
    if not isinstance(t, Tensor):
        return t
    return cast(cast(t, dtype), t.dtype)


def pick(g, table, index, axis: int):
    """``table`` at ``index`` along ``axis`` (negative: counted from the end), a gather:
    ``index`` broadcasts against ``table`` with a size-1 ``axis`` (aligned from the
    right), and the result drops ``axis``. O(result) work. An index out of range reads
    the gather's clamped element: callers mask what they must ignore."""
    rank = max(table.ndim, index.ndim)
    table, index = table._aligned(rank), index._aligned(rank)
    axis %= rank
    shape = broadcast_shapes([table.shape[:axis] + (1,) + table.shape[axis + 1:],
                              index.shape])
    shape = shape[:axis] + shape[axis + 1:]
    drop = [d for d in range(rank) if d != axis]
    at = index._view(tuple(index.shape[d] for d in drop),
                     tuple(index.strides[d] for d in drop), index.offset)
    coords = tuple(at if d == axis else d - (d > axis) for d in range(rank))
    return g.gather(table, coords, shape)


def _axis(x, dim: int) -> int:
    """``dim`` wrapped into range (a 0-d tensor has one axis, as in torch)."""
    rank = max(x.ndim, 1)
    if not -rank <= dim < rank:
        raise Unsupported(f"dim {dim} out of range")  # torch raises
    return dim % rank


# --- softmax ------------------------------------------------------------------------------

def _rows(*tensors):
    """0-d tensors as one-element rows: the ISA reduces over an existing axis."""
    return tuple(t.reshape(1) if t.ndim == 0 else t for t in tensors)


def _softmax(log: bool):
    def softmax(g, self, dim, half_to_float=False):
        axis = _axis(self, dim)
        _floats(self)
        # half_to_float is torch's CUDA-only fused cast: the CPU kernel raises for it.
        if half_to_float and self.dtype is not dt.float16:
            raise Unsupported("half_to_float of a non-half tensor")
        out = dt.float32 if half_to_float else self.dtype
        (y,) = _rows(cast(self, opmath(self.dtype)))
        y = (functional.log_softmax if log else functional.softmax)(y, axis)
        return cast(y.reshape(*self.shape), out)

    def backward(g, grad_output, output, dim, input_dtype):
        axis = _axis(grad_output, dim)
        _floats(grad_output, output)
        if grad_output.shape != output.shape:
            raise Unsupported("gradient and output shapes differ")
        acc = opmath(grad_output.dtype)
        dy, y = _rows(cast(grad_output, acc), cast(output, acc))
        if log:  # d/dx log_softmax: g - exp(y) * sum(g)
            r = dy - g.unary("exp", y) * g.reduce("sum", dy, axis, True)
        else:  # d/dx softmax: y * (g - sum(g * y))
            r = y * (dy - g.reduce("sum", dy * y, axis, True))
        return cast(r.reshape(*grad_output.shape), isa(input_dtype))

    return softmax, backward


softmax, softmax_backward = _softmax(False)
log_softmax, log_softmax_backward = _softmax(True)
register(aten._softmax.default)(softmax)
register(aten._softmax_backward_data.default)(softmax_backward)
register(aten._log_softmax.default)(log_softmax)
register(aten._log_softmax_backward_data.default)(log_softmax_backward)


@register(aten.softmax.int)
def softmax_int(g, self, dim, dtype=None):
    """``softmax.int`` (torch.compile sees it before decomposition): in ``dtype`` if given."""
    return softmax(g, self if dtype is None else cast(self, isa(dtype)), dim)


@register(aten.log_softmax.int)
def log_softmax_int(g, self, dim, dtype=None):
    return log_softmax(g, self if dtype is None else cast(self, isa(dtype)), dim)


@register(aten._safe_softmax.default)
def safe_softmax(g, self, dim, dtype=None):
    """Softmax whose rows of only ``-inf`` are zeros, not NaN (attention's fully masked
    rows): one program, where torch's kernel is four ops."""
    y = softmax_int(g, self, dim, dtype)
    axis = _axis(self, dim)
    (x,) = _rows(self)
    masked = g.reduce("min", cast(g.binary("eq", x, -math.inf), dt.int32), axis, True)
    y = g.where(g.binary("eq", masked, 1), 0.0, y.reshape(*x.shape))
    return y.reshape(*self.shape)


# --- pointwise losses ---------------------------------------------------------------------
# Each loss is f(d) of d = input - target and a parameter, and its gradient f'(d); the
# comparisons are torch's own (strict in the forward, inclusive in the backward). ``r``
# rounds to the tensor's dtype where torch's CPU kernel stores a half-type intermediate
# (only mse_loss's difference: the others compute wholly in float32).

def _mse(g, d, _, r):
    d = r(d)
    return d * d


def _mse_grad(g, d, _):
    return d * 2.0


def _smooth_l1(g, d, beta, r):
    z = abs(d)
    return g.where(g.binary("lt", z, beta), 0.5 * z * z / beta, z - 0.5 * beta)


def _smooth_l1_grad(g, d, beta):
    inner = g.where(g.binary("ge", d, beta), 1.0, d / beta)
    return g.where(g.binary("le", d, -beta), -1.0, inner)


def _huber(g, d, delta, r):
    z = abs(d)
    return g.where(g.binary("lt", z, delta), 0.5 * z * z, delta * (z - 0.5 * delta))


def _huber_grad(g, d, delta):
    inner = g.where(g.binary("ge", d, delta), delta, d)
    return g.where(g.binary("le", d, -delta), -delta, inner)


def _pointwise_loss(kind: str, fn, grad_fn, default: float, valid):
    """``kind`` and its backward; ``default`` is the parameter (beta, delta) when the call
    leaves it out; ``valid`` says which parameters torch accepts."""

    def param_of(param) -> float:
        value = float(param) if param is not None else default
        if not valid(value):
            raise Unsupported(f"{kind} parameter {value}")  # torch raises
        return value

    @register(getattr(aten, kind).default)
    def loss(g, self, target, reduction=MEAN, param=None):
        _floats(self, target)
        value = param_of(param)
        out = isa(torch.promote_types(TORCH[self.dtype], TORCH[target.dtype]))
        acc = opmath(out)

        def r(v):
            return _rounded(v, out)

        d = cast(self, acc) - cast(target, acc)
        return cast(_reduce(g, r(fn(g, d, value, r)), reduction), out)

    @register(getattr(aten, f"{kind}_backward").default)
    def backward(g, grad_output, self, target, reduction, param=None):
        _floats(grad_output, self, target)
        value = param_of(param)
        acc = opmath(self.dtype)
        d = cast(self, acc) - cast(target, acc)
        r = grad_fn(g, d, value) * cast(grad_output, acc) * _loss_scale(
            reduction, math.prod(self.shape))
        return cast(r.broadcast_to(self.shape), self.dtype)

    return loss, backward


mse_loss, mse_loss_backward = _pointwise_loss("mse_loss", _mse, _mse_grad, 0.0,
                                              lambda _: True)
smooth_l1_loss, smooth_l1_loss_backward = _pointwise_loss(
    "smooth_l1_loss", _smooth_l1, _smooth_l1_grad, 1.0, lambda beta: beta >= 0)
huber_loss, huber_loss_backward = _pointwise_loss("huber_loss", _huber, _huber_grad, 1.0,
                                                  lambda delta: delta > 0)


# --- binary cross-entropy -----------------------------------------------------------------

@register(aten.binary_cross_entropy.default)
def binary_cross_entropy(g, self, target, weight=None, reduction=MEAN):
    _floats(self, target, weight)
    if self.shape != target.shape:
        raise Unsupported("input and target shapes differ")  # torch raises
    acc = opmath(self.dtype)
    x, t = cast(self, acc), cast(target, acc)
    log_p = g.maximum(g.unary("log", x), -100.0)  # torch clamps the logarithms at -100
    log_q = g.maximum(g.unary("log1p", -x), -100.0)
    loss = (t - 1.0) * log_q - t * log_p
    return cast(_reduce(g, loss * cast(_or(weight, 1.0), acc), reduction), self.dtype)


@register(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(g, grad_output, self, target, weight=None, reduction=MEAN):
    _floats(grad_output, self, target, weight)
    acc = opmath(self.dtype)
    x, t = cast(self, acc), cast(target, acc)
    r = (x - t) / g.maximum((1.0 - x) * x, 1e-12) * cast(grad_output, acc) \
        * cast(_or(weight, 1.0), acc)
    scale = _loss_scale(reduction, math.prod(self.shape))
    return cast((r * scale).broadcast_to(self.shape), self.dtype)


@register(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(g, self, target, weight=None, pos_weight=None,
                                     reduction=MEAN):
    """torch's form: (1 - t) x - log_sigmoid(x) (1 + (pos_weight - 1) t), times weight."""
    _floats(self, target, weight, pos_weight)
    out = isa(torch.promote_types(TORCH[self.dtype], TORCH[target.dtype]))
    acc = opmath(out)
    x, t = cast(self, acc), cast(target, acc)

    def r(v):  # torch runs this op by op: each step is rounded to the tensor dtype
        return _rounded(v, out)

    log_sigmoid = r(g.minimum(x, 0.0) - g.unary("log1p", g.unary("exp", -abs(x))))
    log_weight = r(r(r(cast(_or(pos_weight, 1.0), acc) - 1.0) * t) + 1.0)
    loss = r(r(r(1.0 - t) * x) - r(log_sigmoid * log_weight))
    return cast(_reduce(g, r(loss * cast(_or(weight, 1.0), acc)), reduction), out)


# --- negative log-likelihood --------------------------------------------------------------
# input [N, C, *rest] (or [C]), target [N, *rest] (or []): the class axis is 1 (or 0).
# Sums accumulate in float32 for half types; torch's CPU nll_loss2d accumulates half
# inputs in half (a cascade of sequential partial sums), so its float16 sums can differ
# from these (closer to exact) ones by a few half ulps.

def _nll_check(x, target, weight, reduction) -> None:
    _floats(x, weight)
    if target.dtype is not dt.int64 or reduction not in (0, 1, 2) or x.ndim < 1:
        raise Unsupported("nll_loss arguments torch rejects")
    axis = min(x.ndim, 2) - 1
    if tuple(target.shape) != tuple(x.shape[:axis] + x.shape[axis + 1:]):
        raise Unsupported("target shape")  # torch raises
    if weight is not None and tuple(weight.shape) != (x.shape[axis],):
        raise Unsupported("weight shape")  # torch raises


def _nll_parts(g, x, target, weight, ignore_index):
    """(target with a unit class axis, is-valid per target, weight per target)."""
    axis = min(x.ndim, 2) - 1
    t = cast(target, dt.int64)
    tk = t.reshape(*t.shape[:axis], 1, *t.shape[axis:]) if x.ndim > 1 else t
    valid = g.binary("ne", t, ignore_index)
    if weight is None:
        return tk, valid, cast(valid, opmath(x.dtype))
    w = cast(weight, opmath(x.dtype))
    if w.ndim:  # a class-weight vector: weight[target]
        w = pick(g, w, t.reshape(*t.shape, 1), -1)
    return tk, valid, g.where(valid, w, 0.0)


@register(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(g, self, target, weight, reduction, ignore_index):
    _nll_check(self, target, weight, reduction)
    x = self
    tk, valid, w = _nll_parts(g, x, target, weight, ignore_index)
    picked = pick(g, cast(x, opmath(x.dtype)), tk, min(x.ndim, 2) - 1 - x.ndim)
    loss = g.where(valid, -_rounded(w * picked, x.dtype), 0.0)
    total_weight = g.reduce("sum", w, None)
    if reduction == NONE:
        if x.ndim > 1:  # torch leaves total_weight 0 here (but not for a single sample)
            total_weight = g.arange(1).reshape()
        return cast(loss, x.dtype), cast(total_weight, x.dtype)
    total = g.reduce("sum", loss, None)
    if reduction == MEAN:
        total = total / total_weight
    return cast(total, x.dtype), cast(total_weight, x.dtype)


@register(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(g, grad_output, self, target, weight, reduction, ignore_index,
                      total_weight):
    _nll_check(self, target, weight, reduction)
    _floats(grad_output)
    x = self
    acc = opmath(x.dtype)
    tk, valid, w = _nll_parts(g, x, target, weight, ignore_index)
    coef = -(w * cast(grad_output, acc))
    if reduction == MEAN:
        coef = coef / cast(total_weight, acc)
    coef = g.where(valid, coef, 0.0)
    axis = min(x.ndim, 2) - 1
    n = x.shape[axis]
    classes = g.arange(n, dt.int64).reshape(n, *(1,) * (x.ndim - axis - 1))
    if x.ndim > 1:
        coef = coef.reshape(*tk.shape)
    hit = g.binary("eq", classes, tk)
    return cast(g.where(hit, coef, 0.0).broadcast_to(x.shape), x.dtype)


# --- layer normalization ------------------------------------------------------------------

def _layer_norm_check(x, normalized_shape, weight, bias) -> int:
    k = len(normalized_shape)
    shape = tuple(normalized_shape)
    _floats(x, weight, bias)
    if not (0 < k <= x.ndim and tuple(x.shape[x.ndim - k:]) == shape
            and all(p is None or tuple(p.shape) == shape for p in (weight, bias))
            and math.prod(shape) > 0):
        raise Unsupported("layer_norm shapes")  # torch raises (or an empty normalization)
    return k


def stats_dtype(x, weight) -> dt.DType:
    """at::native's param_scalar_type: float32 statistics for half input with float32
    parameters (mixed precision), else the input's dtype."""
    mixed = weight is not None and weight.dtype is dt.float32 and x.dtype in (
        dt.float16, dt.bfloat16)
    return dt.float32 if mixed else x.dtype


@register(aten.native_layer_norm.default)
def native_layer_norm(g, input, normalized_shape, weight, bias, eps):
    """(normalized, mean, rstd): statistics with the normalized dimensions kept as 1."""
    k = _layer_norm_check(input, normalized_shape, weight, bias)
    x = input
    acc = opmath(x.dtype)
    axes = tuple(range(x.ndim - k, x.ndim))
    xo = cast(x, acc)
    count = math.prod(x.shape[d] for d in axes)
    mean = g.reduce("sum", xo, axes, True) / count
    d = xo - mean
    rstd = 1.0 / g.unary("sqrt", g.reduce("sum", d * d, axes, True) / count + float(eps))
    y = d * rstd * cast(_or(weight, 1.0), acc) + cast(_or(bias, 0.0), acc)
    stats = stats_dtype(x, weight)
    return cast(y, x.dtype), cast(mean, stats), cast(rstd, stats)


@register(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(g, grad_out, input, normalized_shape, mean, rstd, weight,
                               bias, output_mask):
    """(grad_input, grad_weight, grad_bias), None where ``output_mask`` is off or the
    parameter is absent."""
    k = _layer_norm_check(input, normalized_shape, weight, bias)
    x = input
    lead_count = math.prod(x.shape[:x.ndim - k])
    if (grad_out.shape != x.shape or math.prod(mean.shape) != lead_count
            or math.prod(rstd.shape) != lead_count):
        raise Unsupported("layer_norm_backward shapes")
    _floats(grad_out, mean, rstd)
    mask = (bool(output_mask[0]), bool(output_mask[1]) and weight is not None,
            bool(output_mask[2]) and bias is not None)
    acc = opmath(x.dtype)
    axes = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    stats = x.shape[:x.ndim - k] + (1,) * k
    mean, rstd = cast(mean, acc).reshape(*stats), cast(rstd, acc).reshape(*stats)
    dy, xo = cast(grad_out, acc), cast(x, acc)
    w = cast(_or(weight, 1.0), acc)
    # x̂ as torch's CPU kernel rounds it: fma(x, a, b), a = rstd, b = -a mean (with a
    # near-zero variance the residue of b's rounding is what dweight sees).
    xhat = g.fma(xo, rstd, -(rstd * mean))
    count = math.prod(x.shape[d] for d in axes)
    results: list = [None, None, None]
    if mask[0]:
        # torch's CPU formula (dx = rstd w dy + b x + c), not the textbook one: with a
        # near-zero variance rstd is huge and the rounding of the cancellations shows.
        wdy = dy * w
        ds = g.reduce("sum", wdy * xo, axes, True)
        db = g.reduce("sum", wdy, axes, True)
        # (db mean - ds) is contracted to an fma in torch's build: its residue matters.
        b = g.fma(db, mean, -ds) * rstd * rstd * rstd * (1.0 / count)
        c = -b * mean - db * rstd * (1.0 / count)
        results[0] = cast(rstd * dy * w + b * xo + c, x.dtype)

    # Over the leading dimensions; none when x is all normalized (() would reduce all).
    def lead_sum(v):
        return g.reduce("sum", v, lead) if lead else v

    if mask[1]:
        results[1] = cast(lead_sum(dy * xhat), weight.dtype)
    if mask[2]:
        results[2] = cast(lead_sum(dy), bias.dtype)
    return tuple(results)


# --- embedding ----------------------------------------------------------------------------

@register(aten.embedding.default)
def embedding(g, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """weight[indices]: a gather of rows, O(indices x D)."""
    if weight.ndim != 2 or indices.dtype not in (dt.int64, dt.int32):
        raise Unsupported("embedding arguments")
    rows = indices._view(indices.shape + (1,), indices.strides + (0,), indices.offset)
    return g.gather(weight, (rows, indices.ndim), indices.shape + (weight.shape[1],))


@register(aten.embedding_dense_backward.default)
def embedding_dense_backward(g, grad_output, indices, num_weights, padding_idx,
                             scale_grad_by_freq):
    """grad_weight[v] = the grad rows whose index is v (not padding_idx) added in index
    order into zeros, in the grad's dtype (torch's CPU loop): one ISA scatter-add of rows,
    O(N·D + V·D) for N indices, V rows, D features. With ``scale_grad_by_freq`` each row
    is scaled by one over its index's count (a scatter-add of ones, then a gather)."""
    _floats(grad_output)
    if (indices.dtype not in (dt.int64, dt.int32) or grad_output.ndim == 0
            or tuple(grad_output.shape[:-1]) != tuple(indices.shape)):
        raise Unsupported("embedding_dense_backward arguments")
    rows, t = int(num_weights), grad_output.dtype
    n, width = math.prod(indices.shape), grad_output.shape[-1]
    table = zeros(g, t, (rows, width))
    if n == 0:
        return g.copy(table)
    idx = cast(indices, dt.int64).reshape(n, 1)
    dy = grad_output.reshape(n, width)
    if scale_grad_by_freq:  # torch: alpha = 1.0 / count (a double) per row
        counts = g.scatter(cast(table[:, 0], dt.int64), (idx,), 1, (n, 1), "add")
        scale = 1.0 / cast(g.gather(counts, (idx,), (n, 1)), dt.float64)
        dy = cast(cast(dy, opmath(t)) * cast(scale, opmath(t)), t)
    dy = g.where(g.binary("ne", idx, int(padding_idx)), dy, 0.0)
    return g.scatter(table, (idx, 1), dy, (n, width), "add")


# --- dropout (the backward: the forward draws its mask, an eager op) -----------------------

@register(aten.native_dropout_backward.default)
def native_dropout_backward(g, grad_output, mask, scale):
    _floats(grad_output)
    acc = opmath(grad_output.dtype)
    return cast(cast(grad_output, acc) * cast(mask, acc) * cast(scale, acc),
                grad_output.dtype)
