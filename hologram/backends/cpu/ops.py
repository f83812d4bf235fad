"""The cpu renderer's op table: how each Atlas instruction that is not a memory access,
a constant, an index or a reduction becomes LLVM IR (:data:`OPS`, used by
:meth:`.render.KernelRenderer._emit`).

Each entry is ``(renderer, operand values, operand dtype, result dtype) -> value``; the
renderer supplies the builder (``r.b``) and the helpers an entry needs (``arith``,
``intrinsic``, ``call_math``, ``int_cast``, ``f64_to_narrow``). Integer division and
remainder never trap: the decompose pass has replaced a divisor of 0 (signed: or -1) by 1
and selects the ISA's results there (:meth:`.render.KernelRenderer._guarded` checks the
form). Floats compare ordered except ``!=``, which is true on NaN; float-to-integer casts
saturate with NaN to 0; casts to f16/bf16 from wider types round once (through float64
and round-to-odd).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hologram.backends.cpu import intrinsics
from hologram.backends.cpu import textir as ir
from hologram.backends.cpu.values import F32, F64, NARROW, float_bits, float_const, register_type
from hologram.codegen.mathlib import COMPARISONS
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import FLOAT_UNARY_OPS

if TYPE_CHECKING:
    from hologram.backends.cpu.render import KernelRenderer

def _add_sub_mul(op: str):
    def emit(r: KernelRenderer, args, a: DType, t: DType) -> ir.Value:
        return r.arith(op, args[0], args[1], a, register_type(a))
    return emit


# Integer div/mod: the decompose pass has replaced a divisor of 0 (signed: or -1) by 1 and
# selects the ISA's results there, so the instruction never traps (_emit checks the form).
def _div(r: KernelRenderer, args, a: DType, t: DType) -> ir.Value:
    if a.is_float:
        return r.b.fdiv(*args)
    return (r.b.udiv if a.kind == "u" else r.b.sdiv)(*args)


def _mod(r: KernelRenderer, args, a: DType, t: DType) -> ir.Value:
    if a.is_float:
        return intrinsics.fmod(r.b, *args)
    return (r.b.urem if a.kind == "u" else r.b.srem)(*args)


def minmax(r: KernelRenderer, args, a: DType, t: DType, kind: str | None = None,
            op: str | None = None) -> ir.Value:
    b = r.b
    largest = (kind or op) in ("max", "argmax")
    x, y = args
    if a.is_float:
        return r.intrinsic("maximum" if largest else "minimum", x.type, [x, y])
    if a.is_bool:
        return b.or_(x, y) if largest else b.and_(x, y)
    prefix = "u" if a.kind == "u" else "s"
    return r.intrinsic(f"{prefix}{'max' if largest else 'min'}", x.type, [x, y])


def _logic(op: str):
    def emit(r: KernelRenderer, args, a: DType, t: DType) -> ir.Value:
        return {"and": r.b.and_, "or": r.b.or_, "xor": r.b.xor}[op](*args)
    return emit


def _compare(op: str):
    def emit(r: KernelRenderer, args, a: DType, t: DType) -> ir.Value:
        b = r.b
        if a.is_float:  # ordered compares are false on NaN; != is true on NaN
            return (b.fcmp_unordered if op == "ne" else b.fcmp_ordered)(COMPARISONS[op], *args)
        cmp = b.icmp_signed if a.kind == "i" else b.icmp_unsigned
        return cmp(COMPARISONS[op], *args)
    return emit


def _unary_int_or_float(op: str):
    def emit(r: KernelRenderer, args, a: DType, t: DType) -> ir.Value:
        b = r.b
        (x,) = args
        ty = x.type
        if op == "neg":
            return b.fneg(x) if a.is_float else b.neg(x)
        if op == "not":
            return b.not_(x)
        if op == "abs":
            if a.is_float:
                return r.intrinsic("fabs", ty, [x])
            if a.kind == "u":
                return x
            return b.select(b.icmp_signed("<", x, ir.Constant(ty, 0)), b.neg(x), x)
        # sign: 1, -1, or x itself (±0, NaN)
        if a.is_float:
            one, minus = float_const(ty, 1.0), float_const(ty, -1.0)
            return b.select(b.fcmp_ordered(">", x, float_const(ty, 0.0)), one,
                            b.select(b.fcmp_ordered("<", x, float_const(ty, 0.0)), minus, x))
        zero = ir.Constant(ty, 0)
        positive = b.zext(b.icmp_unsigned("!=", x, zero) if a.kind == "u"
                          else b.icmp_signed(">", x, zero), ty)
        if a.kind == "u":
            return positive
        return b.sub(positive, b.zext(b.icmp_signed("<", x, zero), ty))
    return emit


def _float_unary(op: str):
    intrinsic = {"sqrt": "sqrt", "floor": "floor", "ceil": "ceil", "trunc": "trunc",
                 "round": "roundeven"}.get(op)

    def emit(r: KernelRenderer, args, a: DType, t: DType) -> ir.Value:
        b = r.b
        (x,) = args
        if intrinsic is not None:
            return r.intrinsic(intrinsic, x.type, [x])
        if op == "rsqrt":
            root = r.intrinsic("sqrt", x.type, [x])
            return b.fdiv(float_const(x.type, 1.0), root)
        return r.call_math(op, [x])  # f16 and bf16 through the f32 library
    return emit


def _pow(r: KernelRenderer, args, a: DType, t: DType) -> ir.Value:
    return r.call_math("pow", args)


def _fma(r: KernelRenderer, args, a: DType, t: DType) -> ir.Value:
    return r.intrinsic("fma", args[0].type, args)


def _select(r: KernelRenderer, args, a: DType, t: DType) -> ir.Value:
    return r.b.select(*args)


def _cast(r: KernelRenderer, args, a: DType, t: DType) -> ir.Value:
    b = r.b
    (x,) = args
    src, dst = x.type, register_type(t)
    if a is t:
        return x
    if t.is_bool:
        if a.is_float:
            return b.fcmp_unordered("!=", x, float_const(src, 0.0))  # NaN -> true
        return b.icmp_unsigned("!=", x, ir.Constant(src, 0))
    if a.is_bool:
        return b.uitofp(x, dst) if t.is_float else b.zext(x, dst)
    if t in NARROW and (a is dt.float64 or (a.is_int and a.bits >= 32)):
        # Through f32 would round twice; through f64 and round-to-odd rounds once.
        if a.is_float:
            wide = x
        elif a.bits > 53:
            wide = _int_to_f64_sticky(r, x, signed=a.kind == "i")
        else:
            wide = (b.uitofp if a.kind == "u" else b.sitofp)(x, F64)
        return r.f64_to_narrow(wide, t)
    if a.is_float and t.is_float:
        if float_bits(src) < float_bits(dst):
            return b.fpext(x, dst)
        return b.fptrunc(x, dst) if src != dst else x  # f16/bf16 <- f32: rounded by _emit
    if a.is_float:  # saturating, NaN -> 0
        name = "fptoui.sat" if t.kind == "u" else "fptosi.sat"
        suffix = "f32" if src == F32 else "f64"
        return b.call(intrinsics.declare(r.module, f"{name}.i{dst.width}.{suffix}", dst, [src]),
                      [x])
    if t.is_float:
        return (b.uitofp if a.kind == "u" else b.sitofp)(x, dst)
    return r.int_cast(x, src, dst, signed=a.kind == "i")


def _int_to_f64_sticky(r: KernelRenderer, x: ir.Value, signed: bool) -> ir.Value:
    """A 64-bit integer as a double that rounds to f16 or bf16 as the integer itself does.
    A plain conversion rounds magnitudes of 2**53 and more a first time (2**56 + 2**48 + 1
    becomes the bf16 midpoint 2**56 + 2**48, then 2**56); here their low 11 bits are ORed
    into bit 11 (a sticky bit far below the narrow formats' last), which leaves at most 53
    significant bits: the conversion is exact."""
    b = r.b
    i64 = ir.IntType(64)
    negative = b.icmp_signed("<", x, ir.Constant(i64, 0)) if signed else None
    # |x| as unsigned (the most negative value's magnitude 2**63 too)
    magnitude = b.select(negative, b.sub(ir.Constant(i64, 0), x), x) if signed else x
    low = b.and_(magnitude, ir.Constant(i64, 0x7FF))
    sticky = b.shl(b.zext(b.icmp_unsigned("!=", low, ir.Constant(i64, 0)), i64),
                   ir.Constant(i64, 11))
    cut = b.or_(b.and_(magnitude, ir.Constant(i64, ~0x7FF)), sticky)
    big = b.icmp_unsigned(">=", magnitude, ir.Constant(i64, 2**53))
    value = b.uitofp(b.select(big, cut, magnitude), F64)
    return b.select(negative, b.fneg(value), value) if signed else value


# f16/bf16 results these ops produce are already exact in the format (no rounding needed);
# the inexact ones reach the renderer as f32 (or f64) operations and a cast back
# (compiler/passes/decompose.py), which is rounded.
EXACT_NARROW = frozenset({"neg", "abs", "select", "min", "max", "sign"})

OPS: dict[str, Callable] = {
    "add": _add_sub_mul("add"), "sub": _add_sub_mul("sub"), "mul": _add_sub_mul("mul"),
    "div": _div, "mod": _mod,
    "min": lambda r, args, a, t: minmax(r, args, a, t, op="min"),
    "max": lambda r, args, a, t: minmax(r, args, a, t, op="max"),
    "pow": _pow, "and": _logic("and"), "or": _logic("or"), "xor": _logic("xor"),
    **{op: _compare(op) for op in COMPARISONS},
    **{op: _unary_int_or_float(op) for op in ("abs", "neg", "not", "sign")},
    **{op: _float_unary(op) for op in FLOAT_UNARY_OPS},
    "fma": _fma, "select": _select, "cast": _cast,
}
