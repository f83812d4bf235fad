"""Transcendental functions written in LLVM IR, so that loops calling them vectorize.

``llvm.exp.f32`` and friends lower to scalar libm calls, which stop LLVM's loop
vectorizer. :func:`get` instead emits ``hg.<name>.f32`` / ``hg.<name>.f64``: internal,
``alwaysinline`` functions built only from instructions that vectorize (``fma``, ``rint``,
``floor``, ``fabs``, ``copysign``, ``fdiv``, ``ldexp`` on AVX-512, selects, bitcasts and
integer ops). There are no branches and no calls to libm, in f32 and in f64 alike; special
values are patched in with selects at the end. Every ``fma`` is ``llvm.fma`` (exact
semantics, so results are the same on every host, f32 sigmoid's last bit excepted); on
targets without FMA or SSE4.1, ``fma``, ``rint`` and ``floor`` are our own exact IR
instead (:mod:`.intrinsics`), never library calls.

The algorithms (docs/mathlib.md has the details and the measured errors):

- exp, exp2, expm1: ``x = k*ln2 + r`` (Cody-Waite, ``|r| <= ln2/2``), a minimax polynomial
  for ``e^r``, and ``2^k`` applied so that denormal results round once: ``llvm.ldexp``
  (``vscalefps``) on AVX-512 hosts, elsewhere two multiplications by powers of two.
- log, log2, log1p: ``x = 2^k * m`` with ``m`` in ``[sqrt(1/2), sqrt(2))`` (denormals are
  scaled first), ``s = f/(2+f)`` with ``f = m - 1`` and an odd polynomial in ``s``.
- tanh, erf (f32): ``x*P(x^2)/Q(x^2)``, a rational minimax fit, clamped to +-1 where the
  function rounds to 1 (a short dependency chain; within 6.3 ulp).
- tanh (f64) = ``e/(e+2)`` with ``e = expm1(2|x|)``; sigmoid = ``1/(1+e^-x)``
  (``e^x/(1+e^x)`` for ``x < 0``; f32 divides with a reciprocal estimate, a Newton step and
  a residual correction instead of ``vdivps``); erf (f64) = ``x + x*P(x^2)`` below 1 and
  ``1 - exp(h(x) - x^2)`` above.
- sin, cos: ``x = j*pi/2 + r`` with ``pi/2`` split in three constants (fma keeps every step
  exact or rounded relative to ``r``), minimax polynomials for sin and cos on ``|r| <= 0.8``.
- pow: f32 evaluates ``exp2(y*log2|x|)`` in f64; f64 carries ``log2|x|`` and ``y*log2|x|`` in
  double-double. Then the C99 special cases.

Polynomial coefficients come from a weighted Remez fit (mpmath, 50 digits) of the stated
function on the stated interval (the f32 tanh and erf rational functions from a
Lawson-reweighted linearized least-squares fit, which converges to the minimax one),
rounded to the format.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llvmlite import ir

from hologram.backends.cpu import intrinsics
from hologram.backends.cpu import llvm as _llvm
from hologram.backends.cpu import target as _targets
from hologram.backends.cpu.target import Target

FUNCTIONS = ("exp", "exp2", "expm1", "log", "log2", "log1p", "tanh", "sigmoid", "erf", "sin",
             "cos", "pow")


def _use_scalef(target: Target | None = None) -> bool:
    """Scale by 2^n with ``llvm.ldexp`` where the target has it as an instruction (AVX-512
    ``vscalefps``, SVE ``fscale``; elsewhere it is a libm call)."""
    return _llvm.lowers_natively(target or _targets.current(), "ldexp", "float")


@dataclass(frozen=True)
class _Format:
    """One float format: its types, bit layout, and the constants of every algorithm."""

    ty: ir.Type
    ity: ir.IntType
    suffix: str
    mant: int  # explicit mantissa bits
    bias: int
    k: dict


_F32 = _Format(ir.FloatType(), ir.IntType(32), "f32", 23, 127, dict(
    # exp: clamp so that 2^k stays in the two-step scaling range (exp2: NaN becomes lo).
    exp_lo=-104.0, exp_hi=89.0, exp2_lo=-151.0, exp2_hi=129.0, expm1_lo=-20.0,
    round_magic=1.5 * 2.0 ** 23,  # x + magic rounds x to an integer, in the low bits
    # ln2_hi has trailing zeros: k*ln2_hi is exact for |k| < 512.
    ln2_hi=0.693145751953125, ln2_lo=1.4286068e-06, log2e=1.442695, log2e_lo=1.925963e-08,
    sqrt_half_bits=0x3F3504F3, min_normal=2.0 ** -126, tiny=2.0 ** -25,
    two_over_pi=0.63661975, pio2=(1.5707964, -4.371139e-08, -1.7151245e-15),
    erf_max=3.93,
    # e^r = 1 + r + r^2 P(r), |r| <= 0.3467: rel. error 2^-28.3
    exp=(0.49999994, 0.16666521, 0.04166839, 0.008368735, 0.0013814559),
    # 2^r = 1 + r Q(r), |r| <= 0.5001: 2^-28.5
    exp2=(0.69314724, 0.24022652, 0.055503104, 0.009617693, 0.0013406675, 0.0001559476),
    # expm1(r) = r + r^2 P(r), |r| <= 0.3467: 2^-31.8
    expm1=(0.5, 0.16666667, 0.041666325, 0.00833322, 0.0013943239, 0.00019962236),
    # log1p(f) = 2s + s z R(z), z = s^2 <= 0.0295: 2^-30.2 relative to log1p
    log=(0.66666776, 0.39977443, 0.29874596),
    # sin(r) = r + r z S(z), cos(r) = 1 - z/2 + z^2 C(z), |r| <= 0.8: 2^-27.8, 2^-32.7
    sin=(-0.16666654, 0.008332071, -0.00019503069),
    cos=(0.04166664, -0.0013887194, 2.4419196e-05),
    # tanh(x) = x P(z)/Q(z), z = x^2, |x| < tanh_max: 2^-29.3 (P(0) = 1)
    tanh_max=9.1,
    tanh_p=(1.0, 0.13677788, 0.0038656334, 2.7951364e-05, 3.0443378e-08, -1.2092532e-11),
    tanh_q=(1.0, 0.4701112, 0.027236052, 0.00039338187, 1.2833565e-06),
    # erf(x) = x P(z)/Q(z), |x| < erf_max: 2^-28.9 relative to erf
    erf_p=(1.1283792, 0.18524326, 0.05424647, 0.0038415594, 0.0003763393, 4.5953625e-06,
           -1.2736132e-08),
    erf_q=(1.0, 0.49750096, 0.11390794, 0.015434342, 0.0013015682, 6.226847e-05),
))

_F64 = _Format(ir.DoubleType(), ir.IntType(64), "f64", 52, 1023, dict(
    exp_lo=-746.0, exp_hi=710.0, exp2_lo=-1076.0, exp2_hi=1025.0, expm1_lo=-40.0,
    round_magic=1.5 * 2.0 ** 52,
    # k*ln2_hi is exact for |k| < 2048.
    ln2_hi=0.6931471803691238, ln2_lo=1.9082149292705877e-10,
    log2e=1.4426950408889634, log2e_lo=2.0355273740931033e-17,
    sqrt_half_bits=0x3FE6A09E667F3BCD, min_normal=2.0 ** -1022, tiny=2.0 ** -54,
    two_over_pi=0.6366197723675814,
    pio2=(1.5707963267948966, 6.123233995736766e-17, -1.4973849048591698e-33),
    erf_max=5.95, erf_mid=3.475,
    exp=(0.5000000000000011, 0.16666666666666413, 0.04166666666652987, 0.0083333333334948,
         0.0013888888943716152, 0.00019841269506052923, 2.4801493000003128e-05,
         2.7557586652652393e-06, 2.7630286722773744e-07, 2.5000035032565198e-08),  # 2^-57.9
    exp2=(0.6931471805599453, 0.24022650695910072, 0.055504108664821736,
          0.009618129107628562, 0.001333355814638166, 0.0001540353039317143,
          1.5252733864921352e-05, 1.321548700372157e-06, 1.017804749902307e-07,
          7.054814737382719e-09, 4.45724420060069e-10, 2.5855339577182568e-11),  # 2^-63.9
    expm1=(0.5000000000000001, 0.1666666666666667, 0.04166666666665226, 0.008333333333326138,
           0.0013888888895607794, 0.00019841269874818407, 2.480157452457597e-05,
           2.7557255394184374e-06, 2.756793278633785e-07, 2.510522236843833e-08,
           1.7687743916185147e-09),  # 2^-58.4
    # log: the leading 2/3 is exact up to two_thirds_lo (pow splits that term off)
    log=(0.6666666666666666, 0.4000000000000229, 0.2857142857008262, 0.22222222523087598,
         0.18181784079049074, 0.1538677107681702, 0.13256487386006002,
         0.13199483884652216),  # 2^-66.3
    two_thirds_lo=3.700743415417188e-17,
    sin=(-0.1666666666666662, 0.00833333333331984, -0.000198412698277288,
         2.755731296519653e-06, -2.5050643629024784e-08, 1.5890126957280015e-10),  # 2^-57.6
    cos=(0.041666666666666574, -0.0013888888888869803, 2.4801587286801596e-05,
         -2.755731358277143e-07, 2.0875619293827275e-09, -1.1354295565802246e-11),  # 2^-63.5
    erf_small=(0.12837916709551256, -0.3761263890318352, 0.11283791670944185,
               -0.026866170643111472, 0.005223977606118506, -0.0008548325929315693,
               0.00012055293576926806, -1.4924712302354576e-05, 1.6447131573866857e-06,
               -1.6206313767338633e-07, 1.37109803952795e-08,
               -7.779468417563063e-10),  # 2^-56.9
    erf_tail=(-1.855764051100047, -0.26777178854077927, 0.033642169440048636,
              -0.005313955690269998, 0.0008923253956845053, -0.00015101788473466065,
              2.5071923068568316e-05, -3.993148480974822e-06, 6.375700642042494e-07,
              -5.509422864690008e-08, 1.476856636162782e-08, -1.3171079558701191e-08,
              -1.4416711821136655e-08, -8.241434707590637e-09, -2.9571172937412423e-09,
              -6.585366328060996e-10, -8.666924110614131e-11,
              -4.928968629945462e-12),  # 2^-57.0
))


class _Emitter:
    """An IRBuilder bound to one float format, with the operations the algorithms use."""

    def __init__(self, builder: ir.IRBuilder, fmt: _Format, target: Target):
        self.b = builder
        self.f = fmt
        self.k = fmt.k
        self.target = target

    # constants and intrinsics
    def c(self, value: float) -> ir.Constant:
        return ir.Constant(self.f.ty, value)

    def ci(self, value: int) -> ir.Constant:
        return ir.Constant(self.f.ity, value)

    def _call(self, base: str, *args: ir.Value) -> ir.Value:
        return intrinsics.call(self.b, base, list(args), self.target)

    def fma(self, a, b, c):
        return self._call("fma", a, b, c)

    def fabs(self, a):
        return self._call("fabs", a)

    def floor(self, a):
        return self._call("floor", a)

    def rint(self, a):
        return self._call("rint", a)

    def copysign(self, a, b):
        return self._call("copysign", a, b)

    # arithmetic
    def add(self, a, b):
        return self.b.fadd(a, b)

    def sub(self, a, b):
        return self.b.fsub(a, b)

    def mul(self, a, b):
        return self.b.fmul(a, b)

    def div(self, a, b):
        return self.b.fdiv(a, b)

    def neg(self, a):
        return self.b.fneg(a)

    def horner(self, x, coeffs: Sequence[float]):
        """c0 + x*(c1 + x*(c2 + ...)), one fma per step."""
        acc = self.c(coeffs[-1])
        for coeff in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, self.c(coeff))
        return acc

    # comparisons and selects (ordered: false for NaN)
    def lt(self, a, b):
        return self.b.fcmp_ordered("<", a, b)

    def eq(self, a, b):
        return self.b.fcmp_ordered("==", a, b)

    def isnan(self, a):
        return self.b.fcmp_unordered("uno", a, a)

    def sel(self, cond, a, b):
        return self.b.select(cond, a, b)

    def clamp_keep_nan(self, x, lo: float, hi: float | None = None):
        """x limited to [lo, hi], NaN stays NaN (x86: ``maxps(lo, x)``, ``minps(hi, x)``)."""
        x = self.sel(self.lt(x, self.c(lo)), self.c(lo), x)
        if hi is not None:
            x = self.sel(self.lt(self.c(hi), x), self.c(hi), x)
        return x

    def clamp(self, x, lo: float, hi: float):
        """x limited to [lo, hi]; NaN becomes lo (callers patch NaN in afterwards)."""
        x = self.sel(self.lt(self.c(lo), x), x, self.c(lo))
        return self.sel(self.lt(x, self.c(hi)), x, self.c(hi))

    # bits
    def to_int(self, a):
        return self.b.fptosi(a, self.f.ity)

    def to_float(self, n):
        return self.b.sitofp(n, self.f.ty)

    def pow2i(self, n):
        """2^n for an integer n in the normal exponent range."""
        bits = self.b.shl(self.b.add(n, self.ci(self.f.bias)), self.ci(self.f.mant))
        return self.b.bitcast(bits, self.f.ty)

    def round_mul(self, x, c: float):
        """rint(x*c) as a float and as an integer, for |x*c| < 2^(mant-1).

        Adding 1.5*2^mant rounds to an integer (the fma rounds x*c once) and leaves it in the
        low bits: the integer is those bits minus the constant's.
        """
        magic = self.c(self.k["round_magic"])
        kf = self.fma(x, self.c(c), magic)
        n = self.b.sub(self.b.bitcast(kf, self.f.ity), self.b.bitcast(magic, self.f.ity))
        # sitofp(n), not kf - magic: ldexp's x86 lowering converts n too, the two share one
        # vcvtdq2ps
        return self.to_float(n), n

    def scale(self, p, n):
        """p * 2^n rounded once (a denormal result too).

        With AVX-512, ``llvm.ldexp`` (one ``vscalefps``, also right for NaN p); elsewhere
        in two exact steps of multiplying by a power of two built from bits, because ldexp
        would become library calls there.
        """
        if _use_scalef(self.target):
            i32 = ir.IntType(32)
            name = f"llvm.ldexp.{self.f.suffix}.i32"
            fn = self.b.module.globals.get(name)
            if fn is None:
                fn = ir.Function(self.b.module, ir.FunctionType(self.f.ty, [self.f.ty, i32]),
                                 name)
            if self.f.ity.width != 32:
                n = self.b.trunc(n, i32)
            return self.b.call(fn, [p, n])
        half = self.b.ashr(n, self.ci(1))
        return self.mul(self.mul(p, self.pow2i(half)), self.pow2i(self.b.sub(n, half)))


# ---------------------------------------------------------------- exp family
def _exp_core(e: _Emitter, x: ir.Value, lo: ir.Value | None = None) -> ir.Value:
    """e^(x + lo) for finite x in [exp_lo, exp_hi] (lo: a small correction term)."""
    kf, n = e.round_mul(x, e.k["log2e"])
    r = e.fma(e.neg(kf), e.c(e.k["ln2_hi"]), x)  # exact: ln2_hi has trailing zeros
    r = e.fma(e.neg(kf), e.c(e.k["ln2_lo"]), r)
    if lo is not None:
        r = e.add(r, lo)
    one = e.c(1.0)
    p = e.fma(r, e.fma(r, e.horner(r, e.k["exp"]), one), one)  # 1 + r(1 + r P(r))
    return e.scale(p, n)


def _exp(e: _Emitter, x: ir.Value) -> ir.Value:
    """e^x; a NaN x runs through as NaN."""
    return _exp_core(e, e.clamp_keep_nan(x, e.k["exp_lo"], e.k["exp_hi"]))


def _exp2(e: _Emitter, x: ir.Value, lo: ir.Value | None = None) -> ir.Value:
    """2^(x + lo); lo (optional) is the low part of a double-word argument."""
    xc = e.clamp(x, e.k["exp2_lo"], e.k["exp2_hi"])
    kf = e.rint(xc)
    r = e.sub(xc, kf)  # exact
    if lo is not None:  # a clamped argument is past over/underflow: its low part is noise
        r = e.add(r, e.sel(e.eq(xc, x), lo, e.c(0.0)))
    p = e.fma(r, e.horner(r, e.k["exp2"]), e.c(1.0))
    return e.sel(e.isnan(x), x, e.scale(p, e.to_int(kf)))


def _expm1_core(e: _Emitter, x: ir.Value) -> ir.Value:
    """e^x - 1 for finite x in [expm1_lo, exp_hi] and |x| >= tiny."""
    kf = e.rint(e.mul(x, e.c(e.k["log2e"])))
    r = e.fma(e.neg(kf), e.c(e.k["ln2_hi"]), x)
    r = e.fma(e.neg(kf), e.c(e.k["ln2_lo"]), r)
    t = e.mul(e.mul(r, r), e.horner(r, e.k["expm1"]))
    hi = e.add(r, t)  # expm1(r) = r + r^2 P(r) = hi + lo
    lo = e.add(e.sub(r, hi), t)
    # e^x - 1 = 2^k (1 + hi + lo) - 1 = 2 (s hi + (s - 1/2) + s lo) with s = 2^(k-1):
    # s - 1/2 is exact wherever it matters, s hi + (s - 1/2) is exact when they cancel
    # (k = 1), and halving keeps 2^k in range up to k = 128 (1024).
    s = e.pow2i(e.b.sub(e.to_int(kf), e.ci(1)))
    return e.mul(e.c(2.0), e.fma(s, lo, e.fma(s, hi, e.sub(s, e.c(0.5)))))


def _expm1(e: _Emitter, x: ir.Value) -> ir.Value:
    y = _expm1_core(e, e.clamp(x, e.k["expm1_lo"], e.k["exp_hi"]))
    y = e.sel(e.lt(e.fabs(x), e.c(e.k["tiny"])), x, y)  # x + x^2/2 rounds to x; keeps -0.0
    return e.sel(e.isnan(x), x, y)


# ---------------------------------------------------------------- log family
def _log_parts(e: _Emitter, x: ir.Value) -> tuple[ir.Value, ...]:
    """x > 0 finite as 2^k (1 + f): returns k (float), f, f^2/2, s = f/(2+f), R.

    log(1 + f) = f - f^2/2 + s (f^2/2 + R), |s| <= 0.1716.
    """
    sub = e.lt(x, e.c(e.k["min_normal"]))
    xs = e.sel(sub, e.mul(x, e.c(2.0 ** e.f.mant)), x)  # denormals: normalize first
    b, ci = e.b, e.ci
    ix = b.sub(b.bitcast(xs, e.f.ity), ci(e.k["sqrt_half_bits"]))
    k = b.add(b.ashr(ix, ci(e.f.mant)), b.select(sub, ci(-e.f.mant), ci(0)))
    mbits = b.add(b.and_(ix, ci((1 << e.f.mant) - 1)), ci(e.k["sqrt_half_bits"]))
    f = e.sub(b.bitcast(mbits, e.f.ty), e.c(1.0))  # exact, m in [sqrt(1/2), sqrt(2))
    s = e.div(f, e.add(e.c(2.0), f))
    z = e.mul(s, s)
    r = e.mul(z, e.horner(z, e.k["log"]))
    hfsq = e.mul(e.c(0.5), e.mul(f, f))
    return e.to_float(k), f, hfsq, s, r


def _log_specials(e: _Emitter, x: ir.Value, y: ir.Value, zero_at: float = 0.0) -> ir.Value:
    """Patch log-like results: pole at ``zero_at`` (-inf), NaN below it, log(inf) = inf."""
    y = e.sel(e.eq(x, e.c(math.inf)), x, y)
    y = e.sel(e.eq(x, e.c(zero_at)), e.c(-math.inf), y)
    y = e.sel(e.lt(x, e.c(zero_at)), e.c(math.nan), y)
    return e.sel(e.isnan(x), x, y)


def _log_from(e: _Emitter, kf, f, hfsq, s, r, corr: ir.Value | None = None) -> ir.Value:
    """k ln2 + log(1 + f) (+ corr), fdlibm's ordering of the sums."""
    lo = e.mul(kf, e.c(e.k["ln2_lo"]))
    if corr is not None:
        lo = e.add(lo, corr)
    t = e.fma(s, e.add(hfsq, r), lo)
    return e.sub(e.mul(kf, e.c(e.k["ln2_hi"])), e.sub(e.sub(hfsq, t), f))


