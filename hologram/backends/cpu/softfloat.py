"""IEEE operations in plain LLVM IR, for targets that lack the instruction.

Generated CPU code may call no runtime library, but LLVM lowers some operations to libcalls
where the target CPU has no instruction for them: ``llvm.fma.*`` without FMA (``fma``,
``fmaf``), ``llvm.floor/ceil/trunc/rint/roundeven.*`` without SSE4.1 (``floorf``, ...),
half <-> float conversions without F16C (``__extendhfsf2``, ``__truncsfhf2``), double -> half
on x86 without AVX512-FP16 (``__truncdfhf2``), and ``frem`` on x86 always (``fmod``). The
renderer uses the intrinsic where the target has the instruction, and otherwise calls the
function :func:`get` emits here: ``hg.sf.<name>.<suffix>``, internal and ``alwaysinline``,
built from integer ops, selects, bitcasts, ``fadd``/``fsub``/``fmul``, ``fpext``/``fptrunc``
between float and double, ``sitofp`` and ``llvm.fabs``/``llvm.copysign``, which every
target lowers without a call. Everything is straight-line and vectorizes, except fmod.
Results are exact IEEE results in the default environment (round to nearest even, no
flush-to-zero), identical to the instruction's. They rest on exact IEEE steps (error-free
transforms, ``(x + 2^p) - 2^p``): the bodies carry no fast-math flags, and a function they
are inlined into must not carry fast-math attributes (``unsafe-fp-math``, a non-IEEE
``denormal-fp-math``) either.

- ``fma`` (f32, f64): ``a*b + c`` rounded once, including signed zeros, infinities, NaN,
  overflow and subnormal results. f32: the product is exact in f64, the sum is rounded to
  odd in f64 (its TwoSum error decides the last bit), and ``fptrunc`` rounds that to f32,
  which is then the correctly rounded result (rounding to odd with two extra bits commutes
  with the second rounding). f64: the operands are scaled to [1, 2) and the addend to match
  (a term too small to matter beyond its sign is replaced by a small one of the same sign);
  Veltkamp/Dekker's exact product, a TwoSum with the addend and a rounded-to-odd sum of the
  two low parts give ``RN(a*b + c)`` in the scaled range (Boldo-Melquiond), plus the sign of
  what is left over; with these the last bit is fixed up so that scaling back rounds once,
  also into the subnormal range. No input is left out.
- ``floor``, ``ceil``, ``trunc``, ``rint`` (f32, f64): ``|x| + 2^p - 2^p`` rounds to the
  nearest integer (``p`` = 23, 52), then a correction by one and the sign of ``x``. So the
  results keep the sign of ``x`` as libm's do (``ceil(-0.5) = -0.0``, ``rint(-0.4) =
  -0.0``); ``|x| >= 2^p``, infinities and NaN are returned unchanged. ``rint`` rounds half
  to even (it is also ``roundeven``).
- ``fmod`` (f32, f64): C's ``fmod``, exact: the sign of ``x``; ``fmod(x, +-0)``,
  ``fmod(+-inf, y)`` and NaN operands give NaN, ``fmod(x, +-inf) = x`` for finite ``x``.
  Integer long division of the significands, a chunk of exponent difference per step (11
  bits for f64, 40 for f32; one ``urem i64`` each, a native instruction on 64-bit targets):
  a loop, so a loop calling fmod does not vectorize.
- ``f16_to_f32``, ``f16_to_f64``: half bits (``i16``) to float/double, exact; NaN keeps its
  sign and payload and comes out quiet (as x86's ``vcvtph2ps``).
- ``f32_to_f16``, ``f64_to_f16``: float/double to half bits (``i16``), rounded to nearest
  even once, overflow to infinity, subnormal results; NaN becomes a quiet NaN with the same
  sign and the payload's top bits (as ``vcvtps2ph``). f64 is rounded to odd into f32 first.

The argument ``ty`` of :func:`get` is the type of the (first) argument: ``float`` or
``double`` for the arithmetic functions, which return the same type; ``i16`` for
``f16_to_f32``/``f16_to_f64``, ``float`` for ``f32_to_f16`` and ``double`` for
``f64_to_f16`` (which return ``i16``). The suffix of the name is that type's: ``f32``,
``f64`` or ``i16`` (``hg.sf.f16_to_f32.i16``, ``hg.sf.f64_to_f16.f64``).
"""

from __future__ import annotations

from collections.abc import Callable

