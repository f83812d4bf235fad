"""Neural-network kernels: softmax and log-softmax (and their backward), losses (MSE,
negative log-likelihood, binary cross-entropy with and without logits, smooth L1, Huber)
with their backward, layer normalization, embedding lookups and dropout.

Arithmetic runs in :func:`program.opmath` (float32 for half types) and results take
torch's dtypes; where torch's CPU kernel stores a half-type intermediate, the kernel here
rounds it too (:func:`_rounded`), so half results agree to the last bits that matter.
Composite ops need no kernel: ``cross_entropy`` is ``_log_softmax`` + ``nll_loss_forward``
(``nll_loss2d_forward`` for K-dimensional inputs), ``l1_loss`` is ``sub``/``abs``/``mean``,
and the backward of ``binary_cross_entropy_with_logits`` is elementwise ops.

The ISA has no gather or indexed load, so every lookup by index (a class in
``nll_loss``, a row in ``embedding``) is a one-hot formulation: compare an ``arange``
with the index, ``select`` the matching value (the others become -0.0, the identity of
the sum), and reduce. That costs O(indices x table) work instead of O(indices), and is
exact, NaN and infinities in unselected entries included. Index values that torch checks
(out of range targets and embedding indices, probabilities outside [0, 1]) are checked
on the host, through a CPU alias of the device memory: a failing check sends the call to
the CPU fallback, which raises torch's own error.
"""

from __future__ import annotations

import math

import torch

from hologram.frontend import functional
from hologram.isa import dtypes as dt
from hologram_torch import memory
from hologram_torch.aten import program
from hologram_torch.aten.program import ISA, cast, opmath
from hologram_torch.aten.registry import aten, impl
from hologram_torch.fallback import run_on_cpu

OPINFO = ("softmax", "log_softmax", "_softmax_backward_data", "nn.functional.softmin",
          "nn.functional.mse_loss", "nn.functional.cross_entropy", "nn.functional.nll_loss",
          "nn.functional.binary_cross_entropy",
          "nn.functional.binary_cross_entropy_with_logits", "nn.functional.l1_loss",
          "nn.functional.smooth_l1_loss", "nn.functional.huber_loss",
          "nn.functional.layer_norm", "nn.functional.embedding", "nn.functional.dropout")

_NONE, _MEAN = 0, 1  # at::Reduction (2 is sum)


def _floats(*tensors) -> bool:
    """Are these (optional) tensors all native floating-point device tensors?"""
    return all(t is None or (t.dtype.is_floating_point and t.dtype in ISA) for t in tensors)


def _or(t: torch.Tensor | None, neutral: float):
    """An optional tensor operand (a weight, a bias) or, when absent, the number that
    leaves the formula unchanged: it enters the program as a 0-d runtime input."""
    return neutral if t is None else t


def _reduce(g, loss, reduction: int):
    """at::apply_loss_reduction: elementwise, sum, or mean (NaN for an empty mean)."""
    if reduction == _NONE:
        return loss
    total = g.reduce("sum", loss, None)
    return total / math.prod(loss.shape) if reduction == _MEAN else total


def _loss_scale(reduction: int, numel: int) -> float:
    """The factor a loss gradient carries: 1/n for a mean."""
    return 1.0 / numel if reduction == _MEAN and numel else 1.0


def _rounded(t, dtype):
    """``t`` (in opmath) rounded to ``dtype`` and back: where torch's CPU kernels compute a
    half-type step in float32 and store it as half, the next step sees the rounding."""
    return cast(cast(t, dtype), t.dtype)


def _pick(g, table, index, axis: int):
    """``table`` at ``index`` along ``axis`` (negative: counted from the end), one-hot:
    ``index`` broadcasts against ``table`` with a size-1 ``axis``, and the result drops
    ``axis``. O(size of the broadcast table) work."""
    n = table.shape[axis]
    classes = g.arange(n, dt.int64).reshape(n, *(1,) * (-axis - 1))
    hit = g.binary("eq", classes, cast(index, dt.int64))
    return g.reduce("sum", g.where(hit, table, -0.0), axis)


def _axis(x: torch.Tensor, dim: int) -> int | None:
    """``dim`` wrapped into range (a 0-d tensor has one axis, as in torch), or None when
    torch would reject it."""
    rank = max(x.dim(), 1)
    return dim % rank if -rank <= dim < rank else None