def _log(e: _Emitter, x: ir.Value) -> ir.Value:
    return _log_specials(e, x, _log_from(e, *_log_parts(e, x)))


def _log2(e: _Emitter, x: ir.Value) -> ir.Value:
    kf, f, hfsq, s, r = _log_parts(e, x)
    # log(1+f) = hi + lo exactly enough: f - hi and (f - hi) - hfsq are exact (Sterbenz).
    hi = e.sub(f, hfsq)
    lo = e.fma(s, e.add(hfsq, r), e.sub(e.sub(f, hi), hfsq))
    # times log2(e) as a double-word product, then k + (that) with an exact sum.
    c_hi, c_lo = e.c(e.k["log2e"]), e.c(e.k["log2e_lo"])
    ph = e.mul(hi, c_hi)
    pl = e.add(e.fma(hi, c_hi, e.neg(ph)), e.fma(hi, c_lo, e.mul(lo, c_hi)))
    w = e.add(kf, ph)
    err = e.add(e.sub(kf, w), ph)  # |kf| >= |ph| whenever kf != 0
    return _log_specials(e, x, e.add(w, e.add(err, pl)))


def _log1p(e: _Emitter, x: ir.Value) -> ir.Value:
    one = e.c(1.0)
    u = e.add(one, x)
    # c = (1 + x) - u exactly (Fast2Sum, bigger operand first); log1p(x) = log(u) + c/u.
    big = e.lt(one, e.fabs(x))
    c = e.sel(big, e.sub(one, e.sub(u, x)), e.sub(x, e.sub(u, one)))
    y = _log_from(e, *_log_parts(e, u), corr=e.div(c, u))
    y = e.sel(e.lt(e.fabs(x), e.c(e.k["tiny"])), x, y)
    return _log_specials(e, x, y, zero_at=-1.0)


