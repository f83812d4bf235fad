"""Elementwise kernels: arithmetic and comparisons (broadcasting, PyTorch's type
promotion), unary math, ``where``/``masked_fill``/``clamp``, activations and the backward
ops of their autograd formulas.

Every op is a function of values in a *compute dtype* (PyTorch's "opmath": half types
compute in float32) producing a result cast to the op's result dtype. One builder,
:func:`_build`, serves them all: the per-op part is a small function of graph values.
Cases PyTorch defines but that have no exact Atlas form (integer division, whose
division by zero raises; integer ``pow``; complex dtypes) run on the CPU fallback.
"""

from __future__ import annotations

import math

import torch

from hologram.frontend import functional
from hologram.isa import dtypes as dt
from hologram_torch.aten import program
from hologram_torch.aten.program import ISA, Unsupported, cast
from hologram_torch.aten.registry import impl, native_or_cpu, overload
from hologram_torch.fallback import run_on_cpu

OPINFO = (
    "add", "sub", "mul", "div.no_rounding_mode", "true_divide", "maximum", "minimum",
    "pow", "eq", "ne", "lt", "le", "gt", "ge", "neg", "abs", "exp", "exp2", "expm1", "log",
    "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "sign", "floor", "ceil", "round",
    "trunc", "sin", "cos", "tanh", "sigmoid", "erf", "clamp", "clamp_min", "clamp_max",
    "where", "masked_fill", "nn.functional.relu", "nn.functional.gelu", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_not", "logical_and", "logical_or", "logical_xor",
    "logical_not", "isnan", "isposinf", "isneginf",
    "nn.functional.silu", "nn.functional.leaky_relu", "nn.functional.hardtanh",
)


def _build(g, *args):
    """``fn`` on the inputs cast to ``compute`` (except positions in ``keep``), cast to
    ``result``. ``fn`` is part of the compiled-kernel key: pass functions made once, never
    a lambda made per call (each would compile anew)."""
    *inputs, (fn, compute, result, keep, extra) = args
    values = [x if i in keep else cast(x, compute) for i, x in enumerate(inputs)]
    return cast(fn(g, *values, *extra), result)


def _compute(result: torch.dtype) -> dt.DType:
    return program.opmath(ISA[result])


def _pointwise(name: str, fn, args: tuple, result: torch.dtype,
               compute: dt.DType | None = None, out=None, keep=(), extra=()):
    """``fn`` on ``args`` (see :func:`_build`); NotImplemented for operands no kernel
    takes (e.g. a complex dtype), which then run through the CPU fallback."""
    if result not in ISA:
        return NotImplemented
    spec = _spec(fn, result, compute, keep, extra)
    try:
        return program.run(name, _build, args, (spec,), out)
    except Unsupported:
        return NotImplemented


def _spec(fn, result: torch.dtype, compute: dt.DType | None, keep=(), extra=()) -> tuple:
    """The static part of a pointwise kernel's key (what :func:`_build` unpacks)."""
    return (fn, compute or _compute(result), ISA[result], keep, extra)


def _unary_fresh(name: str, fn, self: torch.Tensor, result: torch.dtype, extra=()):
    """``fn(self)`` into a fresh tensor, the kernel remembered under ``self``'s signature so
    that the next call finds it straight from there (see :func:`_remembered`)."""
    r = _pointwise(name, fn, (self,), result, extra=extra)
    if r is not NotImplemented:
        program.remember((name, extra, self.dtype, self.shape, self.stride()), name,
                         (_spec(fn, result, None, (), extra),), (self,))
    return r


def _remembered(name: str, self: torch.Tensor, extra=()) -> torch.Tensor | None:
    """A unary op's fresh result from the kernel :func:`_unary_fresh` remembered, if any:
    the hot path of unary math and activations (no promotion, no general key)."""
    entry = program.shortcuts.get((name, extra, self.dtype, self.shape, self.stride()))
    return None if entry is None else program.launch_fresh(entry, (self,))


