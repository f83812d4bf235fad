"""Elementwise kernels: arithmetic and comparisons (broadcasting, PyTorch's type
promotion), unary math, ``where``/``masked_fill``/``clamp``, activations and the backward
ops of their autograd formulas.

The math of every op is its entry in :mod:`hologram_torch.lowering.elementwise` (the
table torch.compile lowers through too), launched by :func:`from_table.run`; this module adds
the eager parts: ``out=`` and in-place variants (PyTorch's checks), remembered kernels for
the hot calls, and the CPU fallback for what the lowering does not take (integer ``pow``,
complex dtypes, what torch rejects).
"""

from __future__ import annotations

import math
import warnings

import torch

from hologram.errors import ShapeError
from hologram.isa import dtypes as dt
from hologram_torch import memory
from hologram_torch.aten import from_table, layout, runner
from hologram_torch.aten.registry import aten, composed, impl, native_or_cpu, overload
from hologram_torch.aten.runner import ISA, Unsupported, cast
from hologram_torch.fallback import run_on_cpu
from hologram_torch.lowering import elementwise as lowering_ew
from hologram_torch.lowering.common import broadcast_shapes, check_output_shape

OPINFO = (
    "add", "sub", "mul", "div.no_rounding_mode", "true_divide", "maximum", "minimum",
    "pow", "eq", "ne", "lt", "le", "gt", "ge", "neg", "abs", "exp", "exp2", "expm1", "log",
    "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "sign", "floor", "ceil", "round",
    "trunc", "sin", "cos", "tanh", "sigmoid", "erf", "clamp", "clamp_min", "clamp_max",
    "where", "masked_fill", "nn.functional.relu", "nn.functional.gelu", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_not", "logical_and", "logical_or", "logical_xor",
    "logical_not", "isnan", "isposinf", "isneginf",
    "nn.functional.silu", "nn.functional.leaky_relu", "nn.functional.hardtanh",
    "div.trunc_rounding", "div.floor_rounding", "floor_divide", "remainder", "fmod",
)


def _build(g, *args):
    """``fn`` on the inputs cast to ``compute`` (except positions in ``keep``), cast to
    ``result``: the builder of :func:`_pointwise`, for kernels outside the lowering table
    (:mod:`.foreach`). ``fn`` is part of the compiled-kernel key: pass functions made once,
    never a lambda made per call (each would compile anew)."""
    *inputs, (fn, compute, result, keep, extra) = args
    values = [x if i in keep else cast(x, compute) for i, x in enumerate(inputs)]
    return cast(fn(g, *values, *extra), result)


def _compute(result: torch.dtype) -> dt.DType:
    return runner.opmath(ISA[result])


def _spec(fn, result: torch.dtype, compute: dt.DType | None = None, keep=(), extra=()):
    """The static argument of :func:`_build` (see :func:`_pointwise`)."""
    return (fn, compute or _compute(result), ISA[result], keep, extra)


def _pointwise(name: str, fn, args: tuple, result: torch.dtype,
               compute: dt.DType | None = None, out=None, keep=(), extra=()):
    """``fn`` on ``args`` (see :func:`_build`); NotImplemented for operands no kernel
    takes (e.g. a complex dtype), which then run through the CPU fallback."""
    if result not in ISA:
        return NotImplemented
    spec = _spec(fn, result, compute, keep, extra)
    try:
        return runner.run(name, _build, args, (spec,), out, layout=layout.pointwise)
    except Unsupported:
        return NotImplemented
    except ShapeError:  # operands that do not broadcast: PyTorch's error (from_table._launch)
        broadcast_shapes(*(a.shape for a in args if isinstance(a, torch.Tensor)))
        raise


def _lowered(name: str, op, args: tuple, out=None, static=(), kwargs=()):
    """``op``'s lowering (:mod:`hologram_torch.lowering.elementwise`) on ``args``;
    NotImplemented where it has none (the CPU fallback runs the op)."""
    return from_table.run(op, args, static, kwargs, out, name)


def _unary_fresh(name: str, op, self: torch.Tensor, static=()):
    """``op(self)`` into a fresh tensor, the kernel remembered under ``self``'s signature
    so that the next call finds it straight from there (see :func:`_remembered`)."""
    r = _lowered(name, op, (self,), static=static)
    if r is not NotImplemented:
        runner.remember((name, static, self.dtype, self.shape, self.stride()), name,
                         from_table.spec(op, (self,), static), (self,), r)
    return r


