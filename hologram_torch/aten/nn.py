"""Neural-network kernels: softmax and log-softmax (and their backward), losses (MSE,
negative log-likelihood, binary cross-entropy with and without logits, smooth L1, Huber)
with their backward, layer normalization, embedding lookups and dropout.

The math of each op is its entry in :mod:`hologram_torch.lowering.nn` (the table
torch.compile lowers through too): arithmetic in opmath (float32 for half types), torch's
result dtypes, half-type intermediates rounded where torch's CPU kernel stores them. This
module adds the eager parts: host checks of index values, dropout's random mask, and the
CPU fallback for what the lowering does not take.
Composite ops need no kernel: ``cross_entropy`` is ``_log_softmax`` + ``nll_loss_forward``
(``nll_loss2d_forward`` for K-dimensional inputs), ``l1_loss`` is ``sub``/``abs``/``mean``,
and the backward of ``binary_cross_entropy_with_logits`` is elementwise ops.

An embedding row and a class in ``nll_loss`` are the ISA's ``gather`` (O(indices x
width)); the embedding's gradient is the ISA's ``scatter`` adding grad rows into the
table's rows in index order (O(indices x width + table), whatever the multiplicity of an
index). ``nll_loss``'s backward, dense over its [N, C] result anyway, compares an
``arange`` of the classes with the target and selects. Index values that torch checks
(out of range targets and embedding indices, probabilities outside [0, 1]) are checked
on the host, through a CPU alias of the device memory: a failing check sends the call to
the CPU fallback, which raises torch's own error.
"""

from __future__ import annotations

import math

import torch

from hologram_torch import memory
from hologram_torch.aten import from_table, layout, runner
from hologram_torch.aten.registry import aten, impl
from hologram_torch.aten.runner import ISA, cast, opmath
from hologram_torch.aten.shape import cpu_error, in_bounds
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


def _axis(x: torch.Tensor, dim: int) -> int | None:
    """``dim`` wrapped into range (a 0-d tensor has one axis, as in torch), or None when
    torch would reject it."""
    rank = max(x.dim(), 1)
    return dim % rank if -rank <= dim < rank else None


def _host(t: torch.Tensor) -> torch.Tensor:
    """A CPU view of a device tensor's memory (for the argument checks torch makes)."""
    return memory.cpu_alias(t, read_only=True)


# --- softmax ------------------------------------------------------------------------------

def _register_softmax(name: str) -> None:
    forward, backward = getattr(aten, name).default, getattr(aten, f"{name}_backward_data")

    @impl(name)
    def kernel(x, dim, half_to_float):
        axis = _axis(x, dim)
        r = NotImplemented if axis is None else from_table.call(forward, x, axis, half_to_float,
                                                             name=name)
        return run_on_cpu(forward, x, dim, half_to_float) if r is NotImplemented else r

    @impl(f"{name}_backward_data")
    def backward_kernel(grad, output, dim, input_dtype):
        axis = _axis(grad, dim)
        r = NotImplemented if axis is None else from_table.call(
            backward.default, grad, output, axis, input_dtype, name=f"{name}_backward")
        if r is NotImplemented:
            return run_on_cpu(backward.default, grad, output, dim, input_dtype)
        return r


_register_softmax("_softmax")
_register_softmax("_log_softmax")
from_table.register("_safe_softmax")  # attention's softmax: one program instead of four ops


# --- losses -------------------------------------------------------------------------------

def _register_pointwise(kind: str) -> None:
    """``kind`` (mse_loss, smooth_l1_loss, huber_loss) and its backward."""
    forward, backward = getattr(aten, kind).default, getattr(aten, f"{kind}_backward").default

    @impl(kind)
    def kernel(x, target, reduction=_MEAN, *param):
        r = from_table.call(forward, x, target, reduction, *(float(p) for p in param))
        return run_on_cpu(forward, x, target, reduction, *param) if r is NotImplemented else r

    @impl(f"{kind}_backward")
    def backward_kernel(grad, x, target, reduction, *param):
        r = from_table.call(backward, grad, x, target, reduction, *(float(p) for p in param),
                         name=f"{kind}_backward")
        if r is NotImplemented:
            return run_on_cpu(backward, grad, x, target, reduction, *param)
        return r