def _host(t: torch.Tensor) -> torch.Tensor:
    """A CPU view of a device tensor's memory (for the argument checks torch makes)."""
    return memory.cpu_alias(t)


# --- softmax ------------------------------------------------------------------------------

def _rows(*tensors):
    """0-d tensors as one-element rows: the ISA reduces over an existing axis."""
    return tuple(t.reshape(1) if t.ndim == 0 else t for t in tensors)


def _softmax_build(g, x, dim, log, out):
    (y,) = _rows(cast(x, opmath(x.dtype)))
    y = (functional.log_softmax if log else functional.softmax)(y, dim)
    return cast(y.reshape(*x.shape), out)


def _softmax_backward_build(g, grad, y, dim, log, out):
    acc = opmath(grad.dtype)
    dy, y = _rows(cast(grad, acc), cast(y, acc))
    if log:  # d/dx log_softmax: g - exp(y) * sum(g)
        r = dy - g.unary("exp", y) * g.reduce("sum", dy, dim, True)
    else:  # d/dx softmax: y * (g - sum(g * y))
        r = y * (dy - g.reduce("sum", dy * y, dim, True))
    return cast(r.reshape(*grad.shape), out)


def _register_softmax(name: str, log: bool) -> None:
    forward, backward = getattr(aten, name).default, getattr(aten, f"{name}_backward_data")

    @impl(name)
    def kernel(x, dim, half_to_float):
        axis = _axis(x, dim)
        # half_to_float is torch's CUDA-only fused cast: the CPU kernel raises for it.
        if axis is None or not _floats(x) or (half_to_float and x.dtype is not torch.half):
            return run_on_cpu(forward, x, dim, half_to_float)
        out = torch.float32 if half_to_float else x.dtype
        return program.run(name, _softmax_build, (x,), (axis, log, ISA[out]))

    @impl(f"{name}_backward_data")
    def backward_kernel(grad, output, dim, input_dtype):
        axis = _axis(grad, dim)
        if (axis is None or not _floats(grad, output) or input_dtype not in ISA
                or grad.shape != output.shape):
            return run_on_cpu(backward.default, grad, output, dim, input_dtype)
        return program.run(f"{name}_backward", _softmax_backward_build, (grad, output),
                           (axis, log, ISA[input_dtype]))


_register_softmax("_softmax", log=False)
_register_softmax("_log_softmax", log=True)


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


_POINTWISE = {"mse_loss": (_mse, _mse_grad), "smooth_l1_loss": (_smooth_l1, _smooth_l1_grad),
              "huber_loss": (_huber, _huber_grad)}


def _pointwise_build(g, x, target, kind, param, reduction, out):
    acc = opmath(out)

    def r(v):
        return _rounded(v, out)

    loss = r(_POINTWISE[kind][0](g, cast(x, acc) - cast(target, acc), param, r))
    return cast(_reduce(g, loss, reduction), out)


def _pointwise_grad_build(g, grad, x, target, kind, param, scale, out):
    acc = opmath(out)
    d = cast(x, acc) - cast(target, acc)
    r = _POINTWISE[kind][1](g, d, param) * cast(grad, acc) * scale
    return cast(r.broadcast_to(x.shape), out)


def _register_pointwise(kind: str, default: float, valid) -> None:
    """``kind`` and its backward; ``default`` is the parameter (beta, delta) when the call
    leaves it out (torch's dispatcher omits defaulted trailing arguments)."""
    forward, backward = getattr(aten, kind).default, getattr(aten, f"{kind}_backward").default

    @impl(kind)
    def kernel(x, target, reduction=_MEAN, *param):
        value = float(param[0]) if param else default
        if not (_floats(x, target) and valid(value)) or reduction not in (0, 1, 2):
            return run_on_cpu(forward, x, target, reduction, *param)
        out = torch.promote_types(x.dtype, target.dtype)
        return program.run(kind, _pointwise_build, (x, target),
                           (kind, value, reduction, ISA[out]))

    @impl(f"{kind}_backward")
    def backward_kernel(grad, x, target, reduction, *param):
        value = float(param[0]) if param else default
        if not (_floats(grad, x, target) and valid(value)):
            return run_on_cpu(backward, grad, x, target, reduction, *param)
        return program.run(f"{kind}_backward", _pointwise_grad_build, (grad, x, target),
                           (kind, value, _loss_scale(reduction, x.numel()), ISA[x.dtype]))


