"""The lowering table and the helpers its entries share: dtype maps, PyTorch's type
promotion on graph values and Python numbers, opmath, casts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hologram.frontend.graph import Tensor
from hologram.isa import dtypes as dt

#: A lowering: ``entry(g, *args, **kwargs)`` -> a graph tensor or a tuple of them.
Lowering = Callable[..., object]

#: ATen overload -> its lowering.
LOWERINGS: dict[torch._ops.OpOverload, Lowering] = {}

aten = torch.ops.aten


class Unsupported(Exception):
    """The arguments are outside what the lowering handles (the op runs eagerly on the CPU
    fallback instead)."""


def register(*ops: torch._ops.OpOverload) -> Callable[[Lowering], Lowering]:
    """Make the decorated function the lowering of each overload in ``ops``."""

    def decorate(fn: Lowering) -> Lowering:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"{op} has two lowerings")
            LOWERINGS[op] = fn
        return fn

    return decorate


def get(op: torch._ops.OpOverload) -> Lowering | None:
    """The lowering of ``op``, or None."""
    return LOWERINGS.get(op)


def lower(op: torch._ops.OpOverload, g, *args, **kwargs):
    """``op``'s result(s) on graph values ``args``. Raises :class:`Unsupported` when ``op``
    has no lowering or these arguments have none."""
    fn = LOWERINGS.get(op)
    if fn is None:
        raise Unsupported(f"{op} has no lowering")
    result = fn(g, *args, **kwargs)
    if result is NotImplemented:
        raise Unsupported(f"{op}: these arguments have no lowering")
    return result


@dataclass(frozen=True, eq=False)
class Number(Tensor):
    """A 0-d graph value standing for a Python number given at run time (bool, i64 or
    f64): promoted as PyTorch promotes a wrapped number, not as a 0-d tensor."""

    @staticmethod
    def of(t: Tensor) -> Number:
        return Number(t.graph, t.buffer, t.dtype, t.shape, t.strides, t.offset)


# --- dtypes -----------------------------------------------------------------------------

ISA: dict[torch.dtype, dt.DType] = {getattr(torch, name): t for t, name in dt.FULL_NAMES.items()}
TORCH: dict[dt.DType, torch.dtype] = {v: k for k, v in ISA.items()}


def isa(dtype: torch.dtype) -> dt.DType:
    """The Atlas dtype of a torch dtype (:class:`Unsupported` for complex and others)."""
    found = ISA.get(dtype)
    if found is None:
        raise Unsupported(f"dtype {dtype}")
    return found


def opmath(dtype: dt.DType) -> dt.DType:
    """The dtype torch computes a float dtype's arithmetic in (half types in float32)."""
    return dt.float32 if dtype in (dt.float16, dt.bfloat16) else dtype


def is_number(x) -> bool:
    """A wrapped number: a Python number or a :class:`Number`."""
    return isinstance(x, (bool, int, float, Number))


def torch_dtype(x) -> torch.dtype:
    """The dtype of a graph value, or of a Python number as a tensor (bool, int64, float64)."""
    if isinstance(x, Tensor):
        return TORCH[x.dtype]
    if isinstance(x, bool):
        return torch.bool
    if isinstance(x, int):
        return torch.int64
    if isinstance(x, float):
        return torch.float64
    raise Unsupported(f"argument {x!r}")


def _combine(higher: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
    if higher is None:
        return lower
    if lower is None or higher.is_floating_point:
        return higher
    if higher is torch.bool or lower.is_floating_point:
        return torch.promote_types(higher, lower)
    return higher


def result_type(*xs) -> torch.dtype:
    """``torch.result_type`` over graph values and numbers (None skipped): dimensioned
    tensors, then 0-d tensors, then wrapped numbers, each a lower priority class that only
    raises the result's category (bool < integer < float)."""
    classes: list[torch.dtype | None] = [None, None, None]
    for x in xs:
        if x is None:
            continue
        t = torch_dtype(x)
        if is_number(x):
            k = 2
            if t.is_floating_point:
                t = torch.get_default_dtype()
        else:
            k = 1 if x.ndim == 0 else 0
        classes[k] = t if classes[k] is None else torch.promote_types(classes[k], t)
    found = _combine(classes[0], _combine(classes[1], classes[2]))
    if found is None:
        raise Unsupported("no operands")
    return found


def cast(x, dtype: dt.DType):
    """A graph value in ``dtype``; a Python number as the Python type of ``dtype`` (graph
    ops give numbers their tensor operand's dtype)."""
    if isinstance(x, Tensor):
        return x if x.dtype is dtype else x.graph.cast(x, dtype)
    if dtype.is_bool:
        return bool(x)
    return float(x) if dtype.is_float else int(x)


def zeros(g, dtype: dt.DType, shape) -> Tensor:
    """Zeros of ``dtype`` and ``shape``: one element broadcast (nothing is stored)."""
    return cast(g.arange(1), dtype)[0].broadcast_to(tuple(shape))


def is_float(x) -> bool:
    return torch_dtype(x).is_floating_point


# --- shapes -----------------------------------------------------------------------------

def broadcast_shapes(*shapes) -> tuple[int, ...]:
    """PyTorch's broadcast of ``shapes`` taken in order, as its TensorIterator folds its
    operands' shapes (``infer_size``), with its error: a RuntimeError naming the first
    mismatching dimension from the right, ``a`` the shape so far and ``b`` the next
    operand's (the graph's own broadcast raises the SDK's ShapeError)."""
    result: tuple[int, ...] = ()
    for shape in shapes:
        shape = tuple(shape)
        if shape == result:
            continue
        ndim = max(len(result), len(shape))
        sizes = []
        for offset in range(ndim):
            a = result[-1 - offset] if offset < len(result) else 1
            b = shape[-1 - offset] if offset < len(shape) else 1
            if a != b and a != 1 and b != 1:
                raise RuntimeError(f"The size of tensor a ({a}) must match the size of "
                                   f"tensor b ({b}) at non-singleton dimension "
                                   f"{ndim - 1 - offset}")
            sizes.append(b if a == 1 else a)
        result = tuple(reversed(sizes))
    return result


def check_output_shape(out_shape, *shapes) -> None:
    """PyTorch's check of an in-place or ``out=`` result that cannot be resized: the
    operands (``out_shape`` first, as TensorIterator takes its output) must broadcast, to
    ``out_shape``."""
    shape = broadcast_shapes(out_shape, *shapes)
    if shape != tuple(out_shape):
        raise RuntimeError(f"output with shape {list(out_shape)} doesn't match the "
                           f"broadcast shape {list(shape)}")