# ---------------------------------------------------------------- tanh, sigmoid, erf
def _odd_rational(e: _Emitter, x: ir.Value, name: str) -> ir.Value:
    """x P(x^2)/Q(x^2) for |x| < <name>_max, copysign(1, x) beyond, NaN for NaN (f32).

    The two polynomials run side by side and the dependency chain is short: in the
    vectorized loop that chain, not the instruction count, is what costs. The price is
    accuracy: the f32 Horner steps of P and Q round up to ~2.5 ulp each at the top of the
    range, so the result is within 6-7 ulp (docs/mathlib.md). Where P(0) = 1, x * 1 / 1
    returns denormals and -0.0 unchanged.
    """
    z = e.mul(x, x)  # inf for huge x: the quotient is NaN there and replaced below
    q = e.div(e.mul(x, e.horner(z, e.k[name + "_p"])), e.horner(z, e.k[name + "_q"]))
    inner = e.b.fcmp_unordered("<", e.fabs(x), e.c(e.k[name + "_max"]))  # true for NaN
    # Near the top of the range the rounded quotient can exceed 1 by an ulp, where the
    # function itself is just below: 1 is then the better answer, and keeps |f| <= 1.
    bounded = e.b.fcmp_unordered("<=", e.fabs(q), e.c(1.0))
    return e.sel(e.b.and_(inner, bounded), q, e.copysign(e.c(1.0), x))


