"""SDK operations on :class:`~hologram.Buffer` s.

Two calling conventions:

    hg.ops.vector_add(ex, a, b, c)      # executor first, result written into c; returns c
    c = hg.ops.vector_add(a, b)         # the result is a new buffer of a's executor

Generally: ``op([executor,] *inputs, [out,] [n,] **options)``; ``out=`` may also be given by
keyword. ``n`` (elementwise ops, reductions, copy and fill) works on the first ``n``
elements of each buffer, read flat in row-major order. An ``out`` buffer has the result's
shape, or is 1-D with at least the result's number of elements (the C-style
convention: ``reduce_sum(ex, x, out)`` with a one-element ``out``); it may be an input
(``vector_add(ex, a, b, a)``). Its dtype may differ from the result's when NumPy's
``same_kind`` casting allows it (float64 results into float32, not floats into ints).

Shapes and dtypes:

- binary ops broadcast like NumPy;
- dtypes promote like PyTorch: the result is the widest category among the buffers (bool <
  integer < float) and, within it, NumPy's promotion of those buffers' dtypes; Python
  numbers are "weak": they take the buffer's dtype unless they are of a higher category (a
  float with integer buffers gives float32);
- ops that only make sense on floats (division, ``exp``/``log``/``sqrt``/``pow``,
  ``sigmoid``/``tanh``/``gelu``/``softmax``, ``mean``, losses) compute integer and bool
  inputs in float32;
- ``sum`` of bool and integer buffers accumulates in int64; ``min``/``max`` keep the dtype.

NaN-producing inputs are not errors: results follow IEEE 754 (``log(-1)`` is NaN).

Each distinct signature (op, backend, shapes, dtypes, options) compiles one Atlas program
once per process (and reuses the on-disk program cache across processes); a call then
costs a lookup in the launch cache (:func:`hologram.runtime.launch.launch_cache`, bounded,
least recently used evicted) and a native call. Python numbers passed to ops are runtime
arguments, so a new value does not compile a new program. Inside :func:`hologram.jit`, the
same functions add their operation to the traced program instead of running it.
"""

from hologram.frontend.mixin import register_sdk_operators
from hologram.sdk.ops.elementwise import (
    clip,
    copy,
    exp,
    fill,
    gelu,
    log,
    pow,
    relu,
    scalar_add,
    scalar_mul,
    sigmoid,
    sqrt,
    tanh,
    vector_abs,
    vector_add,
    vector_clip,
    vector_div,
    vector_max,
    vector_min,
    vector_mul,
    vector_neg,
    vector_relu,
    vector_sub,
)
from hologram.sdk.ops.linalg import gemm, matmul, matvec
from hologram.sdk.ops.reduce import (
    binary_cross_entropy_loss,
    cross_entropy_loss,
    max,
    mean,
    min,
    mse_loss,
    reduce_max,
    reduce_min,
    reduce_sum,
    softmax,
    sum,
)

# The operators of buffers and traced values (hologram.frontend.mixin) are these ops.
register_sdk_operators({
    "add": vector_add, "sub": vector_sub, "mul": vector_mul, "div": vector_div, "pow": pow,
    "matmul": matmul, "neg": vector_neg, "abs": vector_abs, "fill": fill, "copy": copy,
})

__all__ = [
    "binary_cross_entropy_loss", "clip", "copy", "cross_entropy_loss", "exp", "fill", "gelu",
    "gemm", "log", "matmul", "matvec", "max", "mean", "min", "mse_loss", "pow",
    "reduce_max", "reduce_min", "reduce_sum", "relu", "scalar_add", "scalar_mul", "sigmoid",
    "softmax", "sqrt", "sum", "tanh", "vector_abs", "vector_add", "vector_clip",
    "vector_div", "vector_max", "vector_min", "vector_mul", "vector_neg", "vector_relu",
    "vector_sub",
]