def _check_inplace(name: str, self: torch.Tensor, result: torch.dtype, *others) -> None:
    """PyTorch's rules for writing a result into ``self``: the dtype must cast, the
    broadcast shape must be self's, and inputs may not partially overlap it."""
    if not torch.can_cast(result, self.dtype):
        raise RuntimeError(f"result type {_short(result)} can't be cast to the desired "
                           f"output type {_short(self.dtype)}")
    base = self.untyped_storage().data_ptr()
    for o in others:
        if isinstance(o, torch.Tensor) and not o.is_cpu:
            if o.dim() > self.dim() or any(
                    n != m and n != 1 for n, m in zip(reversed(o.shape), reversed(self.shape))):
                raise RuntimeError(
                    f"output with shape {list(self.shape)} doesn't match the broadcast "
                    f"shape {list(torch.broadcast_shapes(self.shape, o.shape))}")
            if (o.untyped_storage().data_ptr() == base
                    and (o.data_ptr() != self.data_ptr() or o.stride() != self.stride())):
                raise RuntimeError(
                    f"{name}: unsupported operation: some elements of the input tensor and "
                    "the written-to tensor refer to a single memory location. Please clone() "
                    "the tensor before performing the operation.")


def _short(dtype: torch.dtype) -> str:
    return {torch.float32: "Float", torch.float64: "Double", torch.int64: "Long",
            torch.int32: "Int", torch.bool: "Bool", torch.float16: "Half",
            torch.bfloat16: "BFloat16", torch.int16: "Short", torch.int8: "Char",
            torch.uint8: "Byte"}.get(dtype, str(dtype))


def _fit_out(out: torch.Tensor, shape) -> torch.Tensor:
    if tuple(out.shape) != tuple(shape):
        out.resize_(shape)
    return out


def _native(*xs) -> bool:
    return all(not isinstance(x, torch.Tensor) or x.dtype in ISA for x in xs)


def _shape(*xs) -> tuple[int, ...]:
    """The broadcast shape of the tensors among ``xs`` (torch.broadcast_shapes is slow)."""
    shapes = [x.shape for x in xs if isinstance(x, torch.Tensor)]
    first = shapes[0]
    if all(s == first for s in shapes):
        return tuple(first)
    rank = max(len(s) for s in shapes)
    result = [1] * rank
    for s in shapes:
        for i, n in enumerate(s, rank - len(s)):
            if n != 1:
                if result[i] not in (1, n):
                    raise RuntimeError(f"shapes {[list(s) for s in shapes]} do not broadcast")
                result[i] = n
    return tuple(result)


# --- binary ops -------------------------------------------------------------------------

def _binary(name: str, fn, self, other, alpha=1, out=None, inplace=False,
            floating=False, compare=False):
    """``fn(a, b)`` (or ``fn(a, b, alpha)``) with broadcasting and promotion, into a new
    tensor, ``out``, or ``self`` (in place)."""
    shortcut = None
    if (out is None and not inplace and alpha == 1 and isinstance(other, torch.Tensor)
            and isinstance(self, torch.Tensor) and not other.is_cpu and not self.is_cpu):
        # Two device tensors into a fresh result, the hot case: a signature of the operands
        # finds the kernel without promotion or the general key (see program.shortcuts).
        shortcut = (name, fn, floating, compare, self.dtype, self.shape, self.stride(),
                    other.dtype, other.shape, other.stride())
        entry = program.shortcuts.get(shortcut)
        if entry is not None:
            return program.launch_fresh(entry, (self, other))
    common = torch.result_type(self, other)
    result = torch.bool if compare else common
    if floating and not result.is_floating_point:
        result = torch.get_default_dtype()
    if result not in ISA or (isinstance(alpha, float) and not result.is_floating_point):
        return NotImplemented
    compute = ISA[common] if compare else _compute(result)
    args = (self, other) if alpha == 1 else (self, other, alpha)
    if inplace:
        _check_inplace(name, self, result, other)
        out = self
    elif out is not None:
        out = _fit_out(out, _shape(self, other))
    r = _pointwise(name, fn, args, result, compute, None if out is None else (out,))
    if shortcut is not None and r is not NotImplemented:
        program.remember(shortcut, name, (_spec(fn, result, compute),), args)
    return r if out is None or r is NotImplemented else out


