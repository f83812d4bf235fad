"""gemm, matvec and matmul."""

from __future__ import annotations

import numpy as np

from hologram.errors import DTypeError, ShapeError
from hologram.frontend.graph import Tensor
from hologram.runtime.buffer import Buffer
from hologram.runtime.executor import Executor
from hologram.sdk.jit import Traced
from hologram.sdk.ops.dispatch import (
    Op,
    native_op,
    run,
    split,
)

# --- linear algebra ---------------------------------------------------------------------

def _matrix(name: str, what: str, x: Tensor, rows: int, cols: int) -> Tensor:
    """``x`` read as a row-major [rows, cols] matrix: a buffer of exactly that shape, or a
    1-D buffer whose first rows*cols elements are used."""
    if x.shape == (rows, cols):
        return x
    if x.ndim == 1 and x.shape[0] >= rows * cols:
        return x[: rows * cols].reshape(rows, cols)
    raise ShapeError(f"{what} {list(x.shape)} is not a [{rows}, {cols}] matrix (give a buffer "
                     f"of that shape, or a 1-D one with >= {rows * cols} elements)")


def _gemm(a: Tensor, b: Tensor, m: int, n: int, k: int) -> Tensor:
    if a.dtype.is_bool:
        raise DTypeError("gemm of bool buffers; cast to a numeric dtype")
    return _matrix("gemm", "A", a, m, k) @ _matrix("gemm", "B", b, k, n)


_GEMM = Op("gemm", _gemm)


def _dims(name: str, **dims) -> None:
    for key, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ShapeError(f"{name}: {key} must be a non-negative int, got {value!r}")


def _matrix_args(name: str, operands: str, args: tuple, out: Buffer | None, dims: str):
    """``([executor,] first, second, [out,] [*dims])`` -> (executor, first, second, out,
    the positional dimensions or ()); ``dims`` names them, as the error says."""
    ex = None
    if args and type(args[0]) is Executor:
        ex, args = args[0], args[1:]
    if len(args) < 2:
        raise ShapeError(f"{name}: takes the buffers {operands}")
    first, second, rest = args[0], args[1], list(args[2:])
    if rest and isinstance(rest[0], Buffer | Traced):
        if out is not None:
            raise ShapeError(f"{name}: out given both by position and keyword")
        out = rest.pop(0)
    if rest and len(rest) != dims.count(",") + 1:
        raise ShapeError(f"{name}: positional dimensions are {dims}")
    return ex, first, second, out, tuple(rest)


def gemm(*args, out: Buffer | None = None, m: int | None = None, n: int | None = None,
         k: int | None = None):
    """``C[m, n] = A[m, k] @ B[k, n]``, row-major.

    ``gemm(ex, A, B, C, m=..., n=..., k=...)`` writes C; ``gemm(A, B, m=.., n=.., k=..)``
    returns a new [m, n] buffer. m, n, k may also follow C positionally. Each matrix is a
    buffer of exactly its shape, or a 1-D buffer of at least its number of elements (the
    first ones are used). With 2-D A and B, omitted dimensions are taken from their shapes.
    """
    ex, a, b, out, dims = _matrix_args("gemm", "A and B", args, out, "m, n, k (all three)")
    if dims:
        m, n, k = dims
    shape_a, shape_b = getattr(a, "shape", ()), getattr(b, "shape", ())
    if m is None:
        m = shape_a[0] if len(shape_a) == 2 else None
    if k is None:
        k = shape_a[1] if len(shape_a) == 2 else shape_b[0] if len(shape_b) == 2 else None
    if n is None:
        n = shape_b[1] if len(shape_b) == 2 else None
    if None in (m, n, k):
        raise ShapeError(f"gemm: A {list(shape_a)} and B {list(shape_b)} do not determine m, "
                         "n and k; pass them (m=, n=, k=)")
    _dims("gemm", m=m, n=n, k=k)
    return run(_GEMM, ex, (a, b), out, None, (("m", int(m)), ("n", int(n)), ("k", int(k))))


gemm = native_op(_GEMM, gemm, 2)


def _matvec(a: Tensor, x: Tensor, m: int, n: int) -> Tensor:
    if x.shape != (n,) and not (x.ndim == 1 and x.shape[0] >= n):
        raise ShapeError(f"x {list(x.shape)} is not a vector of {n} elements")
    return _matrix("matvec", "A", a, m, n) @ x[:n]


_MATVEC = Op("matvec", _matvec)


def matvec(*args, out: Buffer | None = None, m: int | None = None, n: int | None = None):
    """``y[m] = A[m, n] @ x[n]``: ``matvec([ex,] A, x, [y], m=, n=)``; with a 2-D A the
    dimensions default to its shape."""
    ex, a, x, out, dims = _matrix_args("matvec", "A and x", args, out, "m, n")
    if dims:
        m, n = dims
    shape_a = getattr(a, "shape", ())
    m = m if m is not None else shape_a[0] if len(shape_a) == 2 else None
    n = n if n is not None else shape_a[1] if len(shape_a) == 2 else None
    if None in (m, n):
        raise ShapeError(f"matvec: A {list(shape_a)} does not determine m and n; pass them")
    _dims("matvec", m=m, n=n)
    return run(_MATVEC, ex, (a, x), out, None, (("m", int(m)), ("n", int(n))))


matvec = native_op(_MATVEC, matvec, 2)


_MATMUL = Op("matmul", lambda a, b: a @ b)


def matmul(*args, out: Buffer | None = None):
    """NumPy ``matmul`` (``a @ b``): batched over leading dimensions, 1-D as vectors."""
    ex, inputs, out, n = split("matmul", args, 2, out, None)
    return run(_MATMUL, ex, inputs, out, n)  # (an n given after out is refused)


matmul = native_op(_MATMUL, matmul, 2)
