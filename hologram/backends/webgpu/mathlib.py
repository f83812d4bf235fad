"""The transcendental functions in WGSL: :class:`WGSLEmitter` implements the primitives of
:class:`hologram.codegen.mathlib.MathEmitter`, so every algorithm there is written out as
straight-line WGSL ``let`` statements (f32 only). ``pow``, whose shared f32 algorithm
works in f64, which WGSL lacks, is :func:`pow_f32` here, on double-f32 words.

Bit-level primitives (``fabs``, ``neg``, ``copysign``, ``isnan``) work on the bits, not on
WGSL's float operators: WGSL lets an implementation assume finite values in float
operations, but never in integer ones. ``div`` and ``scale`` are the helpers' integer
routines (``hg_div``, ``hg_scale``): WGSL's division may be 2.5 ulp off, and a driver may
flush a subnormal result to zero. Float constants are bit patterns
the compiler cannot fold (:func:`f32_literal`): a constant expression that is inf or NaN
is a shader-creation error, and drivers fold known constants with fast-math rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from hologram.codegen.mathlib import (
    F32,
    Format,
    InfixEmitter,
    MathEmitter,
    clamp,
    clamp_keep_nan,
    horner,
)

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


class WGSLEmitter(InfixEmitter):
    """Primitives as WGSL expressions; each result is bound to a fresh ``let`` through
    ``bind(wgsl_type, expression) -> name``."""

    def __init__(self, bind: Callable[[str, str], str], used: set[str], exact_fma: bool,
                 fmt: Format = F32):
        if fmt is not F32:
            raise ValueError("WGSL has f32 only")
        super().__init__(fmt)
        self.bind = bind
        self.used = used  # the helper functions (.bitlib) the shader calls
        self.exact_fma = exact_fma

    def floating(self, expression: str) -> str:
        return self.bind("f32", expression)

    def integer(self, expression: str) -> str:
        return self.bind("i32", expression)

    def mask(self, expression: str) -> str:
        return self.bind("bool", expression)

    SPELLING: ClassVar[dict[str, str]] = {
        "neg": "bitcast<f32>(bitcast<u32>({a}) ^ 0x80000000u)",
        "fabs": "bitcast<f32>(bitcast<u32>({a}) & 0x7fffffffu)",
        "copysign": "bitcast<f32>((bitcast<u32>({a}) & 0x7fffffffu) | "
                    "(bitcast<u32>({b}) & 0x80000000u))",
        "floor": "floor({a})", "rint": "round({a})",  # WGSL round(): ties to even
        "ne": "({a} != {b}) && !hg_isnan({a}) && !hg_isnan({b})", "isnan": "hg_isnan({a})",
        "shl": "{a} << u32({b})", "ashr": "{a} >> u32({b})", "to_int": "i32({a})",
        "to_float": "f32({a})", "bits": "bitcast<i32>({a})", "from_bits": "bitcast<f32>({a})",
    }

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
        return self.floating(f"{a} + {self._other(a, b)}")

    def sub(self, a, b):
        return self.floating(f"{a} - {self._other(a, b)}")

    def mul(self, a, b):
        return self.floating(f"{a} * {self._other(a, b)}")

    def div(self, a, b):
        # WGSL's division may be 2.5 ulp off; the algorithms assume one rounding.
        self.used.add("hg_div")
        return self.floating(f"hg_div({a}, {b})")

    def _other(self, a, b):
        # x - x, x / x: the compiler folds an operation on one value twice (to 0, 1) also
        # for NaN and inf; a second operand it cannot identify with the first keeps it.
        return opaque(b, "hg_k2") if a == b else b

    def fast_recip(self, a):
        return self.floating(f"1.0f / {a}")

    def scale(self, p, n):
        # On the integers (hg_scale): a driver that flushes subnormals (WGSL allows it)
        # would flush the default's last multiplication where the result is subnormal.
        self.used.add("hg_scale")
        return self.floating(f"hg_scale({p}, {n})")

    def fma(self, a, b, c):
        # WGSL's fma() may round twice (lavapipe's does). The algorithms assume one
        # rounding; the integer hg_fma gives it, but costs the driver's compiler seconds
        # per inlined call, so it is used only where the error would otherwise show
        # (exact_fma: sin and cos, whose range reduction needs it; docs/webgpu.md).
        if not self.exact_fma:
            return self.floating(f"fma({a}, {b}, {c})")
        self.used.add("hg_fma")
        return self.floating(f"hg_fma({a}, {b}, {c})")

    def sel(self, cond, a, b):
        # WGSL infers the type of a ``let`` from its operands (float or integer).
        return self.bind("auto", f"select({b}, {a}, {cond})")


def function(signature: str, rule: Callable[..., str], args: tuple[str, ...],
             result: str = "{}") -> str:
    """A WGSL function (``signature``: ``fn name(params) -> type``) whose body is
    ``rule(emitter, *args)`` (a shared rule, :mod:`hologram.codegen.numerics`; ``args``:
    WGSL expressions of the parameters) written out by a :class:`WGSLEmitter`, returning
    ``result`` formatted with the rule's value. The rules compute on integers and
    bit casts, so no float constant needs the kernel's folding barrier."""
    lines: list[str] = []

    def bind(wgsl_type: str, expression: str) -> str:
        name = f"v{len(lines)}"
        typed = "" if wgsl_type == "auto" else f": {wgsl_type}"
        lines.append(f"  let {name}{typed} = {expression};")
        return name

    used: set[str] = set()
    value = rule(WGSLEmitter(bind, used, exact_fma=False), *args)
    assert not used, f"{signature}: the rule calls helpers {sorted(used)}"
    return "\n".join([f"{signature} {{", *lines, f"  return {result.format(value)};", "}"])