def _arithmetic(name: str, fn, fn_alpha=None, floating=False, bool_ok=True):
    def ok(self, other):
        return bool_ok or torch.result_type(self, other) is not torch.bool

    if fn_alpha is not None:
        def functional(self, other, alpha=1):
            if not ok(self, other):
                return NotImplemented
            return _binary(name, fn if alpha == 1 else fn_alpha, self, other, alpha)

        def inplace(self, other, alpha=1):
            if not ok(self, other):
                return NotImplemented
            return _binary(name, fn if alpha == 1 else fn_alpha, self, other, alpha,
                           inplace=True)

        def out_variant(self, other, alpha=1, *, out):
            if not ok(self, other):
                return NotImplemented
            return _binary(name, fn if alpha == 1 else fn_alpha, self, other, alpha, out)
    else:
        def functional(self, other):
            return _binary(name, fn, self, other, floating=floating) if ok(self, other) \
                else NotImplemented

        def inplace(self, other):
            return _binary(name, fn, self, other, inplace=True, floating=floating) \
                if ok(self, other) else NotImplemented

        def out_variant(self, other, *, out):
            return _binary(name, fn, self, other, out=out, floating=floating) \
                if ok(self, other) else NotImplemented

    op = overload(f"{name}.Tensor")

    def hot(self, other, alpha=1):
        # The registered name.Tensor kernel. Two device tensors into a fresh result (the
        # commonest call of all) take the remembered kernel with no other Python frame:
        # after a large kernel has flushed the caches, every frame and lookup costs (this
        # one saves ~6 µs there); the rest goes the general way, then to the CPU fallback.
        if (alpha == 1 and isinstance(other, torch.Tensor) and isinstance(self, torch.Tensor)
                and not other.is_cpu and not self.is_cpu):
            entry = program.shortcuts.get((name, fn, floating, False, self.dtype, self.shape,
                                           self.stride(), other.dtype, other.shape,
                                           other.stride()))
            if entry is not None:
                return program.launch_fresh(entry, (self, other))
        r = functional(self, other, alpha) if fn_alpha is not None else functional(self, other)
        return run_on_cpu(op, self, other, alpha=alpha) if r is NotImplemented else r

    impl(f"{name}.Tensor")(hot)
    native_or_cpu(f"{name}.Scalar")(functional)
    native_or_cpu(f"{name}_.Tensor", f"{name}_.Scalar")(inplace)
    native_or_cpu(f"{name}.out")(out_variant)


def _add(g, a, b):
    return g.binary("or", a, b) if a.dtype is dt.bool_ else a + b


def _mul(g, a, b):
    return g.binary("and", a, b) if a.dtype is dt.bool_ else a * b


_arithmetic("add", _add, lambda g, a, b, alpha: _add(g, a, _mul(g, b, cast(alpha, a.dtype))))
_arithmetic("sub", lambda g, a, b: a - b, lambda g, a, b, alpha: a - b * cast(alpha, a.dtype),
            bool_ok=False)
_arithmetic("mul", _mul)
_arithmetic("div", lambda g, a, b: a / b, floating=True)


def torch_max(g, a, b):
    """PyTorch's CPU maximum of two values: NaN if either is NaN, else the larger and, on a
    tie, the first operand, so ``max(-0.0, +0.0)`` is -0.0 (``std::max`` in its scalar
    kernels; clamp, relu6 and hardtanh with number bounds follow it at every size). The
    ISA's ``max`` orders -0.0 below +0.0 in either order instead (docs/isa.md)."""
    return _first_on_tie(g, a, b, g.maximum(a, b))


def torch_min(g, a, b):
    """PyTorch's CPU minimum of two values (see :func:`torch_max`)."""
    return _first_on_tie(g, a, b, g.minimum(a, b))


def _first_on_tie(g, a, b, extreme):
    if not extreme.dtype.is_float:
        return extreme  # equal integers are the same value
    return g.where(g.binary("eq", a, b), a, extreme)


def _minmax(name: str):
    # One function per op, made once: the builder is part of the compiled-kernel key.
    pick = torch_max if name == "maximum" else torch_min

    def fn(g, a, b):
        return pick(g, a, b)

    def functional(self, other):
        return _binary(name, fn, self, other)

    def out_variant(self, other, *, out):
        return _binary(name, fn, self, other, out=out)

    native_or_cpu(name)(functional)
    native_or_cpu(f"{name}.out")(out_variant)


_minmax("maximum")
_minmax("minimum")