_register_pointwise("mse_loss")
_register_pointwise("smooth_l1_loss")
_register_pointwise("huber_loss")


def _probabilities(x: torch.Tensor) -> bool:
    """torch's check that BCE inputs and targets lie in [0, 1] (NaN fails it)."""
    h = _host(x)
    return bool(((h >= 0) & (h <= 1)).all())


@impl("binary_cross_entropy")
def binary_cross_entropy(x, target, weight=None, reduction=_MEAN):
    r = NotImplemented
    if _floats(x) and _probabilities(x) and _probabilities(target):
        r = from_table.call(aten.binary_cross_entropy.default, x, target, weight, reduction)
    if r is NotImplemented:
        return run_on_cpu(aten.binary_cross_entropy.default, x, target, weight, reduction)
    return r


@impl("binary_cross_entropy_backward")
def binary_cross_entropy_backward(grad, x, target, weight=None, reduction=_MEAN):
    r = from_table.call(aten.binary_cross_entropy_backward.default, grad, x, target, weight,
                     reduction, name="binary_cross_entropy_backward")
    if r is NotImplemented:
        return run_on_cpu(aten.binary_cross_entropy_backward.default, grad, x, target, weight,
                          reduction)
    return r


@impl("binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None,
                                     reduction=_MEAN):
    r = from_table.call(aten.binary_cross_entropy_with_logits.default, x, target, weight,
                     pos_weight, reduction, name="bce_with_logits")
    if r is NotImplemented:
        return run_on_cpu(aten.binary_cross_entropy_with_logits.default, x, target, weight,
                          pos_weight, reduction)
    return r


# --- negative log-likelihood --------------------------------------------------------------

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
    if not t.numel():
        return True
    low, high = torch.aminmax(t)  # one pass where every target is a class (the usual case)
    if low >= 0 and high < classes:
        return True
    return bool(((t == ignore_index) | ((t >= 0) & (t < classes))).all())


def _register_nll(name: str) -> None:
    forward, backward = getattr(aten, f"{name}_forward"), getattr(aten, f"{name}_backward")

    # Filed with the front kernel, which checks every call's targets natively: in
    # [0, classes) or ignore_index (classes: the input's dimension min(dim, 2) - 1).
    @impl(f"{name}_forward", hot=True)
    def kernel(x, target, weight, reduction, ignore_index):
        r = NotImplemented
        if _nll_native(x, target, weight, reduction, ignore_index):
            r = from_table.call(forward.default, x, target, weight, reduction, int(ignore_index),
                             name=name, file=True,
                             checks=((1, 0, min(x.dim(), 2) - 1, 4),))
        if r is NotImplemented:
            return run_on_cpu(forward.default, x, target, weight, reduction, ignore_index)
        return r

    @impl(f"{name}_backward", hot=True)
    def backward_kernel(grad, x, target, weight, reduction, ignore_index, total_weight):
        r = NotImplemented
        if _nll_native(x, target, weight, reduction, ignore_index):
            r = from_table.call(backward.default, grad, x, target, weight, reduction,
                             int(ignore_index), total_weight, name=f"{name}_backward",
                             file=True, checks=((2, 1, min(x.dim(), 2) - 1, 5),))
        if r is NotImplemented:
            return run_on_cpu(backward.default, grad, x, target, weight, reduction,
                              ignore_index, total_weight)
        return r


_register_nll("nll_loss")
_register_nll("nll_loss2d")


# --- layer normalization ------------------------------------------------------------------

def _layer_norm_native(x, normalized_shape, weight, bias) -> bool:
    k = len(normalized_shape)
    shape = tuple(normalized_shape)
    return (_floats(x, weight, bias) and 0 < k <= x.dim() and tuple(x.shape[-k:]) == shape
            and all(p is None or tuple(p.shape) == shape for p in (weight, bias))
            and math.prod(shape) > 0)


@impl("native_layer_norm", hot=True)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    r = from_table.call(aten.native_layer_norm.default, x, tuple(normalized_shape), weight, bias,
                     float(eps), name="layer_norm", file=True)
    if r is NotImplemented:
        return run_on_cpu(aten.native_layer_norm.default, x, normalized_shape, weight, bias,
                          eps)
    return r