_register_pointwise("mse_loss", 0.0, lambda _: True)
_register_pointwise("smooth_l1_loss", 1.0, lambda beta: beta >= 0)  # torch raises for < 0
_register_pointwise("huber_loss", 1.0, lambda delta: delta > 0)


# --- binary cross-entropy -----------------------------------------------------------------

def _bce_build(g, x, target, weight, reduction, out):
    acc = opmath(out)
    x, t = cast(x, acc), cast(target, acc)
    log_p = g.maximum(g.unary("log", x), -100.0)  # torch clamps the logarithms at -100
    log_q = g.maximum(g.unary("log1p", -x), -100.0)
    loss = (t - 1.0) * log_q - t * log_p
    return cast(_reduce(g, loss * cast(weight, acc), reduction), out)


def _bce_grad_build(g, grad, x, target, weight, scale, out):
    acc = opmath(out)
    x, t = cast(x, acc), cast(target, acc)
    r = (x - t) / g.maximum((1.0 - x) * x, 1e-12) * cast(grad, acc) * cast(weight, acc)
    return cast((r * scale).broadcast_to(x.shape), out)


def _probabilities(x: torch.Tensor) -> bool:
    """torch's check that BCE inputs lie in [0, 1] (NaN fails it)."""
    h = _host(x)
    return bool(((h >= 0) & (h <= 1)).all())


@impl("binary_cross_entropy")
def binary_cross_entropy(x, target, weight=None, reduction=_MEAN):
    if (not _floats(x, target, weight) or x.shape != target.shape or reduction not in (0, 1, 2)
            or not _probabilities(x)):
        return run_on_cpu(aten.binary_cross_entropy.default, x, target, weight, reduction)
    return program.run("binary_cross_entropy", _bce_build,
                       (x, target, _or(weight, 1.0)), (reduction, ISA[x.dtype]))


@impl("binary_cross_entropy_backward")
def binary_cross_entropy_backward(grad, x, target, weight=None, reduction=_MEAN):
    if not _floats(grad, x, target, weight):
        return run_on_cpu(aten.binary_cross_entropy_backward.default, grad, x, target, weight,
                          reduction)
    return program.run("binary_cross_entropy_backward", _bce_grad_build,
                       (grad, x, target, _or(weight, 1.0)),
                       (_loss_scale(reduction, x.numel()), ISA[x.dtype]))


def _bce_logits_build(g, x, target, weight, pos_weight, reduction, out):
    """torch's form: (1 - t) x - log_sigmoid(x) (1 + (pos_weight - 1) t), times weight."""
    acc = opmath(out)
    x, t = cast(x, acc), cast(target, acc)

    def r(v):  # torch runs this op by op: each step is rounded to the tensor dtype
        return _rounded(v, out)

    log_sigmoid = r(g.minimum(x, 0.0) - g.unary("log1p", g.unary("exp", -abs(x))))
    log_weight = r(r(r(cast(pos_weight, acc) - 1.0) * t) + 1.0)
    loss = r(r(r(1.0 - t) * x) - r(log_sigmoid * log_weight))
    return cast(_reduce(g, r(loss * cast(weight, acc)), reduction), out)


@impl("binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None,
                                     reduction=_MEAN):
    if not _floats(x, target, weight, pos_weight) or reduction not in (0, 1, 2):
        return run_on_cpu(aten.binary_cross_entropy_with_logits.default, x, target, weight,
                          pos_weight, reduction)
    out = torch.promote_types(x.dtype, target.dtype)
    return program.run("bce_with_logits", _bce_logits_build,
                       (x, target, _or(weight, 1.0),
                        _or(pos_weight, 1.0)), (reduction, ISA[out]))


# --- negative log-likelihood --------------------------------------------------------------
# input [N, C, *rest] (or [C]), target [N, *rest] (or []): the class axis is 1 (or 0).
# Sums accumulate in float32 for half types; torch's CPU nll_loss2d accumulates half
# inputs in half (a cascade of sequential partial sums), so its float16 sums can differ
# from these (closer to exact) ones by a few half ulps.

def _nll_parts(g, x, target, weight, ignore_index):
    """(target with a unit class axis, is-valid per target, weight per target)."""
    axis = min(x.ndim, 2) - 1
    t = cast(target, dt.int64)
    tk = t.reshape(*t.shape[:axis], 1, *t.shape[axis:]) if x.ndim > 1 else t
    valid = g.binary("ne", t, ignore_index)
    w = cast(weight, opmath(x.dtype))
    if w.ndim:  # a class-weight vector: weight[target], one-hot
        w = _pick(g, w, t.reshape(*t.shape, 1), -1)
    return tk, valid, g.where(valid, w, 0.0)