def _predicate(name: str, fn, overloads: tuple[str, str, str]) -> None:
    """A boolean-valued binary op (comparisons, logical ops): its functional, out= and
    in-place kernels, registered for the overload suffixes ``overloads`` (each may name
    several, comma-separated)."""

    def functional(self, other):
        return _binary(name, fn, self, other, compare=True)

    def out_variant(self, other, *, out):
        return _binary(name, fn, self, other, out=out, compare=True)

    def inplace(self, other):
        return _binary(name, fn, self, other, inplace=True, compare=True)

    for kernel, suffixes in zip((functional, out_variant, inplace), overloads):
        native_or_cpu(*(name + suffix for suffix in suffixes.split(",")))(kernel)


def _comparison(name: str):
    def fn(g, a, b):
        return g.binary(name, a, b)

    _predicate(name, fn, (".Tensor,.Scalar", ".Tensor_out,.Scalar_out", "_.Tensor,_.Scalar"))


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _comparison(_name)


# --- pow: exponents PyTorch computes specially are specialized at compile time ----------

_POW = {2.0: lambda g, x: x * x, 3.0: lambda g, x: x * x * x,
        0.5: lambda g, x: g.unary("sqrt", x), -0.5: lambda g, x: g.unary("rsqrt", x),
        -1.0: lambda g, x: 1.0 / x, -2.0: lambda g, x: 1.0 / (x * x),
        1.0: lambda g, x: x}


def _pow(g, x, exponent):
    return g.binary("pow", x, exponent)


def _pow_scalar(g, x, exponent):
    return _POW[exponent](g, x)


@native_or_cpu("pow.Tensor_Scalar")
def pow_tensor_scalar(self, exponent):
    result = torch.result_type(self, exponent)
    if not result.is_floating_point or not _native(self) or isinstance(exponent, complex):
        return NotImplemented  # integer pow stays integral in torch: exact on the CPU
    if float(exponent) in _POW:
        return _pointwise("pow", _pow_scalar, (self,), result, extra=(float(exponent),))
    return _pointwise("pow", _pow, (self, float(exponent)), result)


@native_or_cpu("pow.Tensor_Tensor")
def pow_tensor_tensor(self, exponent):
    result = torch.result_type(self, exponent)
    if not result.is_floating_point or not _native(self, exponent):
        return NotImplemented
    return _pointwise("pow", _pow, (self, exponent), result)


# --- unary math -------------------------------------------------------------------------

def _unary(name: str, fn, floating: bool, int_fn=None, bools: bool = False):
    """``name``, ``name_`` and ``name.out``. ``floating``: integer inputs give the default
    float dtype (``exp(int)``); otherwise the dtype is kept, and ``int_fn`` (if any) is
    the function for integers (``floor`` of an integer is itself)."""

    def plan(self):
        if not _native(self) or (self.dtype is torch.bool and not (floating or bools)):
            return None
        if self.dtype.is_floating_point or not floating:
            result = self.dtype
        else:
            result = torch.get_default_dtype()
        f = int_fn if int_fn is not None and not self.dtype.is_floating_point else fn
        return f, result

    def inplace(self):
        p = plan(self)
        if p is None or p[1] is not self.dtype:
            return NotImplemented
        _check_inplace(name, self, p[1])
        return _pointwise(name, p[0], (self,), p[1], out=(self,))

    def out_variant(self, *, out):
        p = plan(self)
        if p is None:
            return NotImplemented
        r = _pointwise(name, p[0], (self,), p[1], out=(_fit_out(out, self.shape),))
        return r if r is NotImplemented else out

    op = overload(name)

    def functional(self):
        # The registered kernel: a remembered kernel with no other Python frame (see the
        # binary ops' `hot`), else compiled and remembered, else the CPU fallback.
        entry = program.shortcuts.get((name, (), self.dtype, self.shape, self.stride()))
        if entry is not None:
            return program.launch_fresh(entry, (self,))
        p = plan(self)
        r = NotImplemented if p is None else _unary_fresh(name, p[0], self, p[1])
        return run_on_cpu(op, self) if r is NotImplemented else r

    impl(name)(functional)
    native_or_cpu(f"{name}_")(inplace)
    native_or_cpu(f"{name}.out")(out_variant)


def _identity(g, x):
    return x


for _name in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin",
              "cos", "tanh", "sigmoid", "erf"):
    _unary(_name, (lambda op: lambda g, x: g.unary(op, x))(_name), floating=True)