# ---------------------------------------------------------------- pow without f64
# The shared f32 pow (hologram.codegen.mathlib) evaluates exp2(y log2|x|) in f64, which WGSL
# lacks. Here the same formula runs on double-f32 words (hi + lo, ~48 bits): log2|x| to a
# relative 2^-33, y log2|x| as an exact product plus a correction, and 2^(hi + lo) with
# the leading term of its polynomial exact, so the last rounding dominates the error.
# The exact products are Dekker's (Veltkamp splitting: multiplications and additions
# only), not fma: WGSL's fma() may round twice (lavapipe's does), and the exact integer
# hg_fma costs the driver's compiler seconds per call. The results of every operation
# pass through the renderer's opaque barrier, so no compiler reassociates a split away.
_SPLIT = 4097.0  # 2^12 + 1: a 24-bit significand into two 12-bit halves
_LN2 = (0.6931472, -1.9046542e-09)  # ln 2 = hi + lo, both f32
_TWO_THIRDS = (0.6666667, -1.9868216e-08)  # 2/3 = hi + lo
#: 2 atanh(s) = 2s + (2/3)s^3 + s^5 R(s^2), R(z) = sum 2/(2n+1) z^(n-2), n = 2..7:
#: truncated after z^5, relative error below 2^-44 for |s| <= 0.1716.
_ATANH_TAIL = tuple(2.0 / (2 * n + 1) for n in range(2, 8))
#: 2^r - 1 - r ln2 = r^2 P(r), P(r) = sum (ln2)^n / n! r^(n-2), n = 2..9: truncated after
#: r^7, relative error below 2^-36 for |r| <= 1/2.
_EXP2_TAIL = tuple(math.log(2.0) ** n / math.factorial(n) for n in range(2, 10))
_Y_LIMIT = 2.0 ** 32  # |y log2|x|| >= 2^32 * 2^-24 > 151 for |x| != 1: 0 or inf anyway
_SQRT_HALF_BITS = 0x3F3504F3
_MIN_NORMAL_BITS = 0x00800000
_INF_BITS = 0x7F800000
_ONE_BITS = 0x3F800000


def _split(e: MathEmitter, a):
    """a = hi + lo exactly, each with at most 12 significant bits (|a| < 2^115)."""
    c = e.mul(e.c(_SPLIT), a)
    hi = e.sub(c, e.sub(c, a))
    return hi, e.sub(a, hi)


def _two_prod(e: MathEmitter, a, b, b_split=None):
    """a * b = p + err exactly (Dekker), barring overflow and underflow."""
    p = e.mul(a, b)
    ah, al = _split(e, a)
    bh, bl = b_split if b_split is not None else _split(e, b)
    err = e.add(e.add(e.add(e.sub(e.mul(ah, bh), p), e.mul(ah, bl)), e.mul(al, bh)),
                e.mul(al, bl))
    return p, err