def _remembered(name: str, self: torch.Tensor, static=()) -> torch.Tensor | None:
    """A unary op's fresh result from the kernel :func:`_unary_fresh` remembered, if any:
    the hot path of unary math and activations (no promotion, no general key)."""
    entry = runner.shortcuts.get((name, static, self.dtype, self.shape, self.stride()))
    return None if entry is None else runner.launch_fresh(entry, (self,))


def _check_inplace(name: str, self: torch.Tensor, result: torch.dtype, *others) -> None:
    """PyTorch's rules for writing a result into ``self``, in its order: the operands must
    broadcast to self's shape, then the dtype must cast. (Overlapping memory never reaches
    a kernel here: see :func:`registry.native_or_cpu`.)"""
    shapes = [o.shape for o in others if isinstance(o, torch.Tensor)]
    if any(s != self.shape for s in shapes):
        check_output_shape(self.shape, *shapes)
    if not torch.can_cast(result, self.dtype):
        raise RuntimeError(f"result type {_short(result)} can't be cast to the desired "
                           f"output type {_short(self.dtype)}")


def _short(dtype: torch.dtype) -> str:
    return {torch.float32: "Float", torch.float64: "Double", torch.int64: "Long",
            torch.int32: "Int", torch.bool: "Bool", torch.float16: "Half",
            torch.bfloat16: "BFloat16", torch.int16: "Short", torch.int8: "Char",
            torch.uint8: "Byte"}.get(dtype, str(dtype))


def _fit_out(out: torch.Tensor, shape, *operands) -> torch.Tensor:
    """``out`` (an ``out=`` argument) resized to ``shape`` where it differs, and then laid
    out as TensorIterator lays out a resized output: like ``operands``."""
    if tuple(out.shape) != tuple(shape):
        if out.numel():  # PyTorch's resize_output warning, in its words
            warnings.warn(
                f"An output with one or more elements was resized since it had shape "
                f"{list(out.shape)}, which does not match the required output shape "
                f"{list(shape)}. This behavior is deprecated, and in a future PyTorch "
                "release outputs will not be resized unless they have zero elements. You "
                "can explicitly reuse an out tensor t by resizing it, inplace, to zero "
                "elements with t.resize_(0).", UserWarning, stacklevel=2)
        out.resize_(shape)
        strides = layout.elementwise(shape, operands)
        if strides != tuple(out.stride()):
            memory.point_at(out, out.untyped_storage(), out.storage_offset(), shape, strides)
    return out


def _native(*xs) -> bool:
    return all(not isinstance(x, torch.Tensor) or x.dtype in ISA for x in xs)


def _shape(*xs) -> tuple[int, ...]:
    """The broadcast shape of the tensors among ``xs``, PyTorch's error if they do not
    broadcast (torch.broadcast_shapes is slow, and words its error differently)."""
    shapes = [x.shape for x in xs if isinstance(x, torch.Tensor)]
    first = shapes[0]
    if all(s == first for s in shapes):
        return tuple(first)
    return broadcast_shapes(*shapes)


# --- binary ops -------------------------------------------------------------------------

def _fresh_key(name: str, op, self, other) -> tuple | None:
    """The shortcut key of ``op(self, other)`` (see runner.shortcuts; an in-place call's
    is this behind ``"inplace"``) when ``self`` is a device tensor and ``other`` one too,
    or a Python number (``x * 2``: the kernel gets the number's value at launch, and its
    type with ``self``'s dtype decides the result's dtype). Else None."""
    if type(other) in runner.NUMBERS:
        return (name, op, self.dtype, self.shape, self.stride(), type(other))
    if isinstance(other, torch.Tensor) and not other.is_cpu:
        return (name, op, self.dtype, self.shape, self.stride(),
                other.dtype, other.shape, other.stride())
    return None

