"""Elementwise ops, copy and fill."""

from __future__ import annotations

from collections.abc import Callable

from hologram.errors import DTypeError, ShapeError
from hologram.frontend import functional as F
from hologram.frontend.graph import Graph, Tensor
from hologram.runtime.buffer import Buffer
from hologram.runtime.executor import Executor
from hologram.runtime.launch import launch_cache
from hologram.sdk.jit import Traced, in_place_error
from hologram.sdk.ops.dispatch import (
    Op,
    Scalar,
    convert,
    first_n,
    native_op,
    run,
    scalar,
    split,
)

# --- elementwise ------------------------------------------------------------------------

def _elementwise(name: str, arity: int, build: Callable, floating: bool = False,
                 doc: str = "") -> Callable:
    op = Op(name, build, floating=floating, elementwise=True, takes_n=True)
    validated = launch_cache().recent  # a miss falls back to the general path

    # The hot form, op(ex, *inputs, out), skips the general path once a call with the same
    # buffers' shapes, dtypes and executor has been validated by it (the launch cache's
    # second kind of key, see dispatch): freed buffers have no launch_key and miss, so do
    # mixed executors (never recorded), and an out sharing memory with an input other than
    # by identity takes the general path, which stages it.
    if arity == 1:
        def call(*args, out: Buffer | None = None, n: int | None = None):
            if len(args) == 3 and out is None is n:
                ex, x, y = args
                try:
                    launch = validated((op, x.launch_key, y.launch_key, ex.token))
                except (AttributeError, TypeError):
                    launch = None
                if launch is not None and (y.allocation is not x.allocation or y is x):
                    launch((x.handle, y.handle))
                    return y
            ex, inputs, out, n = split(name, args, arity, out, n)
            return run(op, ex, inputs, out, n)
    else:
        def call(*args, out: Buffer | None = None, n: int | None = None):
            if len(args) == 4 and out is None is n:
                ex, a, b, c = args
                try:
                    launch = validated((op, a.launch_key, b.launch_key, c.launch_key,
                                        ex.token))
                except (AttributeError, TypeError):
                    launch = None
                if launch is not None and (
                        (c.allocation is not a.allocation or c is a)
                        and (c.allocation is not b.allocation or c is b)):
                    launch((a.handle, b.handle, c.handle))
                    return c
            ex, inputs, out, n = split(name, args, arity, out, n)
            return run(op, ex, inputs, out, n)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = doc
    return native_op(op, call, arity)


def _relu(x: Tensor) -> Tensor:
    if x.dtype.is_bool:
        return x
    return x.graph.maximum(x, 0)


def _abs(x: Tensor) -> Tensor:
    if x.dtype.is_bool:
        raise DTypeError("abs is not defined for bool; cast to an integer dtype")
    return abs(x)


def _neg(x: Tensor) -> Tensor:
    if x.dtype.is_bool:
        raise DTypeError("negation is not defined for bool; use a logical not")
    return -x


def _arith(kind: str) -> Callable:
    def build(a, b):
        for t in (a, b):
            if isinstance(t, Tensor) and t.dtype.is_bool:
                raise DTypeError(f"{kind} is not defined for bool buffers; cast to an integer "
                                 "dtype")
        return (a.graph if isinstance(a, Tensor) else b.graph).binary(kind, a, b)
    return build


def _graph(*xs) -> Graph:
    return next(x.graph for x in xs if isinstance(x, Tensor))


vector_add = _elementwise("vector_add", 2, _arith("add"), doc="a + b")
vector_sub = _elementwise("vector_sub", 2, _arith("sub"), doc="a - b")
vector_mul = _elementwise("vector_mul", 2, _arith("mul"), doc="a * b")
vector_div = _elementwise("vector_div", 2, _arith("div"), floating=True,
                          doc="a / b (true division: integer inputs give float32)")
vector_min = _elementwise("vector_min", 2, lambda a, b: _graph(a, b).minimum(a, b),
                          doc="elementwise minimum (NaN if either is NaN)")
vector_max = _elementwise("vector_max", 2, lambda a, b: _graph(a, b).maximum(a, b),
                          doc="elementwise maximum (NaN if either is NaN)")
vector_abs = _elementwise("vector_abs", 1, _abs, doc="|x|")
vector_neg = _elementwise("vector_neg", 1, _neg, doc="-x")
vector_relu = _elementwise("vector_relu", 1, _relu, doc="max(x, 0) (NaN stays NaN)")
relu = _elementwise("relu", 1, _relu, doc="max(x, 0) (NaN stays NaN)")
scalar_add = _elementwise("scalar_add", 2, _arith("add"), doc="x + scalar")
scalar_mul = _elementwise("scalar_mul", 2, _arith("mul"), doc="x * scalar")
exp = _elementwise("exp", 1, lambda x: x.graph.unary("exp", x), floating=True, doc="e**x")
log = _elementwise("log", 1, lambda x: x.graph.unary("log", x), floating=True,
                   doc="natural logarithm (log(0) = -inf, log(x<0) = NaN)")
sqrt = _elementwise("sqrt", 1, lambda x: x.graph.unary("sqrt", x), floating=True,
                    doc="square root (sqrt(x<0) = NaN, sqrt(-0.0) = -0.0)")