def _fast_two_sum(e: MathEmitter, a, b):
    """a + b = s + err exactly, for |a| >= |b| (or a = 0)."""
    s = e.add(a, b)
    return s, e.add(e.sub(a, s), b)


def _c_split(e: MathEmitter, value: float):
    """The halves of the constant ``value`` (an f32), as constants."""
    v = np.float32(value)
    hi = np.float32(v * np.float32(_SPLIT)) - (np.float32(v * np.float32(_SPLIT)) - v)
    return e.c(float(hi)), e.c(float(v - hi))


def _log2_dw(e: MathEmitter, ax):
    """log2(ax) = hi + lo for finite ax > 0, relative error about 2^-33 (the series' f32
    tail). A subnormal ax is normalized on the integers (its bits are ax * 2^149), never
    by a float operation, which WGSL lets a driver flush to zero."""
    ci = e.ci
    bits = e.bits(ax)
    sub = e.ilt(bits, ci(_MIN_NORMAL_BITS))
    xs = e.sel(sub, e.to_float(bits), ax)
    ix = e.isub(e.bits(xs), ci(_SQRT_HALF_BITS))
    k = e.iadd(e.ashr(ix, ci(23)), e.sel(sub, ci(-149), ci(0)))
    mbits = e.iadd(e.iand(ix, ci((1 << 23) - 1)), ci(_SQRT_HALF_BITS))
    f = e.sub(e.from_bits(mbits), e.c(1.0))  # exact: m in [sqrt(1/2), sqrt(2))
    two = e.c(2.0)
    u = e.add(two, f)
    u_lo = e.add(e.sub(two, u), f)  # 2 + f = u + u_lo exactly
    # s = f/(2 + f) = s + s_lo: the residual f - s u - s u_lo, with s u exact (WGSL allows
    # an inexact division; the residual corrects whatever it returned).
    s = e.div(f, u)
    p, p_err = _two_prod(e, s, u)
    s_lo = e.div(e.sub(e.sub(e.sub(f, p), p_err), e.mul(s, u_lo)), u)
    # log(1 + f) = 2 atanh(s) = 2s + (2/3)s^3 + s^5 R(s^2): the first two terms in double
    # words, s_lo to first order (its s^2 s_lo share of the cubic term too).
    z, z_err = _two_prod(e, s, s)
    s3, s3_err = _two_prod(e, s, z)
    s3_lo = e.add(s3_err, e.mul(s, z_err))
    c_hi, c_lo = e.c(_TWO_THIRDS[0]), e.c(_TWO_THIRDS[1])
    t1, t1_err = _two_prod(e, s3, c_hi, _c_split(e, _TWO_THIRDS[0]))
    t1_lo = e.add(t1_err, e.add(e.mul(c_hi, s3_lo), e.mul(c_lo, s3)))
    rest = e.mul(e.mul(s3, z), horner(e, z, _ATANH_TAIL))
    s2 = e.mul(two, s)
    lh = e.add(s2, t1)  # |2s| > |t1|: the error below is exact
    extra = e.add(e.mul(e.mul(two, s_lo), e.add(e.c(1.0), z)), rest)
    ll = e.add(e.add(e.sub(s2, lh), t1), e.add(extra, t1_lo))
    # renormalized (the tail's s^5 share is ~2^-12 of lh): the products below drop lo*lo
    lh, ll = _fast_two_sum(e, lh, ll)
    # times log2(e) = c_hi + c_lo, then k + that (|k| >= 1 > |ph| unless k = 0: exact)
    c_hi, c_lo = e.c(F32.k["log2e"]), e.c(F32.k["log2e_lo"])
    ph, ph_err = _two_prod(e, lh, c_hi, _c_split(e, F32.k["log2e"]))
    pl = e.add(ph_err, e.add(e.mul(lh, c_lo), e.mul(ll, c_hi)))
    kf = e.to_float(k)
    gh = e.add(kf, ph)
    return gh, e.add(e.add(e.sub(kf, gh), ph), pl)