def _tanh(e: _Emitter, x: ir.Value) -> ir.Value:
    if "tanh_p" in e.k:  # f32: a rational minimax approximation
        return _odd_rational(e, x, "tanh")
    a = e.fabs(x)
    em = _expm1_core(e, e.mul(e.c(2.0), e.clamp(a, e.k["tiny"], 20.0)))  # tanh(20) == 1
    y = e.copysign(e.div(em, e.add(em, e.c(2.0))), x)
    y = e.sel(e.lt(a, e.c(e.k["tiny"])), x, y)
    return e.sel(e.isnan(x), x, y)


def _sigmoid(e: _Emitter, x: ir.Value) -> ir.Value:
    a = e.neg(e.fabs(x))
    # exp(a) for a <= 0: below exp_lo (also -inf) the reduction is garbage or NaN and t is
    # 0 instead (a select, not a clamp: on x86 it keeps the busy FP port free); NaN stays
    t = e.sel(e.lt(a, e.c(e.k["exp_lo"])), e.c(0.0), _exp_core(e, a))
    num = e.sel(e.b.fcmp_ordered(">=", x, e.c(0.0)), e.c(1.0), t)
    den = e.add(e.c(1.0), t)
    if e.f is _F32:
        # vdivps is slow. ``arcp`` lets LLVM compute 1/den as a reciprocal estimate and a
        # Newton step (x86: vrcp14ps or the 12-bit vrcpps, then two fma), good to ~2^-23
        # (den is in [1, 2] or NaN, never inf: ``ninf`` holds); then one more correction
        # with the exact residual makes num/den accurate to 0.5 ulp + 2^-20 ulp whatever
        # the estimate's precision (a scalar tail gets a true divss, same bound).
        rinv = e.b.fdiv(e.c(1.0), den, flags=("arcp", "ninf", "contract"))
        q = e.mul(num, rinv)
        return e.fma(e.fma(e.neg(den), q, num), rinv, q)
    return e.div(num, den)