for _name in ("floor", "ceil", "round", "trunc"):
    _unary(_name, (lambda op: lambda g, x: g.unary(op, x))(_name), floating=False,
           int_fn=_identity)
for _name in ("neg", "abs"):
    _unary(_name, (lambda op: lambda g, x: g.unary(op, x))(_name), floating=False)


def _sign(g, x):
    # torch: sign(NaN) = 0 and sign(-0.0) = +0.0 (the ISA's sign keeps both)
    if not x.dtype.is_float:
        return g.unary("sign", x)
    return g.cast(g.binary("gt", x, 0.0), x.dtype) - g.cast(g.binary("lt", x, 0.0), x.dtype)


_unary("sign", _sign, floating=False)
_unary("reciprocal", lambda g, x: 1.0 / x, floating=True)


# --- selection: where, masked_fill, clamp -----------------------------------------------

def _where(g, cond, a, b):
    return g.where(cond, a, b)


@native_or_cpu("where.self")
def where(condition, self, other):
    result = torch.result_type(self, other)
    if condition.dtype is not torch.bool or not _native(self, other):
        return NotImplemented
    return _pointwise("where", _where, (condition, self, other), result, keep=(0,))


@native_or_cpu("where.self_out")
def where_out(condition, self, other, *, out):
    result = torch.result_type(self, other)
    if condition.dtype is not torch.bool or not _native(self, other):
        return NotImplemented
    r = _pointwise("where", _where, (condition, self, other), result, keep=(0,),
                   out=(_fit_out(out, _shape(condition, self, other)),))
    return r if r is NotImplemented else out


def _masked_fill(g, self, mask, value):
    return g.where(mask, value, self)


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


@native_or_cpu("masked_fill.Scalar", "masked_fill.Tensor")
def masked_fill(self, mask, value):
    value = _fill_plan(self, mask, value)
    if value is None:
        return NotImplemented
    return _pointwise("masked_fill", _masked_fill, (self, mask, value), self.dtype, keep=(1,))


@native_or_cpu("masked_fill_.Scalar", "masked_fill_.Tensor")
def masked_fill_(self, mask, value):
    value = _fill_plan(self, mask, value)
    if value is None:
        return NotImplemented
    _check_inplace("masked_fill_", self, self.dtype, mask)
    return _pointwise("masked_fill", _masked_fill, (self, mask, value), self.dtype,
                      keep=(1,), out=(self,))


def _clamp(g, x, *bounds_and_which):
    *bounds, which = bounds_and_which
    bounds = iter(bounds)
    if "min" in which:
        x = torch_max(g, x, next(bounds))
    if "max" in which:
        x = torch_min(g, x, next(bounds))
    return x


def _clamp_call(name, self, lo, hi, out=None, inplace=False):
    which = ("min" if lo is not None else "") + ("max" if hi is not None else "")
    if not which:
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
        out = _fit_out(out, _shape(self, *bounds))
    r = _pointwise(name, _clamp, (self, *bounds), result, extra=(which,),
                   out=None if out is None else (out,))
    return r if out is None or r is NotImplemented else out


@native_or_cpu("clamp", "clamp.Tensor")
def clamp(self, min=None, max=None):
    return _clamp_call("clamp", self, min, max)


@native_or_cpu("clamp_", "clamp_.Tensor")
def clamp_(self, min=None, max=None):
    return _clamp_call("clamp_", self, min, max, inplace=True)


@native_or_cpu("clamp.out", "clamp.Tensor_out")
def clamp_out(self, min=None, max=None, *, out):
    return _clamp_call("clamp", self, min, max, out=out)


@native_or_cpu("clamp_min", "clamp_min.Tensor")
def clamp_min(self, min):
    return _clamp_call("clamp_min", self, min, None)


@native_or_cpu("clamp_min_", "clamp_min_.Tensor")
def clamp_min_(self, min):
    return _clamp_call("clamp_min_", self, min, None, inplace=True)


@native_or_cpu("clamp_max", "clamp_max.Tensor")
def clamp_max(self, max):
    return _clamp_call("clamp_max", self, None, max)


@native_or_cpu("clamp_max_", "clamp_max_.Tensor")
def clamp_max_(self, max):
    return _clamp_call("clamp_max_", self, None, max, inplace=True)