def _nll_build(g, x, target, weight, reduction, ignore_index):
    tk, valid, w = _nll_parts(g, x, target, weight, ignore_index)
    picked = _pick(g, cast(x, opmath(x.dtype)), tk, min(x.ndim, 2) - 1 - x.ndim)
    loss = g.where(valid, -_rounded(w * picked, x.dtype), 0.0)
    total_weight = g.reduce("sum", w, None)
    if reduction == _NONE:
        if x.ndim > 1:  # torch leaves total_weight 0 here (but not for a single sample)
            total_weight = g.arange(1).reshape()
        return cast(loss, x.dtype), cast(total_weight, x.dtype)
    total = g.reduce("sum", loss, None)
    if reduction == _MEAN:
        total = total / total_weight
    return cast(total, x.dtype), cast(total_weight, x.dtype)


def _nll_grad_build(g, grad, x, target, weight, total_weight, reduction, ignore_index):
    acc = opmath(x.dtype)
    tk, valid, w = _nll_parts(g, x, target, weight, ignore_index)
    coef = -(w * cast(grad, acc))
    if reduction == _MEAN:
        coef = coef / cast(total_weight, acc)
    coef = g.where(valid, coef, 0.0)
    axis = min(x.ndim, 2) - 1
    n = x.shape[axis]
    classes = g.arange(n, dt.int64).reshape(n, *(1,) * (x.ndim - axis - 1))
    if x.ndim > 1:
        coef = coef.reshape(*tk.shape)
    hit = g.binary("eq", classes, tk)
    return cast(g.where(hit, coef, 0.0).broadcast_to(x.shape), x.dtype)


def _nll_native(x, target, weight, reduction, ignore_index) -> bool:
    """Can the native kernel compute this call exactly as torch would (else the fallback
    computes it or raises torch's error: shapes, dtypes, out-of-range targets)?"""
    if not (_floats(x, weight) and target.dtype is torch.int64 and reduction in (0, 1, 2)
            and x.dim() >= 1):
        return False
    axis = min(x.dim(), 2) - 1
    classes = x.shape[axis]
    if tuple(target.shape) != tuple(x.shape[:axis] + x.shape[axis + 1:]):
        return False
    if weight is not None and tuple(weight.shape) != (classes,):
        return False
    t = _host(target)
    return bool(((t == ignore_index) | ((t >= 0) & (t < classes))).all())


def _register_nll(name: str) -> None:
    forward, backward = getattr(aten, f"{name}_forward"), getattr(aten, f"{name}_backward")

    @impl(f"{name}_forward")
    def kernel(x, target, weight, reduction, ignore_index):
        if not _nll_native(x, target, weight, reduction, ignore_index):
            return run_on_cpu(forward.default, x, target, weight, reduction, ignore_index)
        return program.run(name, _nll_build, (x, target, _or(weight, 1.0)),
                           (reduction, int(ignore_index)))

    @impl(f"{name}_backward")
    def backward_kernel(grad, x, target, weight, reduction, ignore_index, total_weight):
        if not (_nll_native(x, target, weight, reduction, ignore_index) and _floats(grad)):
            return run_on_cpu(backward.default, grad, x, target, weight, reduction,
                              ignore_index, total_weight)
        return program.run(f"{name}_backward", _nll_grad_build,
                           (grad, x, target, _or(weight, 1.0), total_weight),
                           (reduction, int(ignore_index)))


_register_nll("nll_loss")
_register_nll("nll_loss2d")


# --- layer normalization ------------------------------------------------------------------

def _layer_norm_build(g, x, weight, bias, k, eps, stats_dtype):
    acc = opmath(x.dtype)
    axes = tuple(range(x.ndim - k, x.ndim))
    xo = cast(x, acc)
    count = math.prod(x.shape[d] for d in axes)
    mean = g.reduce("sum", xo, axes, True) / count
    d = xo - mean
    rstd = 1.0 / g.unary("sqrt", g.reduce("sum", d * d, axes, True) / count + eps)
    y = d * rstd * cast(weight, acc) + cast(bias, acc)
    return cast(y, x.dtype), cast(mean, stats_dtype), cast(rstd, stats_dtype)


