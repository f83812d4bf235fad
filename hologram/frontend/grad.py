"""Reverse-mode differentiation of :mod:`hologram.frontend.graph` programs.

    g = Tape("bias_gelu_backward")
    x = g.input("x", "f32", (64, 128))
    b = g.input("b", "f32", (128,))
    y = functional.gelu(x + b)                    # recorded op by op
    dy = g.input("dy", "f32", (64, 128))
    dx, db = gradients([y], [dy], [x, b])         # graph tensors of x's and b's shapes
    g.output("dx", dx)
    g.output("db", db)                            # forward and backward: one program

A :class:`Tape` is a :class:`~hologram.frontend.graph.Graph` that records every operation
it builds (the graph's primitives: ``unary``, ``binary``, ``where``, ``fma``, ``cast``,
``copy``, ``reduce``, ``matmul``, ``gather``, ``scatter``, ``arange``; composites such as
``mean`` or :mod:`hologram.frontend.functional` are recorded as the primitives they call).
:func:`gradients` walks the record backwards, applying each primitive's derivative rule,
written with the same graph ops, on the same graph: the backward reads the forward's
values where it needs them, and the compiler fuses both into as few kernels as their data
flow allows (the forward's values a backward does not use are dead code).

Views (permutes, slices, integer indices, broadcasts, reshapes) cost nothing in the
forward and have no rule of their own: gradients are accumulated per *buffer*, and a
gradient reaching a view is moved to its buffer by the view's affine map (summed over the
dimensions it broadcasts, written back through its strides, zero elsewhere).

The rules are PyTorch's (``tools/autograd/derivatives.yaml``): ``max``/``min`` of two
tensors split the gradient of ties in halves (``torch.maximum``), of a tensor and a number
pass it where the tensor is kept (``torch.clamp``); a reduction by ``max``/``min`` splits
it evenly among the maxima (``torch.amax``); ``abs`` has gradient 0 at 0; rounding and
``sign`` have gradient 0; ``pow`` has PyTorch's special cases at a zero base or exponent.
Gradients flow through floating-point values only (integer and bool values, comparisons,
indices, ``arange``, ``argmax`` carry none). Operations without a rule (a ``prod``
reduction, a scatter that multiplies or takes maxima, ``mod`` with respect to its
divisor) raise :class:`~hologram.errors.GradientError` when a gradient has to pass
through them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hologram.errors import GradientError, ShapeError
from hologram.frontend.graph import Graph, Tensor, _reduced_axes
from hologram.isa.dtypes import DType
from hologram.isa.ir import IndexMap

__all__ = ["GradientError", "Tape", "gradients", "rehome", "sum_to"]


@dataclass(frozen=True, eq=False)
class Node:
    """One recorded primitive: ``op`` applied to ``args`` (graph tensors, numbers and the
    op's other arguments) with ``params``, giving ``out``."""

    op: str
    args: tuple
    params: dict
    out: Tensor


class Tape(Graph):
    """A graph that records its primitive operations for :func:`gradients`.

    A primitive called by another (``matmul``'s reshapes, ``scatter``'s copy) is part of
    the outer one and is not recorded on its own.

    ``on``: build into that graph's program instead of a new one (what a lowering given
    a graph does); :meth:`adopt` moves its tensors onto the tape, and :func:`rehome`
    moves results back."""

    def __init__(self, name: str = "main", on: Graph | None = None):
        super().__init__(name)
        # Temporaries are named apart from those of ``on`` and of other tapes on it (a
        # program's buffer names are unique): by the buffer count when the tape began.
        self._prefix = "t"
        if on is not None:
            self.builder = on.builder
            self._prefix = f"d{len(on.builder.buffers)}_t"
        self.nodes: list[Node] = []
        self._depth = 0

    def _temp(self, dtype, shape):
        self._temps += 1
        return self._whole(self.builder.temp(f"{self._prefix}{self._temps}", dtype, shape))

    def adopt(self, t: Tensor) -> Tensor:
        """``t`` (a tensor of the graph this tape builds into) as a tensor of the tape,
        whose operations are recorded."""
        return rehome(t, self)

    def _record(self, op: str, args: tuple, params: dict, call):
        if self._depth:
            return call()
        self._depth += 1
        try:
            out = call()
        finally:
            self._depth -= 1
        self.nodes.append(Node(op, args, params, out))
        return out

    def unary(self, op, x):
        return self._record("unary", (x,), {"op": op}, lambda: super(Tape, self).unary(op, x))

    def binary(self, op, a, b):
        return self._record("binary", (a, b), {"op": op},
                            lambda: super(Tape, self).binary(op, a, b))

    def where(self, cond, a, b):
        return self._record("where", (cond, a, b), {},
                            lambda: super(Tape, self).where(cond, a, b))

    def fma(self, a, b, c):
        return self._record("fma", (a, b, c), {}, lambda: super(Tape, self).fma(a, b, c))

    def cast(self, x, dtype):
        return self._record("cast", (x,), {}, lambda: super(Tape, self).cast(x, dtype))

    def copy(self, x):
        return self._record("copy", (x,), {}, lambda: super(Tape, self).copy(x))

    def arange(self, n, dtype="i64"):
        return self._record("arange", (), {}, lambda: super(Tape, self).arange(n, dtype))

    def reduce(self, kind, x, axes=None, keepdim=False):
        return self._record("reduce", (x,), {"kind": kind, "axes": axes, "keepdim": keepdim},
                            lambda: super(Tape, self).reduce(kind, x, axes, keepdim))

    def matmul(self, a, b):
        return self._record("matmul", (a, b), {}, lambda: super(Tape, self).matmul(a, b))

    def gather(self, x, coords, shape):
        return self._record("gather", (x,), {"coords": tuple(coords), "shape": tuple(shape)},
                            lambda: super(Tape, self).gather(x, coords, shape))

    def scatter(self, x, coords, values, shape, mode="replace"):
        return self._record(
            "scatter", (x, values),
            {"coords": tuple(coords), "shape": tuple(shape), "mode": mode},
            lambda: super(Tape, self).scatter(x, coords, values, shape, mode))


def rehome(t: Tensor, graph: Graph) -> Tensor:
    """The same view, as a tensor of ``graph`` (which must build the same program)."""
    return Tensor(graph, t.buffer, t.dtype, t.shape, t.strides, t.offset)


# --- gradients --------------------------------------------------------------------------

def gradients(outputs: Sequence[Tensor], grad_outputs: Sequence[Tensor | None],
              wrt: Sequence[Tensor]) -> list[Tensor | None]:
    """The gradients of ``outputs`` (weighted by ``grad_outputs``, tensors of the outputs'
    shapes and dtypes; None: that output contributes nothing) with respect to each tensor
    of ``wrt`` (the program's inputs, or any value of the tape), as graph tensors of their
    shapes and dtypes on the same :class:`Tape`; None for one no gradient reaches (not a
    float, or not used). Raises :class:`GradientError` where a gradient would pass through
    an operation without a derivative rule, and :class:`ShapeError` for a gradient of the
    wrong shape."""
    if not outputs:
        raise GradientError("gradients: no outputs to differentiate")
    g = outputs[0].graph
    if not isinstance(g, Tape):
        raise GradientError("gradients: the outputs were not built on a Tape (build the "
                            "function on hologram.frontend.grad.Tape, not Graph)")
    for i, (out, grad) in enumerate(zip(outputs, grad_outputs, strict=True)):
        if grad is not None and (grad.shape != out.shape or grad.dtype is not out.dtype):
            raise ShapeError(f"gradients: the gradient of output {i} is {grad.dtype.name} "
                             f"{list(grad.shape)}; the output is {out.dtype.name} "
                             f"{list(out.shape)} (pass one of its shape and dtype)")
    needed = _needed(g, {t.buffer for t in wrt if t.dtype.is_float})
    acc = _Accumulator(g)
    for out, grad in zip(outputs, grad_outputs):
        if grad is not None and out.dtype.is_float and out.buffer in needed:
            acc.add(out, grad)
    for node in reversed(list(g.nodes)):
        d = acc.of(node.out)
        if d is None:
            continue
        rule = _RULES[node.op]
        wanted = [isinstance(a, Tensor) and a.dtype.is_float and a.buffer in needed
                  for a in node.args]
        if not any(wanted):
            continue
        for arg, grad in zip(node.args, rule(g, node, d, wanted)):
            if grad is not None:
                acc.add(arg, grad)
    return [acc.of(t) if t.dtype.is_float else None for t in wrt]


def _needed(g: Tape, sources: set[int]) -> set[int]:
    """The buffers whose values depend on ``sources`` (themselves included)."""
    needed = set(sources)
    for node in g.nodes:
        if any(isinstance(a, Tensor) and a.buffer in needed for a in node.args):
            needed.add(node.out.buffer)
    return needed


class _Accumulator:
    """Gradients per buffer, each a flat tensor over the buffer's elements."""

    def __init__(self, g: Tape):
        self.g = g
        self.flat: dict[int, Tensor] = {}

    def add(self, view: Tensor, grad: Tensor) -> None:
        """Add ``grad`` (of ``view``'s shape) to the gradient of ``view``'s buffer."""
        size = math.prod(self.g.builder.buffers[view.buffer].shape)
        flat = _unview(self.g, grad, view, size)
        known = self.flat.get(view.buffer)
        self.flat[view.buffer] = flat if known is None else known + flat

    def of(self, view: Tensor) -> Tensor | None:
        """The gradient of ``view``: its buffer's read through its map, or None."""
        flat = self.flat.get(view.buffer)
        if flat is None:
            return None
        (step,) = flat.strides
        return Tensor(self.g, flat.buffer, flat.dtype, view.shape,
                      tuple(s * step for s in view.strides), flat.offset + view.offset * step)


def _unview(g: Graph, grad: Tensor, view: Tensor, size: int) -> Tensor:
    """``grad`` (a gradient of ``view``) as a gradient of ``view``'s buffer: a flat tensor
    of ``size`` elements, the sum of ``grad``'s elements over those that ``view`` reads
    at each element, 0 where it reads none."""
    # Broadcast dimensions (stride 0) read one element many times: their gradients sum.
    broadcast = tuple(d for d, (n, s) in enumerate(zip(view.shape, view.strides))
                      if s == 0 and n > 1)
    if broadcast:
        grad = g.sum(grad, broadcast)
    kept = [(n, s) for d, (n, s) in enumerate(zip(view.shape, view.strides))
            if d not in broadcast and n != 1]
    grad = grad.reshape(*(n for n, _ in kept))
    offset = view.offset
    flips = []
    for d, (n, s) in enumerate(kept):
        if s < 0:  # a reversed slice: walk it forwards
            offset += s * (n - 1)
            kept[d] = (n, -s)
            flips.append(d)
    if flips:
        grad = _reversed(g, grad, flips)
    order = sorted(range(len(kept)), key=lambda d: -kept[d][1])
    shape = tuple(kept[d][0] for d in order)
    strides = tuple(kept[d][1] for d in order)
    grad = grad.permute(*order)
    # kept has no extent-1 dimensions, so the contiguous map's strides are all row-major
    contiguous = IndexMap.contiguous(shape).strides
    if offset == 0 and math.prod(shape) == size and strides == contiguous:
        return grad.reshape(size)  # the view is its whole buffer, permuted at most
    return _scattered(g, grad, offset, strides, size)


def _reversed(g: Graph, x: Tensor, dims: list[int]) -> Tensor:
    """``x`` with ``dims`` walked backwards (one gather)."""
    coords = []
    for d, n in enumerate(x.shape):
        if d in dims:
            index = g.arange(n).reshape(*(n if e == d else 1 for e in range(x.ndim)))
            coords.append((n - 1) - index)
        else:
            coords.append(d)
    return g.gather(x, tuple(coords), x.shape)


def _scattered(g: Graph, grad: Tensor, offset: int, strides: tuple[int, ...],
               size: int) -> Tensor:
    """A flat tensor of ``size`` elements holding ``grad[i]`` at ``offset + i . strides``
    (strides decreasing and non-overlapping, as every view of a buffer has) and 0
    elsewhere: each element decodes its own coordinates (a gather; no scatter, so the
    kernel runs in parallel)."""
    for d in range(len(strides) - 1):
        if strides[d] <= sum((n - 1) * s for n, s in zip(grad.shape[d + 1:], strides[d + 1:])):
            raise GradientError(f"gradients: a view {list(grad.shape)} with strides "
                                f"{list(strides)} overlaps itself; it cannot be written back")
    rest = g.arange(size) - offset
    valid = g.binary("ge", rest, 0)
    coords = []
    for n, s in zip(grad.shape, strides):
        i = g.binary("div", rest, s)
        rest = g.binary("mod", rest, s)
        valid = g.binary("and", valid, g.binary("lt", i, n))
        coords.append(g.minimum(g.maximum(i, 0), n - 1))
    valid = g.binary("and", valid, g.binary("eq", rest, 0))
    return g.where(valid, g.gather(grad, tuple(coords), (size,)), 0.0)


# --- the rules --------------------------------------------------------------------------
# Each rule(g, node, d, wanted) returns one gradient (or None) per argument of the node,
# for the arguments marked in ``wanted``; ``d`` is the gradient of the node's output.

def _zeros(g: Graph, shape: tuple[int, ...], dtype: DType) -> Tensor:
    """Zeros of ``shape`` (one element, broadcast: a constant the compiler folds)."""
    zero = g.cast(g.arange(1) * 0, dtype)
    return zero.reshape().broadcast_to(shape)


def sum_to(g: Graph, x: Tensor, shape: tuple[int, ...]) -> Tensor:
    """``x`` summed over the dimensions that broadcasting ``shape`` to ``x.shape`` adds
    or stretches (the gradient of a broadcast operand)."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and x.shape[lead + i] != 1)
    if not axes:
        return x
    if axes == tuple(range(len(axes))) and not any(n == 1 for n in shape):
        total = _leading_sum(g, x, len(axes))
        if total is not None:
            return total.reshape(*shape)
    return g.sum(x, axes).reshape(*shape)


#: The fewest rows and columns for which a sum over leading dimensions is a BLAS product.
_BLAS_MIN = 16


def _leading_sum(g: Graph, x: Tensor, lead: int) -> Tensor | None:
    """``x`` (f32 or f64) summed over its first ``lead`` dimensions as ``ones @ x`` (a
    bias's gradient), or None where that is not worth it. A reduction kernel would read
    each column with a stride of a row, and recompute there whatever elementwise chain
    produced ``x`` (fusion copies producers into each consumer); a product makes the
    compiler store ``x`` once and hand it to BLAS. The ones are two rows, as BLAS takes a
    matrix (the first row of the result is the sum)."""
    rows, cols = math.prod(x.shape[:lead]), math.prod(x.shape[lead:])
    if x.dtype.name not in ("f32", "f64") or rows < _BLAS_MIN or cols < _BLAS_MIN:
        return None
    ones = g.copy(_zeros(g, (2, rows), x.dtype) + 1.0)
    return g.matmul(ones, x.reshape(rows, cols))[0]


def _elementwise_result(rule):
    """Wrap an elementwise rule: each operand's gradient summed to its shape."""
    def apply(g, node, d, wanted):
        grads = rule(g, node, d, wanted)
        return [sum_to(g, grad, a.shape) if grad is not None else None
                for a, grad in zip(node.args, grads)]
    return apply


_LN2 = math.log(2.0)

#: unary op -> its gradient from (graph, x, y, d)
_UNARY = {
    "neg": lambda g, x, y, d: -d,
    "abs": lambda g, x, y, d: d * g.unary("sign", x),
    "sqrt": lambda g, x, y, d: d / (y * 2.0),
    "rsqrt": lambda g, x, y, d: d * (y * y * y) * -0.5,
    "exp": lambda g, x, y, d: d * y,
    "exp2": lambda g, x, y, d: d * y * _LN2,
    "expm1": lambda g, x, y, d: d * (y + 1.0),
    "log": lambda g, x, y, d: d / x,
    "log2": lambda g, x, y, d: d / (x * _LN2),
    "log1p": lambda g, x, y, d: d / (x + 1.0),
    "tanh": lambda g, x, y, d: d * (1.0 - y * y),
    "sigmoid": lambda g, x, y, d: d * ((1.0 - y) * y),
    "erf": lambda g, x, y, d: d * (g.unary("exp", -(x * x)) * (2.0 / math.sqrt(math.pi))),
    "sin": lambda g, x, y, d: d * g.unary("cos", x),
    "cos": lambda g, x, y, d: -(d * g.unary("sin", x)),
}
_FLAT = ("sign", "floor", "ceil", "round", "trunc")  # gradient 0


@_elementwise_result
def _unary_rule(g, node, d, wanted):
    op, (x,) = node.params["op"], node.args
    if op in _FLAT:
        return [_zeros(g, x.shape, x.dtype)]
    if op not in _UNARY:
        raise GradientError(f"gradients: unary {op!r} on {x.dtype.name} {list(x.shape)} has "
                            "no derivative rule")
    return [_UNARY[op](g, x, node.out, d)]


def _is(x) -> bool:
    return isinstance(x, Tensor)


@_elementwise_result
def _binary_rule(g, node, d, wanted):
    op, (a, b), y = node.params["op"], node.args, node.out
    wa, wb = wanted
    if op == "add":
        return [d if wa else None, d if wb else None]
    if op == "sub":
        return [d if wa else None, -d if wb else None]
    if op == "mul":
        return [d * b if wa else None, d * a if wb else None]
    if op == "div":
        return [d / b if wa else None, -(d * y) / b if wb else None]
    if op in ("max", "min"):
        return _extremum(g, op, a, b, d, wanted)
    if op == "pow":
        return _pow(g, a, b, y, d, wanted)
    if op == "mod":  # fmod: a - trunc(a / b) * b
        return [d if wa else None,
                -(d * g.unary("trunc", a / b)) if wb else None]
    raise GradientError(f"gradients: binary {op!r} on {y.dtype.name} {list(y.shape)} has no "
                        "derivative rule")


def _extremum(g, op, a, b, d, wanted):
    keeps = "gt" if op == "max" else "lt"  # a wins where a `keeps` b
    if not _is(b) or not _is(a):  # a clamp: the tensor's gradient where it is kept
        t, c = (a, b) if _is(a) else (b, a)
        kept = g.binary("ge" if op == "max" else "le", t, c)
        grad = g.where(kept, d, 0.0)
        return [grad, None] if _is(a) else [None, grad]
    half = g.where(g.binary("eq", a, b), d * 0.5, d)
    return [g.where(g.binary(keeps, b, a), 0.0, half) if wanted[0] else None,
            g.where(g.binary(keeps, a, b), 0.0, half) if wanted[1] else None]


def _pow(g, a, b, y, d, wanted):
    da = db = None
    if wanted[0]:
        if _is(b):
            da = g.where(g.binary("eq", b, 0.0), 0.0, d * b * g.binary("pow", a, b - 1.0))
        elif b == 0:
            da = _zeros(g, a.shape, a.dtype)
        else:
            da = d * b * g.binary("pow", a, b - 1.0)
    if wanted[1]:
        zero_base = g.binary("and", g.binary("eq", a, 0.0), g.binary("ge", b, 0.0)) \
            if _is(a) else None
        log_a = g.unary("log", a) if _is(a) else math.log(a) if a > 0 else float("nan")
        term = d * (y * log_a)
        if zero_base is not None:
            db = g.where(zero_base, 0.0, term)
        elif a == 0:
            db = g.where(g.binary("ge", b, 0.0), 0.0, term)
        else:
            db = term
    return [da, db]


@_elementwise_result
def _where_rule(g, node, d, wanted):
    cond = node.args[0]
    return [None,
            g.where(cond, d, 0.0) if wanted[1] else None,
            g.where(cond, 0.0, d) if wanted[2] else None]


@_elementwise_result
def _fma_rule(g, node, d, wanted):
    a, b = node.args[:2]
    return [d * b if wanted[0] else None, d * a if wanted[1] else None,
            d if wanted[2] else None]


def _cast_rule(g, node, d, wanted):
    (x,) = node.args
    return [g.cast(d, x.dtype) if d.dtype is not x.dtype else d]


def _copy_rule(g, node, d, wanted):
    return [d]


def _arange_rule(g, node, d, wanted):
    return []


def _reduce_rule(g, node, d, wanted):
    (x,) = node.args
    kind = node.params["kind"]
    axes = _reduced_axes(kind, x, node.params["axes"])
    kept = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
    spread = d.reshape(*kept).broadcast_to(x.shape)
    if kind == "sum":
        return [spread]
    if kind in ("max", "min"):
        y = node.out.reshape(*kept).broadcast_to(x.shape)
        hit = g.binary("eq", x, y)
        count = g.sum(g.cast(hit, x.dtype), axes, keepdim=True)
        return [g.where(hit, spread / count, 0.0)]
    raise GradientError(f"gradients: a {kind!r} reduction of {x.dtype.name} {list(x.shape)} "
                        f"over axes {list(axes)} has no derivative rule (write the backward "
                        "yourself)")


def _swap(t: Tensor) -> Tensor:
    """``t`` with its last two dimensions exchanged."""
    order = list(range(t.ndim))
    order[-2:] = order[:-3:-1]
    return t.permute(*order)


def _matmul_rule(g, node, d, wanted):
    a, b = node.args
    a2 = a.reshape(1, a.shape[0]) if a.ndim == 1 else a
    b2 = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
    d2 = d.reshape(*_matmul_out(a2.shape, b2.shape))
    da = db = None
    if wanted[0]:
        da = sum_to(g, g.matmul(d2, _swap(b2)), a2.shape).reshape(*a.shape)
    if wanted[1]:
        db = sum_to(g, g.matmul(_swap(a2), d2), b2.shape).reshape(*b.shape)
    return [da, db]


def _matmul_out(sa: tuple[int, ...], sb: tuple[int, ...]) -> tuple[int, ...]:
    """The result shape of ``matmul`` of two operands of at least two dimensions."""
    rank = max(len(sa), len(sb))
    ba = (1,) * (rank - len(sa)) + sa[:-2]
    bb = (1,) * (rank - len(sb)) + sb[:-2]
    batch = tuple(max(m, n) if 1 in (m, n) else m for m, n in zip(ba[:rank - 2], bb[:rank - 2]))
    return batch + (sa[-2], sb[-1])


def _gather_rule(g, node, d, wanted):
    (x,) = node.args
    zeros = _zeros(g, x.shape, x.dtype)
    return [g.scatter(zeros, node.params["coords"], d, node.params["shape"], "add")]


def _scatter_rule(g, node, d, wanted):
    x, values = node.args
    coords, shape, mode = node.params["coords"], node.params["shape"], node.params["mode"]
    if mode not in ("add", "replace"):
        raise GradientError(f"gradients: a scatter of mode {mode!r} into {x.dtype.name} "
                            f"{list(x.shape)} has no derivative rule (modes 'add' and "
                            "'replace' have)")
    dx = dv = None
    if wanted[0]:
        dx = d if mode == "add" else g.scatter(d, coords, 0.0, shape, "replace")
    if wanted[1]:
        dv = sum_to(g, g.gather(d, coords, shape), values.shape)
    return [dx, dv]


_RULES = {
    "unary": _unary_rule, "binary": _binary_rule, "where": _where_rule, "fma": _fma_rule,
    "cast": _cast_rule, "copy": _copy_rule, "arange": _arange_rule, "reduce": _reduce_rule,
    "matmul": _matmul_rule, "gather": _gather_rule, "scatter": _scatter_rule,
}