@native_or_cpu("clamp_min.out", "clamp_min.Tensor_out")
def clamp_min_out(self, min, *, out):
    return _clamp_call("clamp_min", self, min, None, out=out)


@native_or_cpu("clamp_max.out", "clamp_max.Tensor_out")
def clamp_max_out(self, max, *, out):
    return _clamp_call("clamp_max", self, None, max, out=out)


# --- activations and their backward ops -------------------------------------------------

def _float(*xs) -> bool:
    return all(not isinstance(x, torch.Tensor) or (x.dtype in ISA and x.dtype.is_floating_point)
               for x in xs)


def _activation(name: str, fn, *, inplace: bool = True, ints: bool = False, defaults=()):
    """``name(self, *scalars)`` (and ``name_``): float inputs (ints too if ``ints``).
    ``defaults``: the schema's default scalars (a boxed call may leave them out)."""

    def functional(self, *scalars):
        if not scalars and not defaults:
            r = _remembered(name, self)
            if r is not None:
                return r
        scalars = scalars + defaults[len(scalars):]
        if not (_float(self) or (ints and _native(self) and self.dtype is not torch.bool)):
            return NotImplemented
        if not scalars:
            return _unary_fresh(name, fn, self, self.dtype)
        return _pointwise(name, fn, (self, *scalars), self.dtype)

    def in_place(self, *scalars):
        scalars = scalars + defaults[len(scalars):]
        if not (_float(self) or (ints and _native(self) and self.dtype is not torch.bool)):
            return NotImplemented
        _check_inplace(f"{name}_", self, self.dtype)
        return _pointwise(name, fn, (self, *scalars), self.dtype, out=(self,))

    native_or_cpu(name)(functional)
    if inplace:
        native_or_cpu(f"{name}_")(in_place)


def _backward(name: str, fn):
    """``name(grad_output, saved, *scalars)``: the gradient, in grad_output's dtype."""

    def kernel(grad_output, saved, *scalars):
        if not _float(grad_output, saved):
            return NotImplemented
        return _pointwise(name, fn, (grad_output, saved, *scalars),
                          torch.promote_types(grad_output.dtype, saved.dtype))

    native_or_cpu(name)(kernel)


def _relu(g, x):
    # where(x < 0, 0, x), not max(x, 0): torch keeps NaN and -0.0
    return g.where(g.binary("lt", x, 0), 0, x)


def _sigmoid_backward(g, grad, y):
    return grad * (1.0 - y) * y


def _tanh_backward(g, grad, y):
    return grad * (1.0 - y * y)


_activation("relu", _relu, ints=True)
_backward("threshold_backward",
          lambda g, grad, x, threshold: g.where(g.binary("le", x, threshold), 0.0, grad))
_activation("silu", lambda g, x: x * g.unary("sigmoid", x))


def _silu_backward(g, grad, x):
    s = g.unary("sigmoid", x)
    return grad * s * (x * (1.0 - s) + 1.0)


_backward("silu_backward", _silu_backward)
_backward("sigmoid_backward", _sigmoid_backward)
_backward("tanh_backward", _tanh_backward)


def _gelu(g, x, approximate):
    return functional.gelu(x, approximate)


@native_or_cpu("gelu")
def gelu(self, approximate="none"):
    r = _remembered("gelu", self, (approximate,))
    if r is not None:
        return r
    if not _float(self):
        return NotImplemented
    return _unary_fresh("gelu", _gelu, self, self.dtype, (approximate,))


@native_or_cpu("gelu_")
def gelu_(self, approximate="none"):
    if not _float(self):
        return NotImplemented
    return _pointwise("gelu", _gelu, (self,), self.dtype, extra=(approximate,), out=(self,))


def _gelu_backward(g, grad, x, approximate):
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        t = g.unary("tanh", (x + x * x * x * 0.044715) * k)
        inner = (x * x * (3 * 0.044715) + 1.0) * k
        return grad * ((t + 1.0) * 0.5 + x * 0.5 * (1.0 - t * t) * inner)
    cdf = (g.unary("erf", x * (1.0 / math.sqrt(2.0))) + 1.0) * 0.5
    pdf = g.unary("exp", x * x * -0.5) * (1.0 / math.sqrt(2.0 * math.pi))
    return grad * (cdf + x * pdf)