def _erf(e: _Emitter, x: ir.Value) -> ir.Value:
    if "erf_p" in e.k:  # f32: a rational minimax approximation
        return _odd_rational(e, x, "erf")
    a = e.fabs(x)
    small = e.fma(x, e.horner(e.mul(x, x), e.k["erf_small"]), x)  # x + x P: P rounds small
    # erfc(a) = exp(H(a) - a^2); a^2 is carried as a double word (hi + lo) because an
    # error in the exponent is a relative error in erfc.
    ac = e.clamp(a, 1.0, e.k["erf_max"])
    h = e.horner(e.sub(ac, e.c(e.k["erf_mid"])), e.k["erf_tail"])
    sq = e.mul(ac, ac)
    sq_lo = e.fma(ac, ac, e.neg(sq))
    erfc = _exp_core(e, e.sub(h, sq), lo=e.neg(sq_lo))
    big = e.copysign(e.sub(e.c(1.0), erfc), x)
    y = e.sel(e.lt(a, e.c(1.0)), small, big)
    return e.sel(e.isnan(x), x, y)


# ---------------------------------------------------------------- sin, cos
def _sincos(e: _Emitter, x: ir.Value, cos: bool) -> ir.Value:
    j = e.rint(e.mul(x, e.c(e.k["two_over_pi"])))
    r = x
    for part in e.k["pio2"]:  # x - j*pi/2: the first fma is exact, the others round
        r = e.fma(e.neg(j), e.c(part), r)  # relative to r itself
    # |r| <= pi/4 + |x| 2^-p; clamping only matters past the accurate range and keeps
    # the polynomials (and so the result) bounded there.
    r = e.clamp(r, -0.8, 0.8)
    z = e.mul(r, r)
    sin_r = e.fma(e.mul(r, z), e.horner(z, e.k["sin"]), r)
    cos_r = e.fma(z, e.fma(z, e.horner(z, e.k["cos"]), e.c(-0.5)), e.c(1.0))
    finite = e.lt(e.fabs(x), e.c(math.inf))
    quadrant = e.sub(j, e.mul(e.c(4.0), e.floor(e.mul(j, e.c(0.25)))))  # j mod 4, exact
    q = e.to_int(e.sel(finite, quadrant, e.c(0.0)))  # no fptosi of inf or NaN
    if cos:
        q = e.b.add(q, e.ci(1))
    b, ci = e.b, e.ci
    swap = b.icmp_signed("!=", b.and_(q, ci(1)), ci(0))
    negate = b.icmp_signed("!=", b.and_(q, ci(2)), ci(0))
    y = e.sel(swap, cos_r, sin_r)
    y = e.sel(negate, e.neg(y), y)
    if not cos:
        y = e.sel(e.eq(x, e.c(0.0)), x, y)  # sin(-0.0) = -0.0
    return e.sel(finite, y, e.sub(x, x))  # inf - inf and NaN - NaN are NaN


