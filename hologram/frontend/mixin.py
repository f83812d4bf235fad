"""Python operators, written once, for every array-like value of Hologram.

Three classes carry ``+ - * / ** @``, their reflected forms, unary ``-`` and ``abs()``:
:class:`~hologram.frontend.graph.Tensor` (a graph node), :class:`~hologram.Buffer` (device
memory, ops run eagerly) and :class:`~hologram.sdk.jit.Traced` (a placeholder inside
``hg.jit``). Each inherits :class:`OperatorMixin` and implements its one hook,
:meth:`OperatorMixin._apply`, as tinygrad's ``ElementwiseMixin.alu`` does.

Buffers and traced values compute their operators with the SDK's ops
(:mod:`hologram.sdk.ops`), which sit above the runtime that defines ``Buffer``. So that the
runtime never imports the SDK, they inherit :class:`SdkOperators`, whose hook looks the op
up in a table the SDK fills when it is imported (:func:`register_sdk_operators`). Importing
``hologram`` imports the SDK, so the table is always filled for users.

The shape helpers every ``reshape`` shares (one extent may be -1) live here too.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

from hologram.errors import HologramError, ShapeError

#: The operator names :meth:`OperatorMixin._apply` receives.
OPERATORS = ("add", "sub", "mul", "div", "pow", "matmul", "neg", "abs")


class OperatorMixin:
    """Arithmetic operators over one hook, :meth:`_apply`.

    ``a + b`` calls ``a._apply("add", a, b)``; ``2 - a`` calls ``a._apply("sub", 2, a)``;
    ``-a`` calls ``a._apply("neg", a)``. The operand order is the operation's, so a hook
    never has to know which side it was called from. Returning ``NotImplemented`` makes
    Python raise its usual ``TypeError`` (a class without ``**``, say).
    """

    __slots__ = ()

    def _apply(self, op: str, *operands: object) -> object:
        """Compute operator ``op`` (one of :data:`OPERATORS`) on ``operands``."""
        raise NotImplementedError

    def __add__(self, o): return self._apply("add", self, o)
    def __radd__(self, o): return self._apply("add", o, self)
    def __sub__(self, o): return self._apply("sub", self, o)
    def __rsub__(self, o): return self._apply("sub", o, self)
    def __mul__(self, o): return self._apply("mul", self, o)
    def __rmul__(self, o): return self._apply("mul", o, self)
    def __truediv__(self, o): return self._apply("div", self, o)
    def __rtruediv__(self, o): return self._apply("div", o, self)
    def __pow__(self, o): return self._apply("pow", self, o)
    def __rpow__(self, o): return self._apply("pow", o, self)
    def __matmul__(self, o): return self._apply("matmul", self, o)
    def __neg__(self): return self._apply("neg", self)
    def __abs__(self): return self._apply("abs", self)


#: operator name -> the SDK op computing it; filled by :func:`register_sdk_operators`.
_sdk_operators: dict[str, Callable] = {}


def register_sdk_operators(table: dict[str, Callable]) -> None:
    """Called once by :mod:`hologram.sdk.ops`: the ops behind the operators of buffers and
    traced values (the keys of :data:`OPERATORS`, plus ``fill`` and ``copy`` for
    :meth:`hologram.Buffer.fill` and :meth:`hologram.Buffer.copy_from`)."""
    _sdk_operators.update(table)


def sdk_operator(name: str) -> Callable:
    """The SDK op registered for ``name``."""
    try:
        return _sdk_operators[name]
    except KeyError:
        raise HologramError(f"{name}: the SDK's ops are not loaded; import hologram (or "
                            "hologram.sdk.ops) before using buffer operators") from None


class SdkOperators(OperatorMixin):
    """Operators that run the SDK's ops (buffers eagerly, traced values into the trace)."""

    __slots__ = ()

    def _apply(self, op: str, *operands: object) -> object:
        return sdk_operator(op)(*operands)


# --- shapes -----------------------------------------------------------------------------

#: The most dimensions a buffer may have (NumPy's limit).
MAX_NDIM = 64


def as_shape(shape: object, where: str, *, infer: bool = False) -> tuple[int, ...]:
    """An int or a sequence of ints as a shape of non-negative extents (``infer``: one
    extent may be -1, as in ``reshape``)."""
    try:
        dims = (operator.index(shape),) if not hasattr(shape, "__len__") else tuple(
            operator.index(n) for n in shape)
    except TypeError:
        raise ShapeError(f"{where}: a shape is an int or a sequence of ints, got {shape!r}"
                         ) from None
    if len(dims) > MAX_NDIM:
        raise ShapeError(f"{where}: shape has {len(dims)} dimensions; at most {MAX_NDIM} are "
                         "supported")
    if infer and dims.count(-1) > 1:
        raise ShapeError(f"{where}: only one extent of shape {list(dims)} may be -1")
    if any(n < (-1 if infer else 0) for n in dims):
        raise ShapeError(f"{where}: negative extent in shape {list(dims)}; extents are >= 0"
                         + (" (or one -1 to infer it)" if infer else ""))
    return dims


def reshaped(shape: tuple, size: int, current: tuple[int, ...],
             where: str = "reshape") -> tuple[int, ...]:
    """The new shape of a ``reshape(*shape)`` call on a value of ``size`` elements and shape
    ``current``: ``shape`` may be the extents or one sequence of them, and one extent may be
    -1 (inferred). Raises :class:`ShapeError` when the shape cannot hold ``size``
    elements."""
    shape = shape[0] if len(shape) == 1 and hasattr(shape[0], "__len__") else shape
    dims = list(as_shape(shape, where, infer=True))
    asked = list(dims)
    if -1 in dims:
        known = math.prod(n for n in dims if n != -1)
        if known and size % known == 0:
            dims[dims.index(-1)] = size // known
    if math.prod(dims) != size or -1 in dims:
        raise ShapeError(f"{where}: cannot view {list(current)} ({size} elements) as {asked}; "
                         f"the new shape must hold {size} elements")
    return tuple(dims)