from hologram.backends.cpu import textir as ir
from hologram.backends.cpu.primitives import TYPES, Primitives
from hologram.codegen.mathlib import FORMATS, Format

FUNCTIONS = ("fma", "floor", "ceil", "trunc", "rint", "fmod", "f16_to_f32", "f16_to_f64",
             "f32_to_f16", "f64_to_f16")

I16, I32, I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
_F32, _F64 = FORMATS["f32"], FORMATS["f64"]


class _Emitter(Primitives):
    """:class:`~.primitives.Primitives` with the steps the algorithms below share."""

    @property
    def emax(self) -> int:  # the all-ones exponent field: inf and NaN
        return 2 * self.fmt.bias + 1

    @property
    def abs_mask(self) -> int:
        return (1 << (self.ity.width - 1)) - 1

    def finite(self, a):
        return self.lt(self.fabs(a), self.c(float("inf")))

    def is_odd(self, x):
        """Is the last significand bit of x set?"""
        return self.b.trunc(self.bits(x), ir.IntType(1))

    def step_toward(self, x, d):
        """The neighbour of x (nonzero, finite) in the direction of d's sign."""
        bx = self.bits(x)
        apart = self.b.icmp_signed("<", self.b.xor(bx, self.bits(d)), self.ci(0))
        return self.from_bits(self.b.add(bx, self.sel(apart, self.ci(-1), self.ci(1))))

    def pow2(self, n):
        """2^n for an integer n (of the format's width) in the normal exponent range."""
        biased = self.b.add(n, self.ci(self.fmt.bias))
        return self.from_bits(self.b.shl(biased, self.ci(self.fmt.mant)))

    def imax(self, a, b):
        return self.sel(self.b.icmp_signed(">", a, b), a, b)

    def imin(self, a, b):
        return self.sel(self.b.icmp_signed("<", a, b), a, b)

    # error-free transforms (exact barring overflow; Dekker's product also barring underflow)
    def two_sum(self, a, b):
        """(s, err) with s = RN(a + b) and a + b = s + err exactly (Knuth)."""
        s = self.add(a, b)
        bb = self.sub(s, a)
        return s, self.add(self.sub(a, self.sub(s, bb)), self.sub(b, bb))

    def split(self, a):
        """Veltkamp: a = hi + lo, each with at most 26 significant bits (f64, |a| < 2^995)."""
        gamma = self.mul(self.c(2.0 ** 27 + 1), a)
        hi = self.sub(gamma, self.sub(gamma, a))
        return hi, self.sub(a, hi)

    def two_prod(self, a, b):
        """(p, err) with p = RN(a * b) and a * b = p + err exactly (Dekker, without fma)."""
        p = self.mul(a, b)
        ah, al = self.split(a)
        bh, bl = self.split(b)
        err = self.add(self.sub(self.mul(ah, bh), p), self.mul(ah, bl))
        err = self.add(self.add(err, self.mul(al, bh)), self.mul(al, bl))
        return p, err