pow = _elementwise("pow", 2, lambda a, b: _graph(a, b).binary("pow", a, b), floating=True,
                   doc="a ** b (C pow semantics; integer inputs compute in float32)")
sigmoid = _elementwise("sigmoid", 1, lambda x: x.graph.unary("sigmoid", x), floating=True,
                       doc="1 / (1 + e**-x)")
tanh = _elementwise("tanh", 1, lambda x: x.graph.unary("tanh", x), floating=True,
                    doc="hyperbolic tangent")

_GELU = Op("gelu", F.gelu, floating=True, elementwise=True, takes_n=True)


def gelu(*args, out: Buffer | None = None, n: int | None = None, approximate: str = "none"):
    """GELU, ``x * Φ(x)``: exact (``approximate="none"``, erf) or ``"tanh"``."""
    ex, (x,), out, n = split("gelu", args, 1, out, n)
    if approximate not in ("none", "tanh"):
        raise ShapeError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return run(_GELU, ex, (x,), out, n, (("approximate", approximate),))


gelu = native_op(_GELU, gelu, 1)


def _clip_op(low: bool, high: bool) -> Op:
    def build(x, *bounds):
        g, it = x.graph, iter(bounds)
        if low:
            x = g.maximum(x, next(it))
        if high:
            x = g.minimum(x, next(it))
        return x

    return Op("vector_clip", build, elementwise=True, takes_n=True)


_CLIP = {(low, high): _clip_op(low, high) for low in (False, True) for high in (False, True)}


def vector_clip(*args, out: Buffer | None = None, n: int | None = None,
                min: Scalar | Buffer | None = None, max: Scalar | Buffer | None = None):
    """Clamp to ``[min, max]``: ``vector_clip([ex,] x, min, max, [out], [n])`` or with
    ``min=``/``max=`` (either may be None). NaN stays NaN, as in ``torch.clamp``."""
    ex = None
    if args and type(args[0]) is Executor:
        ex, args = args[0], args[1:]
    if not args:
        raise ShapeError("vector_clip: takes the buffer to clip")
    x, rest = args[0], list(args[1:])
    if rest and min is None and max is None:
        min = rest.pop(0)
        max = rest.pop(0) if rest else None
    elif rest and not isinstance(rest[0], Buffer | Traced) and rest[0] is not None:
        # a number after x with a keyword bound: clip(x, 0.0, max=6.0)
        if min is not None:
            raise ShapeError("vector_clip: min given both by position and keyword")
        min = rest.pop(0)
    if min is None and max is None:
        raise ShapeError("vector_clip: give min, max or both")
    _, _, out, n = split("vector_clip", (x, *rest), 1, out, n)
    bounds = tuple(b for b in (min, max) if b is not None)
    return run(_CLIP[(min is not None, max is not None)], ex, (x, *bounds), out, n)


clip = vector_clip


# --- copy and fill ----------------------------------------------------------------------

_COPY = Op("copy", lambda x: x.graph.copy(x), promote=False, elementwise=True, takes_n=True,
           casting="unsafe")


def copy(*args, out: Buffer | None = None, n: int | None = None):
    """``copy([ex,] src, [dst], [n])``: dst takes src's values, converted to dst's dtype
    (any conversion, like ``ndarray.astype``, except that floats convert to integers by
    truncating and saturating, NaN to 0, as the ISA's cast does); src and dst hold the same
    number of elements
    (read row-major). Without dst, a new buffer."""
    ex, (src,), out, n = split("copy", args, 1, out, n)
    if n is None and type(src) is Buffer and type(out) is Buffer and src.shape != out.shape:
        if src.size != out.size:
            raise ShapeError(f"copy: src {list(src.shape)} and dst {list(out.shape)} hold "
                             f"different numbers of elements ({src.size} vs {out.size})")
        src = src.reshape(out.shape)
    return run(_COPY, ex, (src,), out, n)


copy = native_op(_COPY, copy, 1)


_FILL = Op("fill", lambda value, shape: value.graph.copy(value.broadcast_to(shape)),
           promote=False, elementwise=True, takes_n=True)


def fill(*args, n: int | None = None):
    """``fill([ex,] buf, value, [n])``: set every element (or the first n) to ``value``,
    converted to the buffer's dtype; returns ``buf``."""
    ex = None
    if args and type(args[0]) is Executor:
        ex, args = args[0], args[1:]
    if len(args) not in (2, 3):
        raise ShapeError("fill: takes the buffer and the value (and optionally n)")
    buf, value = args[0], args[1]
    n = args[2] if len(args) == 3 else n
    if type(buf) is Traced:
        raise in_place_error("fill", buf)
    if type(buf) is not Buffer:
        raise DTypeError(f"fill: expected a hologram Buffer, got {type(buf).__name__}; wrap "
                         "arrays with ex.from_numpy(x) or hg.from_dlpack(x), or use "
                         "ndarray.fill for NumPy arrays")
    value = scalar(_FILL, value)
    target = buf if n is None else first_n(_FILL, (buf,), None, n)[0][0]
    run(_FILL, ex, (convert(value, buf.dtype, "fill"),), target, None,
         (("shape", target.shape),))
    return buf