@native_or_cpu("gelu_backward")
def gelu_backward(grad_output, self, approximate="none"):
    if not _float(grad_output, self):
        return NotImplemented
    return _pointwise("gelu_backward", _gelu_backward, (grad_output, self),
                      grad_output.dtype, extra=(approximate,))


def _leaky_relu(g, x, slope):
    return g.where(g.binary("gt", x, 0.0), x, x * slope)


_activation("leaky_relu", _leaky_relu, defaults=(0.01,))


@native_or_cpu("leaky_relu_backward")
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    if not _float(grad_output, self):
        return NotImplemented
    return _pointwise("leaky_relu_backward", _leaky_relu_backward,
                      (grad_output, self, negative_slope), grad_output.dtype)


def _leaky_relu_backward(g, grad, x, slope):
    return g.where(g.binary("gt", x, 0.0), grad, grad * slope)


def _hardtanh(g, x, lo, hi):
    return torch_min(g, torch_max(g, x, lo), hi)


_activation("hardtanh", _hardtanh, ints=True, defaults=(-1, 1))


def _hardtanh_backward(g, grad, x, lo, hi):
    outside = g.binary("or", g.binary("le", x, lo), g.binary("ge", x, hi))
    return g.where(outside, 0.0, grad)


_backward("hardtanh_backward", _hardtanh_backward)


# --- bitwise and logical ops, isnan -------------------------------------------------------

def _bitwise(name: str, op: str):
    def fn(g, a, b):
        return g.binary(op, a, b)

    def ok(self, other):
        return not torch.result_type(self, other).is_floating_point

    def functional(self, other):
        return _binary(name, fn, self, other) if ok(self, other) else NotImplemented

    def inplace(self, other):
        return _binary(name, fn, self, other, inplace=True) if ok(self, other) \
            else NotImplemented

    def out_variant(self, other, *, out):
        return _binary(name, fn, self, other, out=out) if ok(self, other) else NotImplemented

    native_or_cpu(f"{name}.Tensor", f"{name}.Scalar")(functional)
    native_or_cpu(f"{name}_.Tensor", f"{name}_.Scalar")(inplace)
    native_or_cpu(f"{name}.Tensor_out")(out_variant)


for _name in ("and", "or", "xor"):
    _bitwise(f"bitwise_{_name}", _name)


def _truth(g, x):
    return x if x.dtype is dt.bool_ else g.binary("ne", x, 0)


def _logical(name: str, op: str):
    def fn(g, a, b):
        return g.binary(op, _truth(g, a), _truth(g, b))

    _predicate(name, fn, ("", ".out", "_"))


for _name in ("and", "or", "xor"):
    _logical(f"logical_{_name}", _name)


def _logical_not(g, x):
    return g.unary("not", _truth(g, x))


@native_or_cpu("logical_not")
def logical_not(self):
    return _pointwise("logical_not", _logical_not, (self,), torch.bool, ISA.get(self.dtype))


@native_or_cpu("logical_not.out")
def logical_not_out(self, *, out):
    r = _pointwise("logical_not", _logical_not, (self,), torch.bool, ISA.get(self.dtype),
                   out=(_fit_out(out, self.shape),))
    return r if r is NotImplemented else out


def _bitwise_not(g, x):
    return g.unary("not", x)


_unary("bitwise_not", _bitwise_not, floating=False, bools=True)


@native_or_cpu("isnan")
def isnan(self):
    return _pointwise("isnan", _isnan, (self,), torch.bool, ISA.get(self.dtype))


def _isnan(g, x):
    return g.binary("ne", x, x)


def _infinity_test(name: str, value: float):
    def fn(g, x):
        return g.binary("eq", x, value)

    def functional(self):
        if not self.dtype.is_floating_point:  # integers are never infinite
            return _pointwise(name, _isnan, (self,), torch.bool, ISA.get(self.dtype))
        return _pointwise(name, fn, (self,), torch.bool, ISA.get(self.dtype))

    def out_variant(self, *, out):
        r = functional(self)
        if r is NotImplemented:
            return r
        _fit_out(out, self.shape).copy_(r)
        return out

    native_or_cpu(name)(functional)
    native_or_cpu(f"{name}.out")(out_variant)


_infinity_test("isposinf", math.inf)
_infinity_test("isneginf", -math.inf)