def _binary(name: str, op, self, other, alpha=1, out=None, inplace=False,
            floating=False, compare=False, kwargs=()):
    """``op(self, other)`` (or ``op(self, other, alpha)``) with broadcasting and promotion,
    into a new tensor, ``out``, or ``self`` (in place). ``kwargs``: the lowering's
    keyword arguments, as pairs (compile-time; ``name`` must tell them apart, since the
    remembered kernels are keyed by it)."""
    shortcut = None
    if (out is None and not inplace and alpha == 1 and isinstance(self, torch.Tensor)
            and not self.is_cpu):
        # A device tensor and a device tensor or a number into a fresh result, the hot
        # case: a signature of the operands finds the kernel without promotion or the
        # general key (see runner.shortcuts).
        shortcut = _fresh_key(name, op, self, other)
        entry = runner.shortcuts.get(shortcut) if shortcut is not None else None
        if entry is not None:
            return runner.launch_fresh(entry, (self, other))
    elif inplace and alpha == 1 and (shortcut := _fresh_key(name, op, self, other)):
        # In place on a device tensor and a device tensor or a number (optimizers' add_,
        # mul_, a counter's += 1): the same kind of signature finds the kernel that
        # writes self. The registry's kernel wrapper has already refused overlapping
        # memory (see registry.native_or_cpu).
        shortcut = ("inplace", *shortcut)
        entry = runner.shortcuts.get(shortcut)
        if entry is not None:
            runner.launch_into(entry, (self, other), self)
            return self
    common = torch.result_type(self, other)
    result = torch.bool if compare else common
    if floating and not result.is_floating_point:
        result = torch.get_default_dtype()
    if result not in ISA or (isinstance(alpha, float) and not result.is_floating_point) or (
            isinstance(alpha, bool) and result is not torch.bool):
        return NotImplemented  # the CPU kernel raises PyTorch's alpha errors
    args = (self, other) if alpha == 1 else (self, other, alpha)
    if inplace:
        _check_inplace(name, self, result, other)
        out = self
    elif out is not None:
        if not torch.can_cast(result, out.dtype):
            return NotImplemented  # the CPU kernel raises PyTorch's error
        out = _fit_out(out, _shape(self, other), self, other)
    r = _lowered(name, op, args, None if out is None else (out,), kwargs=kwargs)
    if shortcut is not None and r is not NotImplemented:
        runner.remember(shortcut, name, from_table.spec(op, args, (), kwargs), args,
                         self if inplace else r, (self,) if inplace else None)
    return r if out is None or r is NotImplemented else out


def _is_bool(x) -> bool:
    return x.dtype is torch.bool if isinstance(x, torch.Tensor) else isinstance(x, bool)


def _arithmetic(name: str, floating=False, bool_ok=True, alpha=True):
    ops = getattr(aten, name)

    def ok(self, other):
        # sub refuses any bool operand, tensor or number (PyTorch's sub_check; its CPU
        # kernel then raises its error)
        return bool_ok or not (_is_bool(self) or _is_bool(other))

    if alpha:
        def functional(self, other, alpha=1):
            if not ok(self, other):
                return NotImplemented
            return _binary(name, ops.Tensor, self, other, alpha)

        def inplace(self, other, alpha=1):
            if not ok(self, other):
                return NotImplemented
            return _binary(name, ops.Tensor, self, other, alpha, inplace=True)

        def out_variant(self, other, alpha=1, *, out):
            if not ok(self, other):
                return NotImplemented
            return _binary(name, ops.Tensor, self, other, alpha, out)
    else:
        def functional(self, other):
            return _binary(name, ops.Tensor, self, other, floating=floating) \
                if ok(self, other) else NotImplemented

        def inplace(self, other):
            return _binary(name, ops.Tensor, self, other, inplace=True, floating=floating) \
                if ok(self, other) else NotImplemented

        def out_variant(self, other, *, out):
            return _binary(name, ops.Tensor, self, other, out=out, floating=floating) \
                if ok(self, other) else NotImplemented

    op = ops.Tensor

    def hot(self, other, alpha=1):
        # The registered name.Tensor kernel. Two device tensors into a fresh result (the
        # commonest call of all) take the remembered kernel with no other Python frame:
        # after a large kernel has flushed the caches, every frame and lookup costs (this
        # one saves ~6 µs there); the rest goes the general way, then to the CPU fallback.
        if alpha == 1 and isinstance(self, torch.Tensor) and not self.is_cpu:
            key = _fresh_key(name, op, self, other)
            entry = runner.shortcuts.get(key) if key is not None else None
            if entry is not None:
                return runner.launch_fresh(entry, (self, other))
        if not alpha_arg:  # mul, div: their schema has no alpha
            r = functional(self, other)
            return run_on_cpu(op, self, other) if r is NotImplemented else r
        r = functional(self, other, alpha)
        return run_on_cpu(op, self, other, alpha=alpha) if r is NotImplemented else r

    alpha_arg = alpha
    impl(f"{name}.Tensor", hot=True)(hot)
    native_or_cpu(f"{name}.Scalar", hot=True)(functional)  # (x * 0.5: attention's scaling)
    native_or_cpu(f"{name}_.Tensor", hot=True)(inplace)
    native_or_cpu(f"{name}_.Scalar")(inplace)
    native_or_cpu(f"{name}.out")(out_variant)