def _stats_dtype(x: torch.Tensor, weight) -> torch.dtype:
    """at::native's param_scalar_type: float32 statistics for half input with float32
    parameters (mixed precision), else the input's dtype."""
    mixed = weight is not None and weight.dtype is torch.float32 and x.dtype in (
        torch.float16, torch.bfloat16)
    return torch.float32 if mixed else x.dtype


def _layer_norm_native(x, normalized_shape, weight, bias) -> bool:
    k = len(normalized_shape)
    shape = tuple(normalized_shape)
    return (_floats(x, weight, bias) and 0 < k <= x.dim() and tuple(x.shape[-k:]) == shape
            and all(p is None or tuple(p.shape) == shape for p in (weight, bias))
            and math.prod(shape) > 0)


@impl("native_layer_norm")
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    if not _layer_norm_native(x, normalized_shape, weight, bias):
        return run_on_cpu(aten.native_layer_norm.default, x, normalized_shape, weight, bias,
                          eps)
    return program.run("layer_norm", _layer_norm_build,
                       (x, _or(weight, 1.0), _or(bias, 0.0)),
                       (len(normalized_shape), float(eps), ISA[_stats_dtype(x, weight)]))


def _layer_norm_grad_build(g, grad, x, mean, rstd, weight, k, mask, dtypes):
    acc = opmath(x.dtype)
    axes = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    stats = x.shape[:x.ndim - k] + (1,) * k
    mean, rstd = cast(mean, acc).reshape(*stats), cast(rstd, acc).reshape(*stats)
    dy, xo = cast(grad, acc), cast(x, acc)
    # x̂ as torch's CPU kernel rounds it: fma(x, a, b), a = rstd, b = -a mean (with a
    # near-zero variance the residue of b's rounding is what dweight sees).
    xhat = g.fma(xo, rstd, -(rstd * mean))
    count = math.prod(x.shape[d] for d in axes)
    results = []
    if mask[0]:
        # torch's CPU formula (dx = rstd w dy + b x + c), not the textbook one: with a
        # near-zero variance rstd is huge and the rounding of the cancellations shows.
        wdy = dy * cast(weight, acc)
        ds = g.reduce("sum", wdy * xo, axes, True)
        db = g.reduce("sum", wdy, axes, True)
        # (db mean - ds) is contracted to an fma in torch's build: its residue matters.
        b = g.fma(db, mean, -ds) * rstd * rstd * rstd * (1.0 / count)
        c = -b * mean - db * rstd * (1.0 / count)
        results.append(cast(rstd * dy * cast(weight, acc) + b * xo + c, dtypes[0]))
    # Over the leading dimensions; none when x is all normalized (() would reduce all).
    def lead_sum(v):
        return g.reduce("sum", v, lead) if lead else v

    if mask[1]:
        results.append(cast(lead_sum(dy * xhat), dtypes[1]))
    if mask[2]:
        results.append(cast(lead_sum(dy), dtypes[2]))
    return tuple(results)


@impl("native_layer_norm_backward")
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias,
                               output_mask):
    k = len(normalized_shape)
    lead = math.prod(x.shape[:x.dim() - k]) if k <= x.dim() else -1
    if (not _layer_norm_native(x, normalized_shape, weight, bias) or grad.shape != x.shape
            or mean.numel() != lead or rstd.numel() != lead or not _floats(grad, mean, rstd)):
        return run_on_cpu(aten.native_layer_norm_backward.default, grad, x, normalized_shape,
                          mean, rstd, weight, bias, output_mask)
    # Parameter gradients exist only for parameters that exist (else undefined, as torch).
    mask = (bool(output_mask[0]), bool(output_mask[1]) and weight is not None,
            bool(output_mask[2]) and bias is not None)
    dtypes = (ISA[x.dtype], *(ISA[p.dtype] if p is not None else None for p in (weight, bias)))
    results = iter(program.run("layer_norm_backward", _layer_norm_grad_build,
                               (grad, x, mean, rstd, _or(weight, 1.0)),
                               (k, mask, dtypes)) if any(mask) else ())
    return tuple(next(results) if m else None for m in mask)


# --- embedding ----------------------------------------------------------------------------

def _embedding_build(g, weight, indices):
    """weight[indices], one-hot over the V rows: O(indices x V x D)."""
    return _pick(g, weight, indices.reshape(*indices.shape, 1, 1), -2)


def _in_range(indices: torch.Tensor, n: int) -> bool:
    h = _host(indices)
    return bool(((h >= 0) & (h < n)).all())


