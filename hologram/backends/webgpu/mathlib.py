"""The transcendental functions in WGSL: :class:`WGSLEmitter` implements the primitives of
:class:`hologram.codegen.mathlib.MathEmitter`, so every algorithm there is written out as
straight-line WGSL ``let`` statements (f32 only: WGSL has no f64, so ``pow``, whose f32
algorithm works in f64, is not offered).

Bit-level primitives (``fabs``, ``neg``, ``copysign``, ``isnan``) work on the bits, not on
WGSL's float operators: WGSL lets an implementation assume finite values in float
operations, but never in integer ones. Float constants are bit patterns
the compiler cannot fold (:func:`f32_literal`): a constant expression that is inf or NaN
is a shader-creation error, and drivers fold known constants with fast-math rules.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hologram.codegen.mathlib import F32, Format, MathEmitter

#: Helpers every shader may call (emitted once, before the kernel).
PRELUDE = """\
fn hg_f32_bits(b: u32) -> f32 { return bitcast<f32>(b); }
fn hg_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
"""


def f32_literal(value: float) -> str:
    """A WGSL expression for the f32 ``value`` (a float32 value), exact, that the shader
    compiler cannot see through: its bits xor ``hg_kc``, which the kernel sets to 0 from a
    built-in value the compiler does not know. A literal it can see is folded with
    fast-math rules (measured on lavapipe: ``x / 0.0`` gave 0, and ``x + 0.0`` may
    become ``x``, wrong for -0.0)."""
    bits = int(np.float32(value).view(np.uint32))
    # hg_kc, not hg_k: results pass through an xor with hg_k (opaque), and two xors with
    # one key cancel, which the compiler sees.
    return f"bitcast<f32>({bits:#010x}u ^ hg_kc)"


def opaque(expr: str, key: str = "hg_k") -> str:
    """The f32 ``expr``, through an xor of its bits with a value that is 0 at run time but
    unknown to the shader compiler. WGSL lets drivers optimize floats as if NaN, inf and
    -0.0 did not exist and reassociate or contract freely; lavapipe does (``x - x`` became
    0 for NaN, ``a * b + c`` may fuse): nothing matches a pattern through this barrier, so
    every operation rounds once, as written."""
    return f"bitcast<f32>(bitcast<u32>({expr}) ^ {key})"


def i32_literal(value: int) -> str:
    value = int(value)
    if value < 0:
        return f"bitcast<i32>({value & 0xFFFFFFFF:#x}u)"
    return f"{value}i"


class WGSLEmitter(MathEmitter):
    """Primitives as WGSL expressions; each result is bound to a fresh ``let`` through
    ``bind(wgsl_type, expression) -> name``."""

    def __init__(self, bind: Callable[[str, str], str], used: set[str], exact_fma: bool,
                 fmt: Format = F32):
        if fmt is not F32:
            raise ValueError("WGSL has f32 only")
        super().__init__(fmt)
        self.bind = bind
        self.used = used  # the helper functions (.helpers) the shader calls
        self.exact_fma = exact_fma

    def _f(self, expr: str) -> str:
        return self.bind("f32", expr)

    def _i(self, expr: str) -> str:
        return self.bind("i32", expr)

    def _m(self, expr: str) -> str:
        return self.bind("bool", expr)

    def for_format(self, fmt: Format) -> WGSLEmitter:
        return WGSLEmitter(self.bind, self.used, self.exact_fma, fmt)

    def convert(self, a, fmt: Format):
        if fmt is not F32:
            raise ValueError("WGSL has f32 only")
        return a

    def c(self, value: float) -> str:
        return f32_literal(value)

    def ci(self, value: int) -> str:
        return i32_literal(value)

    def add(self, a, b):
        return self._f(f"{a} + {self._other(a, b)}")

    def sub(self, a, b):
        return self._f(f"{a} - {self._other(a, b)}")

    def mul(self, a, b):
        return self._f(f"{a} * {self._other(a, b)}")

    def div(self, a, b):
        return self._f(f"{a} / {self._other(a, b)}")

    def _other(self, a, b):
        # x - x, x / x: the compiler folds an operation on one value twice (to 0, 1) also
        # for NaN and inf; a second operand it cannot identify with the first keeps it.
        return opaque(b, "hg_k2") if a == b else b

    def fast_recip(self, a):
        return self._f(f"1.0f / {a}")

    def neg(self, a):
        return self._f(f"bitcast<f32>(bitcast<u32>({a}) ^ 0x80000000u)")

    def fma(self, a, b, c):
        # WGSL's fma() may round twice (lavapipe's does). The algorithms assume one
        # rounding; the integer hg_fma gives it, but costs the driver's compiler seconds
        # per inlined call, so it is used only where the error would otherwise show
        # (exact_fma: sin and cos, whose range reduction needs it; docs/webgpu.md).
        if not self.exact_fma:
            return self._f(f"fma({a}, {b}, {c})")
        self.used.add("hg_fma")
        return self._f(f"hg_fma({a}, {b}, {c})")

    def fabs(self, a):
        return self._f(f"bitcast<f32>(bitcast<u32>({a}) & 0x7fffffffu)")

    def copysign(self, a, b):
        return self._f(f"bitcast<f32>((bitcast<u32>({a}) & 0x7fffffffu) | "
                       f"(bitcast<u32>({b}) & 0x80000000u))")

    def floor(self, a):
        return self._f(f"floor({a})")

    def rint(self, a):
        return self._f(f"round({a})")  # WGSL round(): ties to even

    def lt(self, a, b):
        return self._m(f"{a} < {b}")

    def ge(self, a, b):
        return self._m(f"{a} >= {b}")

    def eq(self, a, b):
        return self._m(f"{a} == {b}")

    def ne(self, a, b):
        return self._m(f"({a} != {b}) && !hg_isnan({a}) && !hg_isnan({b})")

    def ult(self, a, b):
        return self._m(f"!({a} >= {b})")

    def ule(self, a, b):
        return self._m(f"!({a} > {b})")

    def isnan(self, a):
        return self._m(f"hg_isnan({a})")

    def and_(self, a, b):
        return self._m(f"{a} && {b}")

    def or_(self, a, b):
        return self._m(f"{a} || {b}")

    def not_(self, a):
        return self._m(f"!{a}")

    def sel(self, cond, a, b):
        # WGSL infers the type of a ``let`` from its operands (float or integer).
        return self.bind("auto", f"select({b}, {a}, {cond})")

    def iadd(self, a, b):
        return self._i(f"{a} + {b}")

    def isub(self, a, b):
        return self._i(f"{a} - {b}")

    def iand(self, a, b):
        return self._i(f"{a} & {b}")

    def shl(self, a, b):
        return self._i(f"{a} << u32({b})")

    def ashr(self, a, b):
        return self._i(f"{a} >> u32({b})")

    def ilt(self, a, b):
        return self._m(f"{a} < {b}")

    def ine(self, a, b):
        return self._m(f"{a} != {b}")

    def to_int(self, a):
        return self._i(f"i32({a})")

    def to_float(self, n):
        return self._f(f"f32({n})")

    def bits(self, a):
        return self._i(f"bitcast<i32>({a})")

    def from_bits(self, n):
        return self._f(f"bitcast<f32>({n})")