_arithmetic("add")
_arithmetic("sub", bool_ok=False)
_arithmetic("mul", alpha=False)
_arithmetic("div", floating=True, alpha=False)
torch_max = lowering_ew.torch_max
torch_min = lowering_ew.torch_min


def _minmax(name: str):
    op = getattr(aten, name).default

    def functional(self, other):
        return _binary(name, op, self, other)

    def out_variant(self, other, *, out):
        return _binary(name, op, self, other, out=out)

    native_or_cpu(name)(functional)
    native_or_cpu(f"{name}.out")(out_variant)


_minmax("maximum")
_minmax("minimum")


def _predicate(name: str, op, overloads: tuple[str, str, str]) -> None:
    """A boolean-valued binary op (comparisons, logical ops): its functional, out= and
    in-place kernels, registered for the overload suffixes ``overloads`` (each may name
    several, comma-separated)."""

    def functional(self, other):
        return _binary(name, op, self, other, compare=True)

    def out_variant(self, other, *, out):
        return _binary(name, op, self, other, out=out, compare=True)

    def inplace(self, other):
        return _binary(name, op, self, other, inplace=True, compare=True)

    for kernel, suffixes in zip((functional, out_variant, inplace), overloads):
        native_or_cpu(*(name + suffix for suffix in suffixes.split(",")))(kernel)


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _predicate(_name, getattr(aten, _name).Tensor,
               (".Tensor,.Scalar", ".Tensor_out,.Scalar_out", "_.Tensor,_.Scalar"))


# --- integer division: trunc/floor div, //, remainder, fmod ---------------------------------

def _has_zero(x) -> bool:
    """Does the divisor ``x`` (a number, a CPU scalar or a device tensor, read on the host
    through a CPU view: the device's memory is host memory) hold a zero?"""
    if isinstance(x, torch.Tensor):
        host = x if x.is_cpu else memory.cpu_alias(x, read_only=True)
        return x.numel() > 0 and bool(host.eq(0).any())
    return x == 0


def _divide(name: str, op, self, other, kwargs=(), out=None, inplace=False):
    """An integer division on the device (the lowering's, with the ISA's results: INT_MIN
    / -1 wraps to INT_MIN, where the CPU's instruction traps); NotImplemented for float
    results (PyTorch's kernels). A zero divisor raises PyTorch's error, after its shape
    checks and only where there is a result to compute, as its kernels do."""
    result = torch.result_type(self, other)
    if result.is_floating_point or result.is_complex or result is torch.bool:
        return NotImplemented
    if inplace:
        _check_inplace(name, self, result, other)
    if math.prod(_shape(self, other)) and _has_zero(other):
        raise RuntimeError("ZeroDivisionError")
    return _binary(name, op, self, other, out=out, inplace=inplace, kwargs=kwargs)


def _rounding(rounding_mode) -> tuple[str, tuple]:
    return f"div_{rounding_mode}", (("rounding_mode", rounding_mode),)