def _sin(e: _Emitter, x: ir.Value) -> ir.Value:
    return _sincos(e, x, cos=False)


def _cos(e: _Emitter, x: ir.Value) -> ir.Value:
    return _sincos(e, x, cos=True)


# ---------------------------------------------------------------- pow
def _log2_dd(e: _Emitter, ax: ir.Value) -> tuple[ir.Value, ir.Value]:
    """log2(ax) for finite ax > 0 as a double word (hi, lo), relative error ~2^-62 (f64)."""
    kf, f, _, _, _ = _log_parts(e, ax)
    two = e.c(2.0)
    u = e.add(two, f)
    u_lo = e.add(e.sub(two, u), f)  # 2 + f = u + u_lo exactly
    s = e.div(f, u)
    s_lo = e.div(e.sub(e.fma(e.neg(s), u, f), e.mul(s, u_lo)), u)  # f/(2+f) = s + s_lo
    # log(1+f) = 2s + (2/3) s^3 + s^5 P(s^2): the first two terms in double words
    z = e.mul(s, s)
    z_lo = e.fma(s, s, e.neg(z))
    s3 = e.mul(s, z)
    s3_lo = e.fma(s, z_lo, e.fma(s, z, e.neg(s3)))
    c = e.c(e.k["log"][0])
    t1 = e.mul(c, s3)
    t1_lo = e.add(e.fma(c, s3, e.neg(t1)), e.fma(c, s3_lo, e.mul(e.c(e.k["two_thirds_lo"]), s3)))
    rest = e.mul(e.mul(s3, z), e.horner(z, e.k["log"][1:]))
    s2 = e.mul(two, s)
    lh = e.add(s2, t1)
    # 2 s_lo (1 + s^2): s_lo in the linear term and to first order in the cubic one
    extra = e.fma(e.mul(two, s_lo), e.add(e.c(1.0), z), rest)
    ll = e.add(e.add(e.sub(s2, lh), t1), e.add(extra, t1_lo))
    c_hi, c_lo = e.c(e.k["log2e"]), e.c(e.k["log2e_lo"])
    ph = e.mul(lh, c_hi)
    pl = e.add(e.fma(lh, c_hi, e.neg(ph)), e.fma(lh, c_lo, e.mul(ll, c_hi)))
    gh = e.add(kf, ph)
    return gh, e.add(e.add(e.sub(kf, gh), ph), pl)