def _exp2_dw(e: MathEmitter, th, tl):
    """2^(th + tl) for a double word with |tl| <= 2^-16 (th NaN: NaN; past the range: 0 or
    inf). 2^r - 1 = r ln2 + r^2 P(r) with r ln2 exact as a double word, so the one
    rounding that matters is the sum's last; 2^k is applied as exp2 does."""
    tc = clamp(e, th, F32.k["exp2_lo"], F32.k["exp2_hi"])  # NaN: lo, patched below
    tl = e.sel(e.eq(tc, th), tl, e.c(0.0))  # past over/underflow the low part is noise
    kf = e.rint(tc)
    r = e.sub(tc, kf)  # exact, |r| <= 1/2
    ln2_hi = e.c(_LN2[0])
    a, a_err = _two_prod(e, r, ln2_hi, _c_split(e, _LN2[0]))
    a_lo = e.add(a_err, e.mul(r, e.c(_LN2[1])))
    b = e.mul(e.mul(r, r), horner(e, r, _EXP2_TAIL))
    one = e.c(1.0)
    q = e.add(one, a)
    q_lo = e.add(e.sub(one, q), a)  # |1| > |a|: exact
    # 2^(r + tl) = 2^r (1 + tl ln2 + O(tl^2)): tl's share is tl ln2 2^r
    corr = e.mul(e.mul(tl, ln2_hi), e.add(q, b))
    p = e.add(q, e.add(q_lo, e.add(a_lo, e.add(b, corr))))
    return e.sel(e.isnan(th), th, e.scale(p, e.to_int(kf)))


def pow_f32(e: MathEmitter, x, y):
    """C99 ``pow(x, y)`` on f32 values without f64: the special cases of the shared
    algorithm (docs/mathlib.md), ``exp2(y log2|x|)`` in double-f32 words otherwise.

    The operands are classified on their bits (zero, subnormal, inf, NaN), so a driver
    that flushes subnormal floats in arithmetic still tells a subnormal from zero here.
    """
    ci, one = e.ci, e.c(1.0)
    abs_bits = ci(0x7FFFFFFF)
    ax_bits = e.iand(e.bits(x), abs_bits)
    ay_bits = e.iand(e.bits(y), abs_bits)
    x_zero = e.not_(e.ine(ax_bits, ci(0)))
    x_inf = e.not_(e.ine(ax_bits, ci(_INF_BITS)))
    nan = e.or_(e.ilt(ci(_INF_BITS), ax_bits), e.ilt(ci(_INF_BITS), ay_bits))
    y_zero = e.not_(e.ine(ay_bits, ci(0)))
    y_neg = e.ilt(e.bits(y), ci(0))
    x_sign = e.ilt(e.bits(x), ci(0))

    ax = e.fabs(x)
    yc = clamp_keep_nan(e, y, -_Y_LIMIT, _Y_LIMIT)
    gh, gl = _log2_dw(e, ax)
    th, th_err = _two_prod(e, yc, gh)
    tl = e.add(th_err, e.mul(yc, gl))
    mag = _exp2_dw(e, th, tl)
    inf, zero = e.c(math.inf), e.c(0.0)
    mag = e.sel(x_zero, e.sel(y_neg, inf, zero), mag)
    mag = e.sel(x_inf, e.sel(y_neg, zero, inf), mag)
    mag = e.sel(nan, e.c(math.nan), mag)

    # C99 F.9.4.4: the sign of an odd integer power of a negative base, NaN for a
    # non-integer power of a finite negative one; pow(1, y) = pow(-1, ±inf) = 1 and
    # pow(x, ±0) = 1 even for NaN.
    y_sub = e.and_(e.not_(y_zero), e.ilt(ay_bits, ci(_MIN_NORMAL_BITS)))
    y_int = e.and_(e.eq(e.floor(y), y), e.not_(y_sub))  # infinities count as even
    half = e.mul(y, e.c(0.5))
    y_odd = e.and_(y_int, e.ne(e.floor(half), half))
    res = e.sel(e.and_(x_sign, y_odd), e.neg(mag), mag)
    finite_neg = e.and_(x_sign, e.and_(e.not_(x_zero), e.ilt(ax_bits, ci(_INF_BITS))))
    res = e.sel(e.and_(finite_neg, e.not_(y_int)), e.c(math.nan), res)
    x_one = e.not_(e.ine(e.bits(x), ci(_ONE_BITS)))
    unit_inf = e.and_(e.not_(e.ine(ax_bits, ci(_ONE_BITS))),
                      e.not_(e.ine(ay_bits, ci(_INF_BITS))))
    res = e.sel(e.or_(unit_inf, x_one), one, res)
    return e.sel(y_zero, one, res)