@impl("native_layer_norm_backward", hot=True)
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias,
                               output_mask):
    # Parameter gradients exist only for parameters that exist (else undefined, as torch;
    # the front kernel serving the call returns None in their place).
    mask = (bool(output_mask[0]), bool(output_mask[1]) and weight is not None,
            bool(output_mask[2]) and bias is not None)
    r = from_table.call(aten.native_layer_norm_backward.default, grad, x,
                     tuple(normalized_shape), mean, rstd, weight, bias, mask,
                     name="layer_norm_backward", file=True) if any(mask) else ()
    if r is NotImplemented:
        return run_on_cpu(aten.native_layer_norm_backward.default, grad, x, normalized_shape,
                          mean, rstd, weight, bias, output_mask)
    results = iter((r,) if isinstance(r, torch.Tensor) else r)
    return tuple(next(results) if m else None for m in mask)


# --- embedding ----------------------------------------------------------------------------

@impl("embedding", hot=True)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """Rows of ``weight`` at ``indices``: one gather, O(N·D) for N indices into a
    [V, D] table. An index out of range raises PyTorch's IndexError (its CPU kernel's,
    :func:`~hologram_torch.aten.shape.cpu_error`) before anything is launched."""
    if (weight.dim() != 2 or not runner.supported(weight, indices) or indices.is_cpu
            or indices.dtype not in (torch.int64, torch.int32)):
        return run_on_cpu(aten.embedding.default, weight, indices, padding_idx,
                          scale_grad_by_freq, sparse)
    if not in_bounds(indices, 0, weight.shape[0]):  # torch raises its IndexError
        return cpu_error(aten.embedding.default, weight, indices, padding_idx,
                         scale_grad_by_freq, sparse)
    # (filed with the front kernel, which checks every call's indices natively)
    r = from_table.call(aten.embedding.default, weight, indices, file=True,
                     checks=((1, 0, 0, -1),))
    if r is NotImplemented:
        return run_on_cpu(aten.embedding.default, weight, indices, padding_idx,
                          scale_grad_by_freq, sparse)
    return r


@impl("embedding_dense_backward", hot=True)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The gradient of :func:`embedding` for its [num_weights, D] table: the grad rows
    added per index in index order, one ISA scatter (its lowering in
    :mod:`hologram_torch.lowering.nn`), O((V + N)·D) like the CPU kernel's loop, at any
    multiplicity of an index."""
    r = from_table.call(aten.embedding_dense_backward.default, grad, indices, int(num_weights),
                     int(padding_idx), bool(scale_grad_by_freq), name="embedding_backward",
                     file=True, checks=((1, 2, -1, -1),))
    if r is NotImplemented:
        return run_on_cpu(aten.embedding_dense_backward.default, grad, indices, num_weights,
                          padding_idx, scale_grad_by_freq)
    return r


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
    if not _floats(x) or runner.lacking(x):  # (before the draw: it must happen once)
        return run_on_cpu(aten.native_dropout.default, x, p, train)
    if x.numel() == 0:
        return memory.empty(x.shape, x.dtype), memory.empty(x.shape, torch.bool)
    if train is not None and not train:
        return runner.run("dropout_eval", _dropout_eval_build, (x, True),
                           layout=layout.pointwise)
    keep = 1.0 - p
    # laid out as x (the CPU draws into empty_like(x)): the same draws in the same places
    noise = torch.empty_strided(x.shape, layout.elementwise(x.shape, (x,)), dtype=x.dtype)
    noise = memory.from_cpu(noise.bernoulli_(keep))
    scale = 0.0 if keep == 0 else 1.0 / keep
    return runner.run("dropout", _dropout_build, (x, noise, scale), layout=layout.pointwise)


@impl("native_dropout_backward")
def native_dropout_backward(grad, mask, scale):
    r = from_table.run(aten.native_dropout_backward.default, (grad, mask, float(scale)),
                    name="dropout_backward")
    if r is NotImplemented:
        return run_on_cpu(aten.native_dropout_backward.default, grad, mask, scale)
    return r