def _pow_magnitude_f64(e: _Emitter, x: ir.Value, y: ir.Value) -> ir.Value:
    """|x|^y in double-word precision, with the IEEE results for |x| in {0, inf, NaN}."""
    ax = e.fabs(x)
    gh, gl = _log2_dd(e, ax)
    regular = e.b.and_(e.lt(e.c(0.0), ax), e.lt(ax, e.c(math.inf)))
    gh = e.sel(regular, gh, e.sel(e.eq(ax, e.c(0.0)), e.c(-math.inf), ax))  # inf, NaN: ax
    gl = e.sel(regular, gl, e.c(0.0))
    th = e.mul(y, gh)
    tl = e.fma(y, gl, e.fma(y, gh, e.neg(th)))
    tl = e.sel(e.lt(e.fabs(th), e.c(math.inf)), tl, e.c(0.0))
    return _exp2(e, th, lo=tl)


def _pow(e: _Emitter, x: ir.Value, y: ir.Value) -> ir.Value:
    if e.f is _F32:  # f64 inside: log2 and exp2 errors of 2^-50 vanish in the rounding
        e64 = _Emitter(e.b, _F64, e.target)
        xd, yd = e.b.fpext(x, _F64.ty), e.b.fpext(y, _F64.ty)
        mag = e.b.fptrunc(_exp2(e64, e64.mul(yd, _log2(e64, e64.fabs(xd)))), e.f.ty)
    else:
        mag = _pow_magnitude_f64(e, x, y)
    # C99 F.9.4.4 on top of exp2(y log2|x|), which already gives the 0/inf cases.
    b, one = e.b, e.c(1.0)
    y_int = e.eq(e.floor(y), y)  # infinities count as even integers
    half = e.mul(y, e.c(0.5))
    y_odd = b.and_(y_int, b.fcmp_ordered("!=", e.floor(half), half))
    x_sign = b.icmp_signed("<", b.bitcast(x, e.f.ity), e.ci(0))
    res = e.sel(b.and_(x_sign, y_odd), e.neg(mag), mag)
    finite_neg = b.and_(e.lt(x, e.c(0.0)), e.lt(e.c(-math.inf), x))
    res = e.sel(b.and_(finite_neg, b.not_(y_int)), e.c(math.nan), res)
    unit_inf = b.and_(e.eq(e.fabs(x), one), e.eq(e.fabs(y), e.c(math.inf)))
    res = e.sel(b.or_(unit_inf, e.eq(x, one)), one, res)
    return e.sel(e.eq(y, e.c(0.0)), one, res)