@impl("embedding")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """Rows of ``weight`` at ``indices``. No gather in the ISA: every output element
    compares its index with all V row numbers and sums the selected row, O(N·V·D) work
    for N indices into a [V, D] table (exact: unselected rows contribute -0.0)."""
    if (weight.dim() != 2 or not program.supported(weight) or weight.dtype is torch.bool
            or indices.dtype not in (torch.int64, torch.int32)
            or not _in_range(indices, weight.shape[0])):
        return run_on_cpu(aten.embedding.default, weight, indices, padding_idx,
                          scale_grad_by_freq, sparse)
    return program.run("embedding", _embedding_build, (weight, indices))


def _embedding_grad_build(g, grad, indices, rows, padding_idx, scale):
    """grad_weight[v] = sum of grad rows whose index is v (not padding_idx), one-hot:
    O(N·V·D) for N indices, V rows, D features."""
    acc = opmath(grad.dtype)
    n, width = math.prod(indices.shape), grad.shape[-1]
    idx = cast(indices, dt.int64).reshape(1, n, 1)
    hit = g.binary("and", g.binary("eq", g.arange(rows).reshape(rows, 1, 1), idx),
                   g.binary("ne", idx, padding_idx))
    dy = cast(grad, acc).reshape(1, n, width)
    total = g.reduce("sum", g.where(hit, dy, -0.0), 1)
    if scale:  # scale_grad_by_freq: each row's gradient over its number of occurrences
        counts = g.reduce("sum", cast(hit, acc), 1)
        total = total / g.maximum(counts, 1.0)
    return cast(total, grad.dtype)


@impl("embedding_dense_backward")
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The gradient of :func:`embedding` for its [num_weights, D] table (see
    :func:`_embedding_grad_build` for the O(N·V·D) one-hot cost)."""
    if (not _floats(grad) or indices.dtype not in (torch.int64, torch.int32)
            or tuple(grad.shape[:-1]) != tuple(indices.shape) or grad.dim() == 0):
        return run_on_cpu(aten.embedding_dense_backward.default, grad, indices, num_weights,
                          padding_idx, scale_grad_by_freq)
    return program.run("embedding_backward", _embedding_grad_build, (grad, indices),
                       (int(num_weights), int(padding_idx), bool(scale_grad_by_freq)))


# --- dropout ------------------------------------------------------------------------------

def _dropout_build(g, x, noise, scale):
    """x * noise * scale and the keep mask; noise holds 0/1 in x's dtype."""
    acc = opmath(x.dtype)
    kept = cast(cast(noise, acc) * cast(scale, acc), x.dtype)  # noise.div_(1 - p), rounded
    return cast(cast(x, acc) * cast(kept, acc), x.dtype), g.binary("ne", noise, 0.0)


def _dropout_eval_build(g, x, keep):
    return g.copy(x), keep.broadcast_to(x.shape)


@impl("native_dropout")
def native_dropout(x, p, train=None):
    """Dropout with a mask drawn by torch's CPU generator, so ``torch.manual_seed`` gives
    the same mask as on the CPU: the draw is exactly the CPU ``F.dropout`` one (a
    Bernoulli(1 - p) tensor of x's dtype and shape, ``bernoulli_`` on the CPU), copied to
    the device; the scaling runs here. (CPU ``native_dropout`` itself draws a bool tensor,
    a different stream: it is ``F.dropout``'s results that match.)"""
    if not _floats(x):
        return run_on_cpu(aten.native_dropout.default, x, p, train)
    if x.numel() == 0:
        return memory.empty(x.shape, x.dtype), memory.empty(x.shape, torch.bool)
    if train is not None and not train:
        return program.run("dropout_eval", _dropout_eval_build, (x, True))
    keep = 1.0 - p
    noise = memory.from_cpu(torch.empty(x.shape, dtype=x.dtype).bernoulli_(keep))
    scale = 0.0 if keep == 0 else 1.0 / keep
    return program.run("dropout", _dropout_build, (x, noise, scale))


def _dropout_grad_build(g, grad, mask, scale):
    acc = opmath(grad.dtype)
    return cast(cast(grad, acc) * cast(mask, acc) * cast(scale, acc), grad.dtype)


@impl("native_dropout_backward")
def native_dropout_backward(grad, mask, scale):
    if not _floats(grad) or not program.supported(mask):
        return run_on_cpu(aten.native_dropout_backward.default, grad, mask, scale)
    return program.run("dropout_backward", _dropout_grad_build, (grad, mask, float(scale)))
