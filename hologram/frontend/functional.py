"""Composite tensor functions on :mod:`hologram.frontend.graph` tensors: activations, softmax and
losses, written with the graph's primitive ops (the fusion pass turns each into as few
kernels as their data flow allows; softmax over the last dimension is one kernel).

Semantics follow ``torch.nn.functional`` where it defines them: reductions ``"mean"``,
``"sum"`` or ``"none"``; cross-entropy takes class indices (an integer tensor of shape
``[N]``) or class probabilities (a float tensor shaped like the logits); binary
cross-entropy clamps its logarithms at -100 as PyTorch does. Not supported yet: class
weights, ``ignore_index`` and label smoothing.
"""

from __future__ import annotations

import math

from hologram.errors import ShapeError
from hologram.frontend.graph import Tensor

REDUCTIONS = ("mean", "sum", "none")


def _dim(x: Tensor, dim: int) -> int:
    if not -x.ndim <= dim < x.ndim:
        raise ShapeError(f"dim {dim} out of range for a {x.ndim}-d tensor {list(x.shape)}")
    return dim % x.ndim


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along ``dim`` (numerically stable)."""
    g, dim = x.graph, _dim(x, dim)
    e = g.unary("exp", x - g.max(x, dim, keepdim=True))
    return e / g.sum(e, dim, keepdim=True)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """x - max - log(sum(exp(x - max))) along ``dim``."""
    g, dim = x.graph, _dim(x, dim)
    shifted = x - g.max(x, dim, keepdim=True)
    return shifted - g.unary("log", g.sum(g.unary("exp", shifted), dim, keepdim=True))


def relu(x: Tensor) -> Tensor:
    return x.graph.maximum(x, 0.0)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU: ``x * Φ(x)`` with the exact erf form (``"none"``) or the tanh approximation."""
    g = x.graph
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
        return x * 0.5 * (g.unary("tanh", inner) + 1.0)
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return x * 0.5 * (g.unary("erf", x * (1.0 / math.sqrt(2.0))) + 1.0)


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.graph.sum(loss)
    if reduction == "mean":
        return loss.graph.mean(loss)
    raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _same_shape(name: str, a: Tensor, b: Tensor) -> None:
    if a.shape != b.shape:
        raise ShapeError(f"{name}: input {list(a.shape)} and target {list(b.shape)} differ")


def mse_loss(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    _same_shape("mse_loss", x, target)
    d = x - target
    return _reduce(d * d, reduction)


def cross_entropy(logits: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy of ``logits [N, C]`` against class indices ``[N]`` (integers) or
    class probabilities ``[N, C]`` (floats)."""
    g = logits.graph
    if logits.ndim != 2:
        raise ShapeError(f"cross_entropy: logits must be [N, C], got {list(logits.shape)}")
    if target.dtype.is_float:
        _same_shape("cross_entropy", logits, target)
        loss = -g.sum(log_softmax(logits, 1) * target, 1)
    else:
        n = logits.shape[0]
        if target.shape != (n,):
            raise ShapeError(f"cross_entropy: class indices must be [{n}], got "
                             f"{list(target.shape)}")
        # log_softmax at the target only: one read of the target's logit per row, not a
        # pass over the row. Class indices are data: callers that know them check their
        # range (hg.ops.cross_entropy_loss raises IndexOutOfRangeError before launching);
        # here one outside [0, C) contributes 0 rather than some other logit (the
        # gather's clamped read).
        top = g.max(logits, 1, keepdim=True)
        lse = g.unary("log", g.sum(g.unary("exp", logits - top), 1)) + top.reshape(n)
        valid = g.binary("and", g.binary("ge", target, 0), g.binary("lt", target, logits.shape[1]))
        loss = g.where(valid, lse - g.gather(logits, (0, target), (n,)), 0.0)
    return _reduce(loss, reduction)


def binary_cross_entropy(p: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """-(t log p + (1 - t) log(1 - p)), each logarithm clamped at -100 (as PyTorch)."""
    g = p.graph
    _same_shape("binary_cross_entropy", p, target)
    log_p = g.maximum(g.unary("log", p), -100.0)
    log_q = g.maximum(g.unary("log", 1.0 - p), -100.0)
    return _reduce(-(target * log_p + (1.0 - target) * log_q), reduction)


def binary_cross_entropy_with_logits(x: Tensor, target: Tensor,
                                     reduction: str = "mean") -> Tensor:
    """Stable form: max(x, 0) - x t + log1p(exp(-|x|))."""
    g = x.graph
    _same_shape("binary_cross_entropy_with_logits", x, target)
    loss = g.maximum(x, 0.0) - x * target + g.unary("log1p", g.unary("exp", -abs(x)))
    return _reduce(loss, reduction)
