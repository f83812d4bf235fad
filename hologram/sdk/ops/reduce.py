"""Softmax, reductions and losses."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from hologram.errors import DTypeError, IndexOutOfRangeError, ShapeError
from hologram.frontend import functional as F
from hologram.frontend.graph import Tensor
from hologram.isa import dtypes as dt
from hologram.runtime.buffer import Buffer
from hologram.sdk.ops.dispatch import (
    Op,
    axes_of,
    check_dim,
    native_op,
    run,
    split,
)

# --- softmax and reductions -------------------------------------------------------------

def _softmax(x: Tensor, dim: int) -> Tensor:
    if x.ndim == 0:  # as torch: the softmax of one element
        return F.softmax(x.reshape(1), 0).reshape()
    return F.softmax(x, dim)


_SOFTMAX = Op("softmax", _softmax, floating=True)


def softmax(*args, out: Buffer | None = None, dim: int = -1):
    """Softmax along ``dim`` (default the last): ``exp(x - max) / sum(exp(x - max))``."""
    ex, (x,), out, n = split("softmax", args, 1, out, None)  # n after out: refused by run
    return run(_SOFTMAX, ex, (x,), out, n, (("dim", check_dim("softmax", x, dim)),))


softmax = native_op(_SOFTMAX, softmax, 1)


def _reduction(kind: str):
    def build(x: Tensor, axes, keepdim):
        g = x.graph
        reduced = axes or range(x.ndim)  # None and () reduce every dimension
        if kind in ("min", "max") and any(x.shape[d] == 0 for d in reduced):
            raise ShapeError(f"{kind} of an empty extent has no identity; reduce over "
                             "non-empty dimensions")
        if kind == "mean":
            return g.mean(x, axes, keepdim)
        if kind == "sum" and not x.dtype.is_float:
            x = g.cast(x, dt.int64)
        return g.reduce(kind, x, axes, keepdim)
    return build


_REDUCE = {kind: Op(f"reduce_{kind}", _reduction(kind), floating=kind == "mean",
                    takes_n=True) for kind in ("sum", "min", "max", "mean")}


def _reducer(kind: str, name: str) -> Callable:
    op = _REDUCE[kind]

    def call(*args, out: Buffer | None = None, n: int | None = None, dim=None,
             keepdim: bool = False):
        ex, (x,), out, n = split(name, args, 1, out, n)
        axes = axes_of(name, x if n is None else np.empty(0), dim)
        return run(op, ex, (x,), out, n, (("axes", axes), ("keepdim", bool(keepdim))))

    call.__name__ = call.__qualname__ = name
    call.__doc__ = (f"{kind} over ``dim`` (an int or a tuple; None, the default, or ``()``: "
                    "every element, as in torch.sum), keeping reduced dimensions as 1 when "
                    "``keepdim``.")
    return native_op(op, call, 1)


reduce_sum = _reducer("sum", "reduce_sum")
reduce_min = _reducer("min", "reduce_min")
reduce_max = _reducer("max", "reduce_max")
sum = _reducer("sum", "sum")
min = _reducer("min", "min")
max = _reducer("max", "max")
mean = _reducer("mean", "mean")


# --- losses -----------------------------------------------------------------------------

def _float_pair(name: str, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    g = a.graph
    target = dt.float32 if not a.dtype.is_float else a.dtype
    return (a if a.dtype is target else g.cast(a, target),
            b if b.dtype is target else g.cast(b, target))


def _loss(name: str, fn: Callable) -> Callable:
    def build(pred, target, reduction):
        pred, target = _float_pair(name, pred, target)
        return fn(pred, target, reduction)

    op = Op(name, build, promote=False)

    def call(*args, out: Buffer | None = None, reduction: str = "mean"):
        ex, inputs, out, n = split(name, args, 2, out, None)
        _reduction_name(name, reduction)
        return run(op, ex, inputs, out, n, (("reduction", reduction),))

    call.__name__ = call.__qualname__ = name
    return native_op(op, call, 2)


def _reduction_name(name: str, reduction: object) -> None:
    if reduction not in F.REDUCTIONS:
        raise ShapeError(f"{name}: reduction must be one of {', '.join(F.REDUCTIONS)}, got "
                         f"{reduction!r}")


def _cross_entropy(logits: Tensor, target: Tensor, reduction: str) -> Tensor:
    if not isinstance(logits, Tensor) or not isinstance(target, Tensor):  # hg.jit: numbers
        raise DTypeError("logits and targets are buffers (inside hg.jit, arguments of the "
                         "function), not Python numbers")
    g = logits.graph
    if not logits.dtype.is_float:
        logits = g.cast(logits, dt.float32)
    if target.dtype.is_float and target.dtype is not logits.dtype:
        target = g.cast(target, logits.dtype)
    if target.dtype.is_bool:
        raise DTypeError("targets are class indices (integers) or probabilities (floats), "
                         "not bool")
    if not target.dtype.is_float and target.dtype is not dt.int64:
        # class indices are compared with C in their dtype: int8/uint8 would wrap
        target = g.cast(target, dt.int64)
    if logits.ndim == 1:  # one sample, as torch accepts: reduction "none" gives a 0-d loss
        logits = logits.reshape(1, logits.shape[0])
        target = target.reshape(1, target.shape[0]) if target.ndim == 1 else target.reshape(1)
        loss = F.cross_entropy(logits, target, reduction)
        return loss.reshape() if reduction == "none" else loss
    return F.cross_entropy(logits, target, reduction)


mse_loss = _loss("mse_loss", F.mse_loss)
mse_loss.__doc__ = "mean((pred - target)**2) (``reduction``: mean, sum or none)."
binary_cross_entropy_loss = _loss("binary_cross_entropy_loss", F.binary_cross_entropy)
binary_cross_entropy_loss.__doc__ = ("-(t log p + (1-t) log(1-p)) for probabilities p, logs "
                                     "clamped at -100 like PyTorch.")


def _check_class_indices(operands: tuple) -> None:
    """Every class index in ``[0, C)``, else IndexOutOfRangeError naming the first one
    outside. Read on the host: a view of host memory, a copy of device memory (N values,
    against the N x C logits the kernel reads)."""
    logits, target = operands
    labels = target.to_numpy() if type(target) is Buffer else np.asarray(target)
    if labels.dtype.kind not in "iu":
        return
    classes = logits.shape[-1]
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        at = np.unravel_index(int(np.argmax((labels < 0) | (labels >= classes))),
                              labels.shape)
        where = f" at {[int(i) for i in at]}" if labels.ndim else ""
        raise IndexOutOfRangeError(
            f"cross_entropy_loss(logits {list(logits.shape)} {logits.dtype}, class indices "
            f"{list(labels.shape)} {labels.dtype}): class index {labels[at]}{where} is out "
            f"of range for {classes} classes; class indices lie in [0, {classes - 1}]")


def _traced_class_check(operands: tuple) -> list:
    """Inside hg.jit: the class indices out of range, for the function to raise after its
    launch."""
    logits, target = operands  # tensors (the op's build refused numbers)
    if not target.dtype.is_int or not math.prod(target.shape):
        return []
    g, classes = target.graph, logits.shape[-1]
    index = target if target.dtype is dt.int64 else g.cast(target, dt.int64)
    bad = g.binary("or", g.binary("lt", index, 0), g.binary("ge", index, classes))
    message = (f"cross_entropy_loss(logits {list(logits.shape)} {logits.dtype.storage}, "
               f"class indices {list(target.shape)} {target.dtype.storage}), in hg.jit: "
               f"class index {{}} is out of range for {classes} classes; class indices lie "
               f"in [0, {classes - 1}]")
    return [(bad, index, lambda value: IndexOutOfRangeError(message.format(value)))]


# Class indices (operand 1) index the last dimension of the logits (operand 0): the native
# path checks that range before each launch and leaves a call with a bad index to the
# general path, where _check_class_indices raises.
_CE = Op("cross_entropy_loss", _cross_entropy, promote=False, check=_check_class_indices,
         index_ranges=((1, 0, -1),), trace_check=_traced_class_check)


def cross_entropy_loss(*args, out: Buffer | None = None, reduction: str = "mean"):
    """Cross-entropy of ``logits [N, C]`` against class indices ``[N]`` (an integer buffer)
    or class probabilities ``[N, C]`` (a float buffer), like ``torch.nn.functional
    .cross_entropy``. A class index outside ``[0, C)`` raises
    :class:`~hologram.IndexOutOfRangeError` (checked on the host before each launch, in C
    on the native path; inside ``hg.jit``, by the program, and raised after its
    launch)."""
    ex, inputs, out, n = split("cross_entropy_loss", args, 2, out, None)
    _reduction_name("cross_entropy_loss", reduction)
    return run(_CE, ex, inputs, out, n, (("reduction", reduction),))


cross_entropy_loss = native_op(_CE, cross_entropy_loss, 2)