@native_or_cpu("div.Tensor_mode", "div.Scalar_mode")
def div_mode(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        return _binary("div", aten.div.Tensor, self, other, floating=True)
    if rounding_mode not in ("trunc", "floor"):
        return NotImplemented  # torch raises
    name, kwargs = _rounding(rounding_mode)
    return _divide(name, aten.div.Tensor_mode, self, other, kwargs)


@native_or_cpu("div_.Tensor_mode", "div_.Scalar_mode")
def div_mode_(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        return _binary("div", aten.div.Tensor, self, other, inplace=True, floating=True)
    if rounding_mode not in ("trunc", "floor"):
        return NotImplemented
    name, kwargs = _rounding(rounding_mode)
    return _divide(name, aten.div.Tensor_mode, self, other, kwargs, inplace=True)


@native_or_cpu("div.out_mode")
def div_mode_out(self, other, *, rounding_mode=None, out):
    if rounding_mode not in ("trunc", "floor"):
        return NotImplemented
    name, kwargs = _rounding(rounding_mode)
    return _divide(name, aten.div.Tensor_mode, self, other, kwargs, out=out)


def _integer_division(name: str, functional: str, op, inplace: str, out: str) -> None:
    """``name``'s functional, in-place and out= kernels (overload names, comma-separated)."""

    def kernel(self, other):
        return _divide(name, op, self, other)

    def kernel_(self, other):
        return _divide(name, op, self, other, inplace=True)

    def kernel_out(self, other, *, out):
        return _divide(name, op, self, other, out=out)

    native_or_cpu(*functional.split(","))(kernel)
    native_or_cpu(*inplace.split(","))(kernel_)
    native_or_cpu(*out.split(","))(kernel_out)


_integer_division("floor_divide", "floor_divide,floor_divide.Scalar", aten.floor_divide.default,
                  "floor_divide_.Tensor,floor_divide_.Scalar",
                  "floor_divide.out,floor_divide.Scalar_out")
for _name in ("remainder", "fmod"):
    _integer_division(_name, f"{_name}.Tensor,{_name}.Scalar", getattr(aten, _name).Tensor,
                      f"{_name}_.Tensor,{_name}_.Scalar",
                      f"{_name}.Tensor_out,{_name}.Scalar_out")


# --- pow: exponents PyTorch computes specially are specialized at compile time ----------

@native_or_cpu("pow.Tensor_Scalar")
def pow_tensor_scalar(self, exponent):
    result = torch.result_type(self, exponent)
    if not result.is_floating_point or not _native(self) or isinstance(exponent, complex):
        return NotImplemented  # integer pow stays integral in torch: exact on the CPU
    if float(exponent) in lowering_ew.POW:
        return _lowered("pow", aten.pow.Tensor_Scalar, (self,), static=(float(exponent),))
    return _lowered("pow", aten.pow.Tensor_Scalar, (self, exponent))


@native_or_cpu("pow.Tensor_Tensor")
def pow_tensor_tensor(self, exponent):
    result = torch.result_type(self, exponent)
    if not result.is_floating_point or not _native(self, exponent):
        return NotImplemented
    return _lowered("pow", aten.pow.Tensor_Tensor, (self, exponent))


# --- unary math -------------------------------------------------------------------------

def _unary(name: str, floating: bool, bools: bool = False):
    """``name``, ``name_`` and ``name.out`` (the math: the lowering of ``name``).
    ``floating``: integer inputs give the default float dtype (``exp(int)``); otherwise
    the dtype is kept."""
    op = overload(name)

    def plan(self):
        if not _native(self) or (self.dtype is torch.bool and not (floating or bools)):
            return None
        if self.dtype.is_floating_point or not floating:
            return self.dtype
        return torch.get_default_dtype()

    def inplace(self):
        result = plan(self)
        if result is None or result is not self.dtype:
            return NotImplemented
        _check_inplace(name, self, result)
        return _lowered(name, op, (self,), out=(self,))

    def out_variant(self, *, out):
        result = plan(self)
        if result is None or not torch.can_cast(result, out.dtype):
            return NotImplemented
        r = _lowered(name, op, (self,), out=(_fit_out(out, self.shape, self),))
        return r if r is NotImplemented else out

    def functional(self):
        # The registered kernel: a remembered kernel with no other Python frame (see the
        # binary ops' `hot`), else compiled and remembered, else the CPU fallback.
        entry = runner.shortcuts.get((name, (), self.dtype, self.shape, self.stride()))
        if entry is not None:
            return runner.launch_fresh(entry, (self,))
        r = NotImplemented if plan(self) is None else _unary_fresh(name, op, self)
        return run_on_cpu(op, self) if r is NotImplemented else r

    impl(name, hot=True)(functional)
    native_or_cpu(f"{name}_")(inplace)
    native_or_cpu(f"{name}.out")(out_variant)


for _name in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin",
              "cos", "tanh", "sigmoid", "erf", "reciprocal"):
    _unary(_name, floating=True)
for _name in ("floor", "ceil", "round", "trunc", "neg", "abs", "sign"):
    _unary(_name, floating=False)


# --- selection: where, masked_fill, clamp -----------------------------------------------

@native_or_cpu("where.self")
def where(condition, self, other):
    if condition.dtype is not torch.bool or not _native(self, other):
        return NotImplemented
    return _lowered("where", aten.where.self, (condition, self, other))


@native_or_cpu("where.self_out")
def where_out(condition, self, other, *, out):
    if (condition.dtype is not torch.bool or not _native(self, other)
            or not torch.can_cast(torch.result_type(self, other), out.dtype)):
        return NotImplemented
    r = _lowered("where", aten.where.self, (condition, self, other),
                 out=(_fit_out(out, _shape(condition, self, other), condition, self,
                               other),))
    return r if r is NotImplemented else out


def _fill_plan(self, mask, value):
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            return None
        value = value.item()
    if mask.dtype is not torch.bool or not _native(self):
        return None
    if self.dtype is torch.bool:
        value = bool(value)
    elif not self.dtype.is_floating_point:
        if isinstance(value, float):
            return None  # torch decides (it raises for a non-integral value)
        value = int(value)
    return value


def _stand_in(x):
    """A CPU tensor of ``x``'s dtype and shape holding one element (expanded); ``x``
    itself if not a tensor."""
    if not isinstance(x, torch.Tensor):
        return x
    return torch.zeros((), dtype=x.dtype).expand(x.shape)


def _refuse_mask(fn, self, mask, *rest) -> None:
    """PyTorch's error for a mask that is not boolean (a byte mask is refused, no longer
    deprecated), worded by its CPU kernel run on stand-ins of the operands: not a call of
    the CPU fallback, which would add its warning to PyTorch's."""
    if mask.dtype is not torch.bool:
        fn(_stand_in(self), _stand_in(mask), *map(_stand_in, rest))


@composed("masked_select")
def masked_select(self, mask):
    """The CPU fallback (the result's shape is data), after PyTorch's check of the mask's
    dtype (no fallback, and so no warning of one, for an error)."""
    _refuse_mask(torch.masked_select, self, mask)
    return run_on_cpu(aten.masked_select.default, self, mask)


@native_or_cpu("masked_fill.Scalar", "masked_fill.Tensor")
def masked_fill(self, mask, value):
    _refuse_mask(torch.masked_fill, self, mask, value)
    if mask.shape != self.shape:
        _shape(mask, self)  # PyTorch expands the mask and self together, mask first
    value = _fill_plan(self, mask, value)
    if value is None:
        return NotImplemented
    return _lowered("masked_fill", aten.masked_fill.Scalar, (self, mask, value))


@native_or_cpu("masked_fill_.Scalar", "masked_fill_.Tensor")
def masked_fill_(self, mask, value):
    _refuse_mask(torch.masked_fill, self, mask, value)
    value = _fill_plan(self, mask, value)
    if value is None:
        return NotImplemented
    _check_inplace("masked_fill_", self, self.dtype, mask)
    return _lowered("masked_fill", aten.masked_fill.Scalar, (self, mask, value), out=(self,))


def _clamp_call(name, self, lo, hi, out=None, inplace=False):
    if lo is None and hi is None:
        return NotImplemented  # torch raises: at least one bound is required
    bounds = tuple(b for b in (lo, hi) if b is not None)
    result = self.dtype
    for b in bounds:
        result = torch.promote_types(result, torch.result_type(self, b))
    if not _native(self, *bounds) or result is torch.bool:
        return NotImplemented
    if inplace:
        _check_inplace(name, self, result, *bounds)
        out = self
    elif out is not None:
        if not torch.can_cast(result, out.dtype):
            return NotImplemented  # the CPU kernel raises PyTorch's error
        out = _fit_out(out, _shape(self, *bounds), self, *bounds)
    # the bounds given, by name (None bounds are compile-time: part of the kernel's key)
    op, args = ((aten.clamp_min.default, (self, lo)) if hi is None else
                (aten.clamp_max.default, (self, hi)) if lo is None else
                (aten.clamp.default, (self, lo, hi)))
    r = _lowered(name, op, args, out=None if out is None else (out,))
    return r if out is None or r is NotImplemented else out


def _clamps(name: str, bounds) -> None:
    """``name``, ``name_`` and ``name.out`` (each with its ``.Tensor`` overload).
    ``bounds``: the op's bound arguments, by their schema names and defaults, as (lo, hi),
    None for a bound it does not take."""

    def functional(self, *given, **named):
        return _clamp_call(name, self, *bounds(*given, **named))

    def inplace(self, *given, **named):
        return _clamp_call(f"{name}_", self, *bounds(*given, **named), inplace=True)

    def out_variant(self, *given, out, **named):
        return _clamp_call(name, self, *bounds(*given, **named), out=out)

    native_or_cpu(name, f"{name}.Tensor")(functional)
    native_or_cpu(f"{name}_", f"{name}_.Tensor")(inplace)
    native_or_cpu(f"{name}.out", f"{name}.Tensor_out")(out_variant)


_clamps("clamp", lambda min=None, max=None: (min, max))
_clamps("clamp_min", lambda min: (min, None))
_clamps("clamp_max", lambda max: (None, max))


# --- activations and their backward ops -------------------------------------------------

def _float(*xs) -> bool:
    return all(not isinstance(x, torch.Tensor) or (x.dtype in ISA and x.dtype.is_floating_point)
               for x in xs)


def _activation(name: str, *, inplace: bool = True, ints: bool = False, defaults=()):
    """``name(self, *scalars)`` (and ``name_``): float inputs (ints too if ``ints``).
    ``defaults``: the schema's default scalars (a boxed call may leave them out)."""
    op = overload(name)

    def functional(self, *scalars):
        if not scalars and not defaults:
            r = _remembered(name, self)
            if r is not None:
                return r
        scalars = scalars + defaults[len(scalars):]
        if not (_float(self) or (ints and _native(self) and self.dtype is not torch.bool)):
            return NotImplemented
        if not scalars:
            return _unary_fresh(name, op, self)
        args = (self, *scalars)
        r = _lowered(name, op, args)
        if r is not NotImplemented:  # the front kernel serves it from now on
            runner.remember((name, self.dtype, self.shape, self.stride(),
                              *((type(x), x) for x in scalars)),
                             name, from_table.spec(op, args), args, r)
        return r

    def in_place(self, *scalars):
        scalars = scalars + defaults[len(scalars):]
        if not (_float(self) or (ints and _native(self) and self.dtype is not torch.bool)):
            return NotImplemented
        _check_inplace(f"{name}_", self, self.dtype)
        return _lowered(name, op, (self, *scalars), out=(self,))

    native_or_cpu(name, hot=True)(functional)
    if inplace:
        native_or_cpu(f"{name}_")(in_place)


def _backward(name: str):
    """``name(grad_output, saved, *scalars)``: the gradient (float operands)."""
    op = overload(name)
    threshold = name == "threshold_backward"

    def kernel(grad_output, saved, *scalars):
        if threshold and saved.shape != grad_output.shape:
            _shape(saved, grad_output)  # its TensorIterator takes self first
        if not _float(grad_output, saved):
            return NotImplemented
        args = (grad_output, saved, *scalars)
        r = _lowered(name, op, args)
        if r is not NotImplemented:  # the front kernel serves it from now on
            runner.remember((name, grad_output.dtype, grad_output.shape,
                              grad_output.stride(), saved.dtype, saved.shape, saved.stride()),
                             name, from_table.spec(op, args), args, r)
        return r

    native_or_cpu(name, hot=True)(kernel)


_activation("relu", ints=True)
_activation("silu")
_activation("leaky_relu", defaults=(0.01,))
_activation("hardtanh", ints=True, defaults=(-1, 1))
for _name in ("threshold_backward", "silu_backward", "sigmoid_backward", "tanh_backward",
              "hardtanh_backward"):
    _backward(_name)

# the math of activations, for hologram_torch.functional's autograd functions
_relu = lowering_ew.relu_math
_sigmoid_backward = lowering_ew.sigmoid_backward_math
_tanh_backward = lowering_ew.tanh_backward_math
_gelu_backward = lowering_ew.gelu_backward_math


_GELU = ("none", "tanh")  # torch's approximations (the CPU kernel rejects others)


@native_or_cpu("gelu", hot=True)
def gelu(self, approximate="none"):
    r = _remembered("gelu", self, (approximate,))
    if r is not None:
        return r
    if approximate not in _GELU or not _float(self):
        return NotImplemented
    return _unary_fresh("gelu", aten.gelu.default, self, (approximate,))


@native_or_cpu("gelu_")
def gelu_(self, approximate="none"):
    if approximate not in _GELU or not _float(self):
        return NotImplemented
    return _lowered("gelu", aten.gelu.default, (self,), static=(approximate,), out=(self,))


@native_or_cpu("gelu_backward")
def gelu_backward(grad_output, self, approximate="none"):
    if approximate not in _GELU or not _float(grad_output, self):
        return NotImplemented
    return _lowered("gelu_backward", aten.gelu_backward.default, (grad_output, self),
                    static=(approximate,))


_INPLACE_NEGATIVE_SLOPE = (
    "In-place leakyReLu backward calculation is triggered with a negative slope which is not "
    "supported. This is caused by calling in-place forward function with a negative slope, "
    "please call out-of-place version instead. File an issue at "
    "https://github.com/pytorch/pytorch if you do require supporting in-place leakRelu "
    "backward calculation with negative slope")  # PyTorch's words


@native_or_cpu("leaky_relu_backward")
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    # the saved result of an in-place forward with a negative slope does not tell which
    # inputs were negative: PyTorch refuses, before any other check
    if self_is_result and negative_slope < 0:
        raise RuntimeError(_INPLACE_NEGATIVE_SLOPE)
    if not _float(grad_output, self):
        return NotImplemented
    return _lowered("leaky_relu_backward", aten.leaky_relu_backward.default,
                    (grad_output, self, negative_slope), static=(bool(self_is_result),))


# --- bitwise and logical ops, isnan -------------------------------------------------------

def _bitwise(name: str):
    op = getattr(aten, name).Tensor

    def ok(self, other):
        return not torch.result_type(self, other).is_floating_point

    def functional(self, other):
        return _binary(name, op, self, other) if ok(self, other) else NotImplemented

    def inplace(self, other):
        return _binary(name, op, self, other, inplace=True) if ok(self, other) \
            else NotImplemented

    def out_variant(self, other, *, out):
        return _binary(name, op, self, other, out=out) if ok(self, other) else NotImplemented

    native_or_cpu(f"{name}.Tensor", f"{name}.Scalar")(functional)
    native_or_cpu(f"{name}_.Tensor", f"{name}_.Scalar")(inplace)
    native_or_cpu(f"{name}.Tensor_out")(out_variant)


for _name in ("and", "or", "xor"):
    _bitwise(f"bitwise_{_name}")
    _predicate(f"logical_{_name}", getattr(aten, f"logical_{_name}").default, ("", ".out", "_"))


@native_or_cpu("logical_not")
def logical_not(self):
    return _lowered("logical_not", aten.logical_not.default, (self,))


@native_or_cpu("logical_not.out")
def logical_not_out(self, *, out):
    r = _lowered("logical_not", aten.logical_not.default, (self,),
                 out=(_fit_out(out, self.shape, self),))
    return r if r is NotImplemented else out


_unary("bitwise_not", floating=False, bools=True)


@native_or_cpu("isnan")
def isnan(self):
    return _lowered("isnan", aten.isnan.default, (self,))


def _infinity_test(name: str):
    op = overload(name)

    def functional(self):
        return _lowered(name, op, (self,))

    def out_variant(self, *, out):
        r = functional(self)
        if r is NotImplemented:
            return r
        _fit_out(out, self.shape, self).copy_(r)
        return out

    native_or_cpu(name)(functional)
    native_or_cpu(f"{name}.out")(out_variant)


_infinity_test("isposinf")
_infinity_test("isneginf")