# ---------------------------------------------------------------- fma
def _fma_f32(e: _Emitter, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """RN(a*b + c): exact product in f64, the sum rounded to odd in f64, then to f32.

    Rounding to odd at 53 bits and then to nearest at 24 (or fewer, subnormal) bits is one
    correct rounding. Infinities and NaN pass through the f64 sum unchanged (their TwoSum
    error is NaN, which asks for no correction); exact zeros get IEEE's signs from the sum.
    """
    e64 = _Emitter(e.b, _F64)
    ad, bd, cd = (e.b.fpext(v, F64) for v in (a, b, c))
    s, err = e64.two_sum(e64.mul(ad, bd), cd)  # the product has 48 bits: exact
    to_odd = e.b.and_(e64.ne(err, e64.c(0.0)), e.b.not_(e64.is_odd(s)))
    s = e64.sel(to_odd, e64.step_toward(s, err), s)
    return e.b.fptrunc(s, F32)


def _normalize_f64(e: _Emitter, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Finite nonzero x as (m, k) with x = m * 2^k, |m| in [1, 2): m keeps x's sign."""
    b, ci = e.b, e.ci
    subnormal = b.icmp_unsigned("==", b.and_(e.bits(x), ci(0x7FF << 52)), ci(0))
    x = e.sel(subnormal, e.mul(x, e.c(2.0 ** 64)), x)
    bits = e.bits(x)
    k = b.sub(b.lshr(b.and_(bits, ci(0x7FF << 52)), ci(52)), ci(1023))
    k = b.sub(k, e.sel(subnormal, ci(64), ci(0)))
    m = b.or_(b.and_(bits, ci(~(0x7FF << 52) & (2 ** 64 - 1))), ci(1023 << 52))
    return e.from_bits(m), k


# A term scaled by less than 2^-FAR against the other is only a sticky bit (see below).
_FAR = 220


def _fma_f64(e: _Emitter, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """RN(a*b + c) for doubles, without an fma instruction.

    Main case (a, b nonzero, all finite): a = ma 2^ka, b = mb 2^kb, c = mc 2^kc with |m| in
    [1, 2); S = max(ka + kb, kc). In the scaled problem x' = (a*b + c) 2^-S = mc 2^(kc-S) +
    ma*mb 2^(ka+kb-S) the larger term is in [1, 4), and every nonzero quantity below stays in
    [2^-330, 8): Dekker's product and TwoSum are exact, nothing under- or overflows. A term
    scaled by less than 2^-220 lies below half the last place of the other term's exact bits
    (2^-104 for a product, 2^-54 for c), so only its sign counts: its scale is clamped to
    2^-220, which keeps it below that.

    With (ph, pl) = ma*mb 2^(ka+kb-S), (th, tl) = TwoSum(c 2^-S, ph), v = RO(tl + pl)
    (TwoSum, then a step to the odd neighbour if inexact), z = RN(th + v) is RN(x')
    (Boldo-Melquiond: th + v is x' rounded to odd on the grid of spacing ulp(v) <= 2^-52
    ulp(th), far finer than the last rounding's, which then rounds it as it would x'; where
    instead |ph| > 2|th|, c + ph was exact by Sterbenz, tl = 0 and v = pl). The TwoSum error
    r of th + v has the sign of x' - z.

    Scaling z back by 2^S is exact for normal results, so z is the answer. A subnormal
    result is rounded to the fixed grid 2^-1074: for z below 2^-1023 (unscaled) the
    significand has at least two bits more than that grid, so z rounded to odd (from z and
    r) and then scaled (one rounding) is right; in [2^-1023, 2^-1022) it has one bit
    more, and z is stepped toward x' when it is odd (a grid midpoint) and x' != z, else a
    midpoint is an exact tie the multiplication rounds to even. The scaling is split in
    two factors, the first exact, the second rounding once (to inf on overflow).

    Elsewhere: a or b zero makes a*b exact, so ``a*b + c`` is the answer; so it is when a or
    b is inf or NaN; a finite product with a non-finite c gives c.
    """
    b_, ci = e.b, e.ci
    inf = e.c(float("inf"))
    ab_finite = b_.and_(e.finite(a), e.finite(b))
    naive = e.add(e.mul(a, b), c)
    special = e.sel(b_.and_(ab_finite, b_.not_(e.finite(c))), c, naive)
    nonzero = b_.and_(e.ne(a, e.c(0.0)), e.ne(b, e.c(0.0)))
    main = b_.and_(b_.and_(ab_finite, e.lt(e.fabs(c), inf)), nonzero)

    ma, ka = _normalize_f64(e, a)
    mb, kb = _normalize_f64(e, b)
    mc, kc = _normalize_f64(e, c)
    kp = b_.add(ka, kb)
    c_zero = e.eq(c, e.c(0.0))
    s = e.sel(c_zero, kp, e.imax(kp, kc))
    far = ci(-_FAR)
    cs = e.sel(c_zero, c, e.mul(mc, e.pow2(e.imax(b_.sub(kc, s), far))))
    p_scale = e.pow2(e.imax(b_.sub(kp, s), far))
    ph, pl = e.two_prod(ma, mb)
    ph, pl = e.mul(ph, p_scale), e.mul(pl, p_scale)

    th, tl = e.two_sum(cs, ph)
    vn, ev = e.two_sum(tl, pl)
    to_odd = b_.and_(e.ne(ev, e.c(0.0)), b_.not_(e.is_odd(vn)))
    v = e.sel(to_odd, e.step_toward(vn, ev), vn)
    z, r = e.two_sum(th, v)
    # x' - z = r + (tl + pl - v) has r's sign: th, v and z are multiples of ulp(v), which
    # exceeds |tl + pl - v|. And r = 0 only where x' = z: a v with a rounding error has its
    # last bit set, 2^52 or more times below th's, so th + v would not fit in 53 bits.

    zbits = e.bits(z)
    field = b_.and_(b_.lshr(zbits, ci(52)), ci(0x7FF))
    ez = b_.add(b_.sub(field, ci(1023)), s)  # z's exponent, unscaled
    odd = e.is_odd(z)
    # subnormal results: with one bit beyond the grid an odd z is a grid midpoint (step off
    # it, toward x'); with two or more, round to odd (step from an even z toward x')
    one_bit = b_.and_(b_.icmp_signed("==", ez, ci(-1023)), odd)
    more_bits = b_.and_(b_.icmp_signed("<", ez, ci(-1023)), b_.not_(odd))
    nudge = b_.and_(e.ne(r, e.c(0.0)), b_.or_(one_bit, more_bits))
    z = e.sel(nudge, e.step_toward(z, r), z)
    k2 = e.imin(e.imax(s, ci(-1022)), ci(1023))
    # z * 2^k1 stays normal (z >= 2^-330) and below 2^1026 (inf only where k2 overflows too)
    k1 = e.imin(e.imax(b_.sub(s, k2), ci(-690)), ci(1023))
    result = e.mul(e.mul(z, e.pow2(k1)), e.pow2(k2))
    return e.sel(main, result, special)


def _fma(e: _Emitter, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    return (_fma_f32 if e.fmt is _F32 else _fma_f64)(e, a, b, c)


# ---------------------------------------------------------------- floor, ceil, trunc, rint
def _rounding(mode: str) -> Callable[[_Emitter, ir.Value], ir.Value]:
    def build(e: _Emitter, x: ir.Value) -> ir.Value:
        magic = e.c(2.0 ** e.fmt.mant)
        a = e.fabs(x)
        r = e.sub(e.add(a, magic), magic)  # |x| to the nearest integer (even on ties)
        if mode == "trunc":
            r = e.sel(e.lt(a, r), e.sub(r, e.c(1.0)), r)
        r = e.copysign(r, x)
        if mode == "floor":
            r = e.sel(e.lt(x, r), e.sub(r, e.c(1.0)), r)
        elif mode == "ceil":
            r = e.sel(e.lt(r, x), e.add(r, e.c(1.0)), r)
        # The result has x's sign in every mode (ceil(-0.7) is -0.0, not 1 - 1 = +0.0).
        r = e.copysign(r, x)
        return e.sel(e.lt(a, magic), r, x)  # false for NaN: NaN stays

    return build


# ---------------------------------------------------------------- fmod
def _fmod(e: _Emitter, x: ir.Value, y: ir.Value) -> ir.Value:
    """C fmod(x, y) = x - trunc(x/y)*y, exact: long division of the significands.

    With |x| = mx 2^qx and |y| = my 2^qy (integer significands, qx >= qy), the remainder is
    (mx 2^(qx-qy) mod my) 2^qy: r = mx mod my, then r = (r << k) mod my while the
    exponent difference lasts, k at most 63 - (significand bits) per step so r << k fits.
    """
    f, b = e.fmt, e.b
    i64 = I64
    chunk = 64 - (f.mant + 1)  # r < my < 2^(mant+1): r << chunk fits
    ax = b.and_(e.bits(x), e.ci(e.abs_mask))
    ay = b.and_(e.bits(y), e.ci(e.abs_mask))
    inf_bits = e.ci(e.emax << f.mant)
    nan = b.or_(b.or_(e.isnan(x), e.isnan(y)),
                b.or_(b.icmp_unsigned("==", ax, inf_bits), b.icmp_unsigned("==", ay, e.ci(0))))
    small = b.icmp_unsigned("<", ax, ay)  # |x| < |y| (y = inf included): x itself
    main = b.not_(b.or_(nan, small))

    def parts(bits):
        field = b.lshr(bits, e.ci(f.mant))
        m = b.and_(bits, e.ci((1 << f.mant) - 1))
        m = b.or_(m, e.sel(b.icmp_unsigned("==", field, e.ci(0)), e.ci(0), e.ci(1 << f.mant)))
        q = e.imax(field, e.ci(1))  # subnormals: exponent field 0 counts as 1
        if e.ity is not i64:
            m, q = b.zext(m, i64), b.zext(q, i64)
        return m, q

    mx, qx = parts(ax)
    my, qy = parts(ay)
    my = b.select(main, my, ir.Constant(i64, 1))  # no division by zero in other lanes
    d0 = b.select(main, b.sub(qx, qy), ir.Constant(i64, 0))
    r0 = b.urem(mx, my)

    entry = b.block
    head = b.append_basic_block("fmod.loop")
    body = b.append_basic_block("fmod.step")
    done = b.append_basic_block("fmod.done")
    b.branch(head)
    b.position_at_end(head)
    r = b.phi(i64)
    d = b.phi(i64)
    r.add_incoming(r0, entry)
    d.add_incoming(d0, entry)
    b.cbranch(b.icmp_signed(">", d, ir.Constant(i64, 0)), body, done)
    b.position_at_end(body)
    k = b.select(b.icmp_signed("<", d, ir.Constant(i64, chunk)), d, ir.Constant(i64, chunk))
    r.add_incoming(b.urem(b.shl(r, k), my), body)
    d.add_incoming(b.sub(d, k), body)
    b.branch(head)
    b.position_at_end(done)

    # r * 2^(qy - bias - mant), exact; 2^that is subnormal for the smallest qy
    scale = b.sub(qy, ir.Constant(i64, f.bias + f.mant))
    if e.ity is not i64:
        scale = b.trunc(scale, e.ity)
    normal = e.pow2(scale)
    tiny = e.from_bits(b.shl(e.ci(1), b.add(scale, e.ci(f.bias + f.mant - 1))))
    p2 = e.sel(b.icmp_signed("<", scale, e.ci(1 - f.bias)), tiny, normal)
    rem = e.copysign(e.mul(b.sitofp(r, e.ty), p2), x)
    return e.sel(nan, e.c(float("nan")), e.sel(small, x, rem))


# ---------------------------------------------------------------- half conversions
def _f16_to(e: _Emitter, h: ir.Value) -> ir.Value:
    """Half bits -> the format's value, exact; NaN quiet with its sign and payload."""
    f, b = e.fmt, e.b
    shift = f.mant - 10
    x = b.zext(h, e.ity)
    sign = b.shl(b.and_(x, e.ci(0x8000)), e.ci(e.ity.width - 16))
    em = b.and_(x, e.ci(0x7FFF))
    shifted = b.shl(em, e.ci(shift))
    normal = b.add(shifted, e.ci((f.bias - 15) << f.mant))
    special = b.or_(shifted, e.ci(e.emax << f.mant))  # inf, NaN: payload kept
    quiet = e.sel(b.icmp_unsigned(">", em, e.ci(0x7C00)), e.ci(1 << (f.mant - 1)), e.ci(0))
    special = b.or_(special, quiet)
    # subnormal halves are em * 2^-24 (em from i32: vectorizes without AVX-512DQ)
    em32 = b.and_(b.zext(h, I32), ir.Constant(I32, 0x7FFF))
    tiny = e.bits(e.mul(b.sitofp(em32, e.ty), e.c(2.0 ** -24)))
    mag = e.sel(b.icmp_unsigned("<", em, e.ci(0x400)), tiny,
                e.sel(b.icmp_unsigned("<", em, e.ci(0x7C00)), normal, special))
    return e.from_bits(b.or_(mag, sign))


def _f32_bits_to_f16(e: _Emitter, bits: ir.Value) -> ir.Value:
    """Float bits -> half bits, rounded to nearest even (as i32; 16 significant bits)."""
    b, ci = e.b, e.ci
    sign = b.and_(b.lshr(bits, ci(16)), ci(0x8000))
    a = b.and_(bits, ci(0x7FFFFFFF))
    # normal halves: rebias, add 0x0fff plus the bit that becomes the last one (ties to
    # even), shift; a carry out of the significand steps the exponent, as it should
    lsb = b.and_(b.lshr(a, ci(13)), ci(1))
    normal = b.lshr(b.add(b.add(b.sub(a, ci(112 << 23)), ci(0xFFF)), lsb), ci(13))
    # |x| < 2^-14: adding 0.5 rounds to the half's subnormal spacing 2^-24 (the ulp of 0.5)
    tiny = b.sub(e.bits(e.add(e.from_bits(a), e.c(0.5))), ci(0x3F000000))
    nan = b.or_(ci(0x7E00), b.and_(b.lshr(a, ci(13)), ci(0x3FF)))
    h = e.sel(b.icmp_unsigned("<", a, ci(0x38800000)), tiny, normal)
    h = e.sel(b.icmp_unsigned(">=", a, ci(0x477FF000)), ci(0x7C00), h)  # 65520 and up: inf
    h = e.sel(b.icmp_unsigned(">", a, ci(0x7F800000)), nan, h)
    return b.or_(h, sign)


def _f32_to_f16(e: _Emitter, x: ir.Value) -> ir.Value:
    return e.b.trunc(_f32_bits_to_f16(e, e.bits(x)), I16)


def _f64_to_f16(e: _Emitter, x: ir.Value) -> ir.Value:
    """Round to odd into f32 (24 >= 11 + 2 bits), then to half: one correct rounding."""
    b = e.b
    e32 = _Emitter(b, _F32)
    t = b.fptrunc(x, F32)
    back = b.fpext(t, F64)
    # t is RN(x); inexact and even: step to the odd neighbour on x's side (an overflow to
    # inf steps back to FLT_MAX, an underflow to 0 up to the smallest subnormal)
    to_odd = b.and_(e.ne(back, x), b.not_(e32.is_odd(t)))
    away = e.lt(e.fabs(back), e.fabs(x))
    tb = e32.bits(t)
    tb = e32.sel(to_odd, b.add(tb, e32.sel(away, e32.ci(1), e32.ci(-1))), tb)
    h = _f32_bits_to_f16(e32, tb)
    # NaN from x's own bits (fptrunc's NaN payload is not specified by LLVM)
    xb = e.bits(x)
    nan = b.or_(b.and_(b.lshr(xb, e.ci(48)), e.ci(0x8000)),
                b.or_(e.ci(0x7E00), b.and_(b.lshr(xb, e.ci(42)), e.ci(0x3FF))))
    h = e32.sel(e.isnan(x), b.trunc(nan, I32), h)
    return b.trunc(h, I16)


# ---------------------------------------------------------------- registry
_ARITH: dict[str, tuple[Callable[..., ir.Value], int]] = {
    "fma": (_fma, 3), "fmod": (_fmod, 2), "floor": (_rounding("floor"), 1),
    "ceil": (_rounding("ceil"), 1), "trunc": (_rounding("trunc"), 1),
    "rint": (_rounding("rint"), 1),
}
# name: (argument type, result type, format the builder works in, builder)
_CONVERSIONS: dict[str, tuple[ir.Type, ir.Type, Format, Callable[..., ir.Value]]] = {
    "f16_to_f32": (I16, F32, _F32, _f16_to),
    "f16_to_f64": (I16, F64, _F64, _f16_to),
    "f32_to_f16": (F32, I16, _F32, _f32_to_f16),
    "f64_to_f16": (F64, I16, _F64, _f64_to_f16),
}


def get(module: ir.Module, name: str, ty: ir.Type) -> ir.Function:
    """The function ``hg.sf.<name>.<suffix>`` in ``module``, emitted on first use.

    Arithmetic (``fma``, ``fmod``, ``floor``, ``ceil``, ``trunc``, ``rint``): ``ty`` is
    ``ir.FloatType()`` or ``ir.DoubleType()``, the type of the arguments (three for fma, two
    for fmod) and of the result. Conversions: ``ty`` is the argument type, ``i16`` (half
    bits) for ``f16_to_f32``/``f16_to_f64``, float for ``f32_to_f16``, double for
    ``f64_to_f16``; the result is float, double or ``i16``. The function is internal and
    ``alwaysinline``.
    """
    if name in _ARITH:
        build, nargs = _ARITH[name]
        if isinstance(ty, ir.FloatType):
            fmt = _F32
        elif isinstance(ty, ir.DoubleType):
            fmt = _F64
        else:
            raise TypeError(f"softfloat {name} takes float or double, not {ty}")
        arg_ty = ret_ty = TYPES[fmt.name][0]
    elif name in _CONVERSIONS:
        arg_ty, ret_ty, fmt, build = _CONVERSIONS[name]
        nargs = 1
        if ty != arg_ty:
            raise TypeError(f"softfloat {name} takes {arg_ty} (the argument type), not {ty}")
    else:
        raise ValueError(f"softfloat has no function {name!r} (known: {', '.join(FUNCTIONS)})")
    suffix = "i16" if arg_ty == I16 else {"float": "f32", "double": "f64"}[str(arg_ty)]
    fname = f"hg.sf.{name}.{suffix}"
    existing = module.globals.get(fname)
    if existing is not None:
        return existing
    new = ir.namespace(module)  # (tests also emit into llvmlite modules)
    fn = new.Function(module, ir.FunctionType(ret_ty, [arg_ty] * nargs), fname)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    builder = new.IRBuilder(fn.append_basic_block("entry"))
    builder.ret(build(_Emitter(builder, fmt), *fn.args))
    return fn