_BUILDERS: dict[str, Callable[..., ir.Value]] = {
    "exp": _exp, "exp2": _exp2, "expm1": _expm1, "log": _log, "log2": _log2,
    "log1p": _log1p, "tanh": _tanh, "sigmoid": _sigmoid, "erf": _erf, "sin": _sin,
    "cos": _cos, "pow": _pow,
}


def get(module: ir.Module, name: str, ty: ir.Type, target: Target | None = None
        ) -> ir.Function:
    """The function ``hg.<name>.f32`` / ``hg.<name>.f64`` in ``module``, emitted on first use
    for ``target`` (default: the current one).

    ``ty`` is ``ir.FloatType()`` or ``ir.DoubleType()``; the function takes one argument of
    that type (two for ``pow``) and returns that type. It is internal and ``alwaysinline``.
    """
    if name not in _BUILDERS:
        raise ValueError(f"mathlib has no function {name!r} (known: {', '.join(FUNCTIONS)})")
    if isinstance(ty, ir.FloatType):
        fmt = _F32
    elif isinstance(ty, ir.DoubleType):
        fmt = _F64
    else:
        raise TypeError(f"mathlib functions take float or double, not {ty}")
    fname = f"hg.{name}.{fmt.suffix}"
    existing = module.globals.get(fname)
    if existing is not None:
        return existing
    nargs = 2 if name == "pow" else 1
    fn = ir.Function(module, ir.FunctionType(fmt.ty, [fmt.ty] * nargs), fname)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    emitter = _Emitter(builder, fmt, target or _targets.current())
    builder.ret(_BUILDERS[name](emitter, *fn.args))
    return fn
