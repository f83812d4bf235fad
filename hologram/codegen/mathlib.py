"""The transcendental functions, written once for every device.

The algorithms below are written against :class:`MathEmitter`, a small set of primitive
operations on values of one float format (IEEE arithmetic, fma, comparisons, selects,
integer operations on the format's bits). A backend implements the primitives for its
device and gets every function from :func:`emit`: the cpu backend's emitter
(:mod:`hologram.backends.cpu.mathlib`) writes LLVM IR; another device's renderer implements
the same interface in its own language. Nothing here knows which.

The code is straight-line: no branches and no calls, in f32 and in f64 alike; special
values are patched in with selects at the end, so a loop calling a function vectorizes.
Every ``fma`` is an exact (single-rounding) fused multiply-add: the range reductions and
the double-word products rely on it, and results are the same bits on every device that
implements the primitives as specified (f32 sigmoid's last bit excepted:
:meth:`MathEmitter.fast_recip`).

The algorithms (docs/mathlib.md has the details and the measured errors):

- exp, exp2, expm1: ``x = k*ln2 + r`` (Cody-Waite, ``|r| <= ln2/2``), a minimax polynomial
  for ``e^r``, and ``2^k`` applied so that denormal results round once
  (:meth:`MathEmitter.scale`).
- log, log2, log1p: ``x = 2^k * m`` with ``m`` in ``[sqrt(1/2), sqrt(2))`` (denormals are
  scaled first), ``s = f/(2+f)`` with ``f = m - 1`` and an odd polynomial in ``s``.
- tanh, erf (f32): ``x*P(x^2)/Q(x^2)``, a rational minimax fit, clamped to +-1 where the
  function rounds to 1 (a short dependency chain; within 6.3 ulp).
- tanh (f64) = ``e/(e+2)`` with ``e = expm1(2|x|)``; sigmoid = ``1/(1+e^-x)``
  (``e^x/(1+e^x)`` for ``x < 0``; f32 divides with a reciprocal estimate and a residual
  correction instead of a division); erf (f64) = ``x + x*P(x^2)`` below 1 and
  ``1 - exp(h(x) - x^2)`` above.
- sin, cos: ``x = j*pi/2 + r`` with ``pi/2`` split in three constants (fma keeps every step
  exact or rounded relative to ``r``) for ``|x| < 2^17`` (f32) / ``2^46`` (f64); beyond, a
  Payne-Hanek reduction with words of ``2^e/(2 pi) mod 1`` cut from a copy of 2/pi,
  selected per element (both are computed); minimax polynomials for sin and cos on
  ``|r| <= 0.8``.
- pow: f32 evaluates ``exp2(y*log2|x|)`` in f64, with polynomials just long enough for an
  f32 result (errors near 2^-45); f64 carries ``log2|x|`` and ``y*log2|x|`` in
  double-double. Then the C99 special cases.

Polynomial coefficients come from a weighted Remez fit (mpmath, 50 digits; pow's:
``tools/remez.py``) of the stated function on the stated interval (the f32 tanh and erf
rational functions from a Lawson-reweighted linearized least-squares fit, which converges
to the minimax one), rounded to the format.

Use::

    e = MyEmitter(FORMATS["f32"], ...)          # a MathEmitter for the device
    y = mathlib.emit(e, "exp", x)               # x, y: the device's values

The order in which the algorithms call the primitives is part of their definition (an
emitter that writes instructions in call order writes them in the same order every time).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

#: The functions :func:`emit` knows, all of one argument except ``pow`` (two).
FUNCTIONS = ("exp", "exp2", "expm1", "log", "log2", "log1p", "tanh", "sigmoid", "erf", "sin",
             "cos", "pow")

#: A value of the emitter's device: a float of its format, an integer of the format's width
#: (two's complement) or a mask (a boolean per element). Opaque to the algorithms.
Value = Any


@dataclass(frozen=True)
class Format:
    """One float format: its bit layout and the constants of every algorithm."""

    name: str  # the ISA dtype name, "f32" or "f64"
    width: int  # bits of the format, and of the integers that hold them
    mant: int  # explicit mantissa bits
    bias: int  # exponent bias
    k: dict  # constants and polynomial coefficients, by name


# ---------------------------------------------------------------- sin/cos reduction tables
#: floor(2/pi * 2^1600): 2/pi = 0.a2f9836e4e441529fc27... in hex. The large-argument
#: reduction of sin and cos cuts its constants from these bits (tests check them with mpmath).
_TWO_OVER_PI = int(
    "a2f9836e4e441529fc2757d1f534ddc0db6295993c439041fe5163abdebbc561b7246e3a424dd2e0"
    "06492eea09d1921cfe1deb1cb129a73ee88235f52ebb4484e99c7026b45f7e413991d639835339f4"
    "9c845f8bbdf9283b1ff897ffde05980fef2f118b5a0a6d1f6d367ecf27cb09b74f463f669e5fea2d"
    "7527bac7ebe5f17b3d0739f78a5292ea6bfb5fb11f8d5d0856033046fc7b6babf0cfbc209af4361d"
    "a9e391615ee61b086599855f14a068408dffd8804d73273106061556ca73a8c960e27bc08c6b47c4", 16)
_TWO_OVER_PI_BITS = 1600


def _turns(e: int, bits: int) -> int:
    """floor(frac(2^e / (2 pi)) * 2^bits): the first ``bits`` bits of the fraction of 2^e
    radians in turns, exact (2^e/(2 pi) = 2^(e-2) * 2/pi; e + bits stays far below 1600)."""
    shift = e - 2 + bits - _TWO_OVER_PI_BITS
    v = _TWO_OVER_PI << shift if shift >= 0 else _TWO_OVER_PI >> -shift
    return v & ((1 << bits) - 1)


def _reduction_table(p: int, e0: int, width: int, buckets: int, words: int,
                     scale: int) -> dict:
    """The constants of sin/cos's large-argument reduction (:func:`_reduce_large`) for a
    format of ``p`` significant bits.

    Bucket b holds the arguments |x| = m 2^e with m in [2^(p-1), 2^p) and ``e`` in
    [eb, eb + width), eb = e0 + width b: threshold 2^(eb + p - 1). Its words W_0 + W_1 + ...
    are frac(2^eb / (2 pi)) (in turns) to ``p * words - 1`` bits: for such x, x' = |x| 2^-eb
    is an integer and x/(2 pi) = x' (2^eb/(2 pi)) = x' (W_0 + W_1 + ...) modulo 1. W_0 is a
    multiple of 2^-p, W_1 lies in [2^-p, 2^(1-p)) (so that x' W_1 >= 1/2 and its rounding is
    a multiple of 2^-p too), W_i (i >= 2) holds the next p bits. Each word is stored times
    2^(scale - eb) and the argument is multiplied by 2^-scale: one product for every bucket,
    and every stored word a normal float of the format.
    """
    thresholds, table = [], []
    n = p * words + 8
    unit = 1 << (n - p)
    for b in range(buckets):
        eb = e0 + width * b
        f = _turns(eb, n)  # frac(2^eb / (2 pi)) = f / 2^n
        rest = f % unit + unit  # in [2^-p, 2^(1-p))
        row = [f - rest]
        for i in range(1, words):
            grid = 1 << max(n - ((i + 1) * p - 1), 0)
            w = rest - rest % grid
            row.append(w)
            rest -= w
        thresholds.append(2.0 ** (eb + p - 1))
        table.append(tuple(math.ldexp(w, scale - eb - n) for w in row))
    return dict(thresholds=tuple(thresholds), words=tuple(table), scale=2.0 ** -scale)


F32 = Format("f32", 32, 23, 127, dict(
    # exp: clamp so that 2^k stays in the two-step scaling range (exp2: NaN becomes lo).
    exp_lo=-104.0, exp_hi=89.0, exp2_lo=-151.0, exp2_hi=129.0, expm1_lo=-20.0,
    round_magic=1.5 * 2.0 ** 23,  # x + magic rounds x to an integer, in the low bits
    # ln2_hi has trailing zeros: k*ln2_hi is exact for |k| < 512.
    ln2_hi=0.693145751953125, ln2_lo=1.4286068e-06, log2e=1.442695, log2e_lo=1.925963e-08,
    sqrt_half_bits=0x3F3504F3, min_normal=2.0 ** -126, tiny=2.0 ** -25,
    two_over_pi=0.63661975, pio2=(1.5707964, -4.371139e-08, -1.7151245e-15),
    # sin, cos for |x| >= 2^17: 8 buckets of 14 exponents, 4 words (_reduce_large)
    reduction=_reduction_table(24, -6, 14, 8, 4, 64),
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

F64 = Format("f64", 64, 52, 1023, dict(
    exp_lo=-746.0, exp_hi=710.0, exp2_lo=-1076.0, exp2_hi=1025.0, expm1_lo=-40.0,
    round_magic=1.5 * 2.0 ** 52,
    # k*ln2_hi is exact for |k| < 2048.
    ln2_hi=0.6931471803691238, ln2_lo=1.9082149292705877e-10,
    log2e=1.4426950408889634, log2e_lo=2.0355273740931033e-17,
    sqrt_half_bits=0x3FE6A09E667F3BCD, min_normal=2.0 ** -1022, tiny=2.0 ** -54,
    two_over_pi=0.6366197723675814,
    pio2=(1.5707963267948966, 6.123233995736766e-17, -1.4973849048591698e-33),
    # sin, cos for |x| >= 2^46: 11 buckets of 89 exponents, 5 words
    reduction=_reduction_table(53, -6, 89, 11, 5, 200),
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
    # f32 pow (_pow_magnitude_f32): log1p(f) = 2s + s z P(z), rel. error 2^-52.2;
    # 2^r = 1 + r Q(r), |r| <= 0.5: 2^-44.1 absolute in Q
    pow_log=(0.666666666665872, 0.40000000052275, 0.285714171295776, 0.22223371698514363,
             0.18123642077146776, 0.1681982774898998),
    pow_exp2=(0.6931471805599471, 0.24022650695812972, 0.05550410866454285,
              0.009618129159407534, 0.0013333558222558919, 0.00015403455848472718,
              1.5252658995761581e-05, 1.3255225788943639e-06, 1.0208691224474914e-07),
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



#: The formats by ISA dtype name.
FORMATS = {f.name: f for f in (F32, F64)}


class MathEmitter(ABC):
    """The primitives the algorithms are written with, for values of one float format.

    Floats follow IEEE 754 binary32/binary64 in the default environment: every operation
    is rounded once, to nearest with ties to even; subnormal inputs and results are kept
    (no flush to zero); an operation with a NaN operand gives a NaN (any payload) unless
    stated otherwise. Integers have the format's width (:attr:`Format.width`) and wrap in
    two's complement. Masks hold one boolean per element. A backend emits one instruction
    (or a short sequence) per call, in call order; the algorithms never branch on values
    (:meth:`rarely` lets a backend branch around a path that few elements need).

    :meth:`pow2i`, :meth:`scale` and :meth:`rarely` have default implementations composed
    of the other primitives; a backend with an instruction for them (or, for
    :meth:`rarely`, a cheaper way) may override them.
    """

    def __init__(self, fmt: Format):
        self.fmt = fmt

    @property
    def k(self) -> dict:
        """The format's constants and coefficients (:attr:`Format.k`)."""
        return self.fmt.k

    # -- formats
    @abstractmethod
    def for_format(self, fmt: Format) -> MathEmitter:
        """An emitter for ``fmt`` that writes to the same place (f32 pow works in f64)."""

    @abstractmethod
    def convert(self, a: Value, fmt: Format) -> Value:
        """Float ``a`` converted to ``fmt``: exact when widening, rounded to nearest even
        when narrowing (overflow gives inf)."""

    # -- constants
    @abstractmethod
    def c(self, value: float) -> Value:
        """The float constant ``value`` rounded to the format (inf and NaN allowed)."""

    @abstractmethod
    def ci(self, value: int) -> Value:
        """The integer constant ``value`` (in range for the width)."""

    # -- float arithmetic, each rounded once
    @abstractmethod
    def add(self, a: Value, b: Value) -> Value:
        """a + b."""

    @abstractmethod
    def sub(self, a: Value, b: Value) -> Value:
        """a - b."""

    @abstractmethod
    def mul(self, a: Value, b: Value) -> Value:
        """a * b."""

    @abstractmethod
    def div(self, a: Value, b: Value) -> Value:
        """a / b, correctly rounded."""

    @abstractmethod
    def fast_recip(self, a: Value) -> Value:
        """About 1/a, for ``a`` in [1, 2] or NaN (NaN gives NaN), to a relative error of
        about 2^-22 or less: a reciprocal estimate refined by a Newton step, or a true
        division. The caller (f32 sigmoid) corrects the quotient with an exact residual,
        which leaves 2^-20 ulp of the estimate's error; near a rounding boundary that can
        still decide the last bit, so the result's last bit may differ between devices."""

    @abstractmethod
    def neg(self, a: Value) -> Value:
        """-a: the sign flipped, exactly (also of 0 and NaN)."""

    @abstractmethod
    def fma(self, a: Value, b: Value, c: Value) -> Value:
        """a*b + c rounded once (a fused multiply-add: exact, never a multiply and an
        add; inf*0 + c is NaN)."""

    @abstractmethod
    def fabs(self, a: Value) -> Value:
        """|a|: the sign cleared, exactly."""

    @abstractmethod
    def copysign(self, a: Value, b: Value) -> Value:
        """|a| with the sign bit of b."""

    @abstractmethod
    def floor(self, a: Value) -> Value:
        """The largest integral float <= a (inf, NaN and -0.0 unchanged)."""

    @abstractmethod
    def rint(self, a: Value) -> Value:
        """a rounded to an integral float, ties to even (roundeven; the sign of a zero
        result is a's; inf and NaN unchanged)."""

    # -- comparisons of floats, giving masks
    @abstractmethod
    def lt(self, a: Value, b: Value) -> Value:
        """a < b; false if either is NaN."""

    @abstractmethod
    def ge(self, a: Value, b: Value) -> Value:
        """a >= b; false if either is NaN."""

    @abstractmethod
    def eq(self, a: Value, b: Value) -> Value:
        """a == b (-0.0 == 0.0); false if either is NaN."""

    @abstractmethod
    def ne(self, a: Value, b: Value) -> Value:
        """a != b and neither is NaN (LLVM's ``one``)."""

    @abstractmethod
    def ult(self, a: Value, b: Value) -> Value:
        """a < b, or either is NaN."""

    @abstractmethod
    def ule(self, a: Value, b: Value) -> Value:
        """a <= b, or either is NaN."""

    @abstractmethod
    def isnan(self, a: Value) -> Value:
        """a is NaN."""

    # -- masks and selects
    @abstractmethod
    def and_(self, a: Value, b: Value) -> Value:
        """Mask a and b."""

    @abstractmethod
    def or_(self, a: Value, b: Value) -> Value:
        """Mask a or b."""

    @abstractmethod
    def not_(self, a: Value) -> Value:
        """Mask not a."""

    @abstractmethod
    def sel(self, cond: Value, a: Value, b: Value) -> Value:
        """a where the mask cond is true, else b; a and b are both floats or both
        integers, and both are computed (no short circuit)."""

    # -- integers of the format's width
    @abstractmethod
    def iadd(self, a: Value, b: Value) -> Value:
        """a + b, wrapping."""

    @abstractmethod
    def isub(self, a: Value, b: Value) -> Value:
        """a - b, wrapping."""

    @abstractmethod
    def iand(self, a: Value, b: Value) -> Value:
        """Bitwise a & b."""

    def ior(self, a: Value, b: Value) -> Value:
        """Bitwise a | b. By default ``a + b - (a & b)`` (exact in wrapping arithmetic:
        the common bits are counted twice in the sum); emitters write their own."""
        return self.isub(self.iadd(a, b), self.iand(a, b))

    def ixor(self, a: Value, b: Value) -> Value:
        """Bitwise a ^ b. By default ``(a | b) - (a & b)``; emitters write their own."""
        return self.isub(self.ior(a, b), self.iand(a, b))

    @abstractmethod
    def shl(self, a: Value, b: Value) -> Value:
        """a << b, for 0 <= b < width."""

    @abstractmethod
    def ashr(self, a: Value, b: Value) -> Value:
        """a >> b with the sign bit shifted in (floor division by 2^b), 0 <= b < width."""

    @abstractmethod
    def ilt(self, a: Value, b: Value) -> Value:
        """Signed a < b, as a mask."""

    @abstractmethod
    def ine(self, a: Value, b: Value) -> Value:
        """a != b, as a mask."""

    # -- conversions
    @abstractmethod
    def to_int(self, a: Value) -> Value:
        """Float a to an integer, rounded toward zero. The algorithms pass only integral
        values in range; the result for inf, NaN or out of range values is unspecified
        (and then never used)."""

    @abstractmethod
    def to_float(self, n: Value) -> Value:
        """Signed integer n to the nearest float."""

    @abstractmethod
    def bits(self, a: Value) -> Value:
        """The bits of float a as an integer of the same width (a reinterpretation)."""

    @abstractmethod
    def from_bits(self, n: Value) -> Value:
        """The float whose bits are the integer n."""

    # -- a rarely taken path (default: both computed, then selected)
    def rarely(self, cond: Value, fast: tuple, slow: Callable[..., tuple], *args: Value
               ) -> tuple:
        """The values ``slow(self, *args)`` where the mask ``cond`` holds, else ``fast``,
        element by element (one tuple of values, each a float or an integer). ``slow`` is a
        module-level function of an emitter and ``args`` only; ``cond`` should rarely hold.

        By default every element computes both and selects. A backend may instead compute
        ``slow`` only for the groups of elements where ``cond`` holds for some of them
        (then ``slow``'s values for the others are never used)."""
        values = slow(self, *args)
        return tuple(self.sel(cond, s, f) for s, f in zip(values, fast, strict=True))

    # -- powers of two (defaults composed of the primitives above)
    def pow2i(self, n: Value) -> Value:
        """2^n for an integer n in the normal exponent range [1 - bias, bias], exactly:
        the bits ``(n + bias) << mant``."""
        f = self.fmt
        return self.from_bits(self.shl(self.iadd(n, self.ci(f.bias)), self.ci(f.mant)))

    def scale(self, p: Value, n: Value) -> Value:
        """p * 2^n rounded once (a subnormal result too; inf and 0 on overflow and
        underflow), for p in [0.5, 2) or NaN and an integer n in [2 - 2*bias, 2*bias]
        (exp's and exp2's clamps keep it there; n is unspecified when p is NaN).

        By default in two steps, each a multiplication by a power of two built from bits
        (:meth:`pow2i`): ``(p * 2^(n >> 1)) * 2^(n - (n >> 1))``; the first is exact, the
        second rounds. A device with an ldexp instruction may use it instead.
        """
        half = self.ashr(n, self.ci(1))
        return self.mul(self.mul(p, self.pow2i(half)), self.pow2i(self.isub(n, half)))


#: The ISA's comparisons as the infix operators of the C-like languages (WGSL, Triton, C).
COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


class InfixEmitter(MathEmitter):
    """The primitives of a language with C's infix operators (WGSL, Triton, C), each an
    expression bound to a fresh name through the subclass's :meth:`floating`,
    :meth:`integer` or :meth:`mask`.

    What the three languages spell alike is written here: float ``+ - *``, the ordered
    comparisons, the mask operators, the integer arithmetic and bit operations. What each
    spells its own way as one expression is the subclass's :attr:`SPELLING`; a primitive
    that takes more than one expression in a language is a method of its subclass."""

    #: The connectives of two masks (Triton's masks are tiles of int1: ``&`` and ``|``).
    AND = "&&"
    OR = "||"
    #: Primitive -> its expression in the language: a format string over the operands
    #: ``a``, ``b``, ``c`` and the emitter ``e`` (for its types). Every primitive of
    #: :data:`SPELLED` is spelled here or overridden.
    SPELLING: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        missing = [name for name in SPELLED if name not in cls.SPELLING
                   and getattr(cls, name) is getattr(InfixEmitter, name)]
        if missing:
            raise TypeError(f"{cls.__name__} neither spells nor overrides {missing}")

    def spell(self, name: str, *args) -> str:
        return self.SPELLING[name].format(**dict(zip("abc", args)), e=self)

    @abstractmethod
    def floating(self, expression: str) -> Value:
        """A fresh name bound to the float ``expression``."""

    @abstractmethod
    def integer(self, expression: str) -> Value:
        """A fresh name bound to the integer ``expression``."""

    @abstractmethod
    def mask(self, expression: str) -> Value:
        """A fresh name bound to the mask ``expression``."""

    def add(self, a, b):
        return self.floating(f"{a} + {b}")

    def sub(self, a, b):
        return self.floating(f"{a} - {b}")

    def mul(self, a, b):
        return self.floating(f"{a} * {b}")

    def lt(self, a, b):
        return self.mask(f"{a} < {b}")

    def ge(self, a, b):
        return self.mask(f"{a} >= {b}")

    def eq(self, a, b):
        return self.mask(f"{a} == {b}")

    def ult(self, a, b):
        return self.mask(f"!({a} >= {b})")

    def ule(self, a, b):
        return self.mask(f"!({a} > {b})")

    def and_(self, a, b):
        return self.mask(f"{a} {self.AND} {b}")

    def or_(self, a, b):
        return self.mask(f"{a} {self.OR} {b}")

    def not_(self, a):
        return self.mask(f"!{a}")

    def iadd(self, a, b):
        return self.integer(f"{a} + {b}")

    def isub(self, a, b):
        return self.integer(f"{a} - {b}")

    def iand(self, a, b):
        return self.integer(f"{a} & {b}")

    def ior(self, a, b):
        return self.integer(f"{a} | {b}")

    def ixor(self, a, b):
        return self.integer(f"{a} ^ {b}")

    def ilt(self, a, b):
        return self.mask(f"{a} < {b}")

    def ine(self, a, b):
        return self.mask(f"{a} != {b}")

    def fast_recip(self, a):
        return self.div(self.c(1.0), a)


def _spelled(name: str, kind: str):
    def primitive(self, *args):
        return getattr(self, kind)(self.spell(name, *args))
    primitive.__name__ = primitive.__qualname__ = name
    primitive.__doc__ = f"{name}, as the language's :attr:`~InfixEmitter.SPELLING` says."
    return primitive


#: The primitives an :class:`InfixEmitter` takes from its :attr:`~InfixEmitter.SPELLING`,
#: by the kind of their result.
SPELLED = {"div": "floating", "neg": "floating", "fma": "floating", "fabs": "floating",
           "copysign": "floating", "floor": "floating", "rint": "floating",
           "to_float": "floating", "from_bits": "floating", "shl": "integer",
           "ashr": "integer", "to_int": "integer", "bits": "integer", "ne": "mask",
           "isnan": "mask"}
for _name, _kind in SPELLED.items():
    setattr(InfixEmitter, _name, _spelled(_name, _kind))


# ---------------------------------------------------------------- derived helpers
def horner(e: MathEmitter, x: Value, coeffs: Sequence[float]) -> Value:
    """c0 + x*(c1 + x*(c2 + ...)), one fma per step."""
    acc = e.c(coeffs[-1])
    for coeff in reversed(coeffs[:-1]):
        acc = e.fma(acc, x, e.c(coeff))
    return acc


def clamp_keep_nan(e: MathEmitter, x: Value, lo: float, hi: float | None = None) -> Value:
    """x limited to [lo, hi], NaN stays NaN (x86: ``maxps(lo, x)``, ``minps(hi, x)``)."""
    x = e.sel(e.lt(x, e.c(lo)), e.c(lo), x)
    if hi is not None:
        x = e.sel(e.lt(e.c(hi), x), e.c(hi), x)
    return x


def clamp(e: MathEmitter, x: Value, lo: float, hi: float) -> Value:
    """x limited to [lo, hi]; NaN becomes lo (callers patch NaN in afterwards)."""
    x = e.sel(e.lt(e.c(lo), x), x, e.c(lo))
    return e.sel(e.lt(x, e.c(hi)), x, e.c(hi))


def round_mul(e: MathEmitter, x: Value, c: float) -> tuple[Value, Value]:
    """rint(x*c) as a float and as an integer, for |x*c| < 2^(mant-1).

    Adding 1.5*2^mant rounds to an integer (the fma rounds x*c once) and leaves it in the
    low bits: the integer is those bits minus the constant's.
    """
    magic = e.c(e.k["round_magic"])
    kf = e.fma(x, e.c(c), magic)
    n = e.isub(e.bits(kf), e.bits(magic))
    # to_float(n), not kf - magic: on x86 ldexp's lowering converts n too, the two share
    # one vcvtdq2ps
    return e.to_float(n), n


def fast_two_sum(e: MathEmitter, a: Value, b: Value) -> tuple[Value, Value]:
    """s + t == a + b exactly, s = a + b rounded, provided |a| >= |b| or a is a multiple of
    ulp(b) (then s - a is within an ulp of b, and b minus it on b's grid)."""
    s = e.add(a, b)
    return s, e.sub(b, e.sub(s, a))


def two_sum(e: MathEmitter, a: Value, b: Value) -> tuple[Value, Value]:
    """s + t == a + b exactly, s = a + b rounded (Knuth's TwoSum: no ordering needed)."""
    s = e.add(a, b)
    bb = e.sub(s, a)
    return s, e.add(e.sub(a, e.sub(s, bb)), e.sub(b, bb))


# ---------------------------------------------------------------- exp family
def _exp_core(e: MathEmitter, x: Value, lo: Value | None = None) -> Value:
    """e^(x + lo) for finite x in [exp_lo, exp_hi] (lo: a small correction term)."""
    kf, n = round_mul(e, x, e.k["log2e"])
    r = e.fma(e.neg(kf), e.c(e.k["ln2_hi"]), x)  # exact: ln2_hi has trailing zeros
    r = e.fma(e.neg(kf), e.c(e.k["ln2_lo"]), r)
    if lo is not None:
        r = e.add(r, lo)
    one = e.c(1.0)
    p = e.fma(r, e.fma(r, horner(e, r, e.k["exp"]), one), one)  # 1 + r(1 + r P(r))
    return e.scale(p, n)


def _exp(e: MathEmitter, x: Value) -> Value:
    """e^x; a NaN x runs through as NaN."""
    return _exp_core(e, clamp_keep_nan(e, x, e.k["exp_lo"], e.k["exp_hi"]))


def _exp2(e: MathEmitter, x: Value, lo: Value | None = None) -> Value:
    """2^(x + lo); lo (optional) is the low part of a double-word argument."""
    xc = clamp(e, x, e.k["exp2_lo"], e.k["exp2_hi"])
    kf = e.rint(xc)
    r = e.sub(xc, kf)  # exact
    if lo is not None:  # a clamped argument is past over/underflow: its low part is noise
        r = e.add(r, e.sel(e.eq(xc, x), lo, e.c(0.0)))
    p = e.fma(r, horner(e, r, e.k["exp2"]), e.c(1.0))
    return e.sel(e.isnan(x), x, e.scale(p, e.to_int(kf)))


def _expm1_core(e: MathEmitter, x: Value) -> Value:
    """e^x - 1 for finite x in [expm1_lo, exp_hi] and |x| >= tiny."""
    kf = e.rint(e.mul(x, e.c(e.k["log2e"])))
    r = e.fma(e.neg(kf), e.c(e.k["ln2_hi"]), x)
    r = e.fma(e.neg(kf), e.c(e.k["ln2_lo"]), r)
    t = e.mul(e.mul(r, r), horner(e, r, e.k["expm1"]))
    hi = e.add(r, t)  # expm1(r) = r + r^2 P(r) = hi + lo
    lo = e.add(e.sub(r, hi), t)
    # e^x - 1 = 2^k (1 + hi + lo) - 1 = 2 (s hi + (s - 1/2) + s lo) with s = 2^(k-1):
    # s - 1/2 is exact wherever it matters, s hi + (s - 1/2) is exact when they cancel
    # (k = 1), and halving keeps 2^k in range up to k = 128 (1024).
    s = e.pow2i(e.isub(e.to_int(kf), e.ci(1)))
    return e.mul(e.c(2.0), e.fma(s, lo, e.fma(s, hi, e.sub(s, e.c(0.5)))))


def _expm1(e: MathEmitter, x: Value) -> Value:
    y = _expm1_core(e, clamp(e, x, e.k["expm1_lo"], e.k["exp_hi"]))
    y = e.sel(e.lt(e.fabs(x), e.c(e.k["tiny"])), x, y)  # x + x^2/2 rounds to x; keeps -0.0
    return e.sel(e.isnan(x), x, y)


# ---------------------------------------------------------------- log family
def _log_parts(e: MathEmitter, x: Value) -> tuple[Value, ...]:
    """x > 0 finite as 2^k (1 + f): returns k (float), f, f^2/2, s = f/(2+f), R.

    log(1 + f) = f - f^2/2 + s (f^2/2 + R), |s| <= 0.1716.
    """
    mant, ci = e.fmt.mant, e.ci
    sub = e.lt(x, e.c(e.k["min_normal"]))
    xs = e.sel(sub, e.mul(x, e.c(2.0 ** mant)), x)  # denormals: normalize first
    ix = e.isub(e.bits(xs), ci(e.k["sqrt_half_bits"]))
    k = e.iadd(e.ashr(ix, ci(mant)), e.sel(sub, ci(-mant), ci(0)))
    mbits = e.iadd(e.iand(ix, ci((1 << mant) - 1)), ci(e.k["sqrt_half_bits"]))
    f = e.sub(e.from_bits(mbits), e.c(1.0))  # exact, m in [sqrt(1/2), sqrt(2))
    s = e.div(f, e.add(e.c(2.0), f))
    z = e.mul(s, s)
    r = e.mul(z, horner(e, z, e.k["log"]))
    hfsq = e.mul(e.c(0.5), e.mul(f, f))
    return e.to_float(k), f, hfsq, s, r


def _log_specials(e: MathEmitter, x: Value, y: Value, zero_at: float = 0.0) -> Value:
    """Patch log-like results: pole at ``zero_at`` (-inf), NaN below it, log(inf) = inf."""
    y = e.sel(e.eq(x, e.c(math.inf)), x, y)
    y = e.sel(e.eq(x, e.c(zero_at)), e.c(-math.inf), y)
    y = e.sel(e.lt(x, e.c(zero_at)), e.c(math.nan), y)
    return e.sel(e.isnan(x), x, y)


def _log_from(e: MathEmitter, kf, f, hfsq, s, r, corr: Value | None = None) -> Value:
    """k ln2 + log(1 + f) (+ corr), fdlibm's ordering of the sums."""
    lo = e.mul(kf, e.c(e.k["ln2_lo"]))
    if corr is not None:
        lo = e.add(lo, corr)
    t = e.fma(s, e.add(hfsq, r), lo)
    return e.sub(e.mul(kf, e.c(e.k["ln2_hi"])), e.sub(e.sub(hfsq, t), f))


def _log(e: MathEmitter, x: Value) -> Value:
    return _log_specials(e, x, _log_from(e, *_log_parts(e, x)))


def _log2(e: MathEmitter, x: Value) -> Value:
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


def _log1p(e: MathEmitter, x: Value) -> Value:
    one = e.c(1.0)
    u = e.add(one, x)
    # c = (1 + x) - u exactly (Fast2Sum, bigger operand first); log1p(x) = log(u) + c/u.
    big = e.lt(one, e.fabs(x))
    c = e.sel(big, e.sub(one, e.sub(u, x)), e.sub(x, e.sub(u, one)))
    y = _log_from(e, *_log_parts(e, u), corr=e.div(c, u))
    y = e.sel(e.lt(e.fabs(x), e.c(e.k["tiny"])), x, y)
    return _log_specials(e, x, y, zero_at=-1.0)


# ---------------------------------------------------------------- tanh, sigmoid, erf
def _odd_rational(e: MathEmitter, x: Value, name: str) -> Value:
    """x P(x^2)/Q(x^2) for |x| < <name>_max, copysign(1, x) beyond, NaN for NaN (f32).

    The two polynomials run side by side and the dependency chain is short: in the
    vectorized loop that chain, not the instruction count, is what costs. The price is
    accuracy: the f32 Horner steps of P and Q round up to ~2.5 ulp each at the top of the
    range, so the result is within 6-7 ulp (docs/mathlib.md). Where P(0) = 1, x * 1 / 1
    returns denormals and -0.0 unchanged.
    """
    z = e.mul(x, x)  # inf for huge x: the quotient is NaN there and replaced below
    q = e.div(e.mul(x, horner(e, z, e.k[name + "_p"])), horner(e, z, e.k[name + "_q"]))
    inner = e.ult(e.fabs(x), e.c(e.k[name + "_max"]))  # true for NaN
    # Near the top of the range the rounded quotient can exceed 1 by an ulp, where the
    # function itself is just below: 1 is then the better answer, and keeps |f| <= 1.
    bounded = e.ule(e.fabs(q), e.c(1.0))
    return e.sel(e.and_(inner, bounded), q, e.copysign(e.c(1.0), x))


def _tanh(e: MathEmitter, x: Value) -> Value:
    if "tanh_p" in e.k:  # f32: a rational minimax approximation
        return _odd_rational(e, x, "tanh")
    a = e.fabs(x)
    em = _expm1_core(e, e.mul(e.c(2.0), clamp(e, a, e.k["tiny"], 20.0)))  # tanh(20) == 1
    y = e.copysign(e.div(em, e.add(em, e.c(2.0))), x)
    y = e.sel(e.lt(a, e.c(e.k["tiny"])), x, y)
    return e.sel(e.isnan(x), x, y)


def _sigmoid(e: MathEmitter, x: Value) -> Value:
    a = e.neg(e.fabs(x))
    # exp(a) for a <= 0: below exp_lo (also -inf) the reduction is garbage or NaN and t is
    # 0 instead (a select, not a clamp: on x86 it keeps the busy FP port free); NaN stays
    t = e.sel(e.lt(a, e.c(e.k["exp_lo"])), e.c(0.0), _exp_core(e, a))
    num = e.sel(e.ge(x, e.c(0.0)), e.c(1.0), t)
    den = e.add(e.c(1.0), t)
    if e.fmt.name == "f32":
        # A division is slow (x86: vdivps). 1/den as an estimate good to ~2^-23 (den is in
        # [1, 2] or NaN, never inf), then one correction with the exact residual makes
        # num/den accurate to 0.5 ulp + 2^-20 ulp whatever the estimate's precision.
        rinv = e.fast_recip(den)
        q = e.mul(num, rinv)
        return e.fma(e.fma(e.neg(den), q, num), rinv, q)
    return e.div(num, den)


def _erf(e: MathEmitter, x: Value) -> Value:
    if "erf_p" in e.k:  # f32: a rational minimax approximation
        return _odd_rational(e, x, "erf")
    a = e.fabs(x)
    small = e.fma(x, horner(e, e.mul(x, x), e.k["erf_small"]), x)  # x + x P: P rounds small
    # erfc(a) = exp(H(a) - a^2); a^2 is carried as a double word (hi + lo) because an
    # error in the exponent is a relative error in erfc.
    ac = clamp(e, a, 1.0, e.k["erf_max"])
    h = horner(e, e.sub(ac, e.c(e.k["erf_mid"])), e.k["erf_tail"])
    sq = e.mul(ac, ac)
    sq_lo = e.fma(ac, ac, e.neg(sq))
    erfc = _exp_core(e, e.sub(h, sq), lo=e.neg(sq_lo))
    big = e.copysign(e.sub(e.c(1.0), erfc), x)
    y = e.sel(e.lt(a, e.c(1.0)), small, big)
    return e.sel(e.isnan(x), x, y)


# ---------------------------------------------------------------- sin, cos
def _reduce_large(e: MathEmitter, x: Value, ax: Value) -> tuple[Value, Value]:
    """x = j pi/2 + r modulo 2 pi for |x| >= the table's first threshold (Payne-Hanek):
    returns r (|r| <= pi/4 + tiny, within an ulp of the exact value) and j, an integral
    float (|j| <= 6; j mod 4 is the quadrant). Straight-line: garbage for smaller |x| (the
    caller selects), NaN for inf and NaN.

    With x' = |x| 2^-eb an integer (the bucket's, :func:`_reduction_table`), x/(2 pi) is
    x' (W_0 + W_1 + ...) modulo 1, and every product V_i = x' W_i is split exactly (an fma
    gives the error of each rounded product). Working in turns, the integer part of each
    piece is dropped with ``v - rint(v)``, which is exact:

    - V_0 mod 1 with the rounded product's integer k0: ``fma(x', W_0, -k0)`` is exact (the
      product's error when k0 is the rounded product, at most 1 otherwise, on the 2^-p
      grid), then its own integer part;
    - V_1 = p1 + e1: p1 >= 1/2 (W_1 >= 2^-p) lies on the 2^-p grid, so V_0 + p1 mod 1 is
      one exact float h (a multiple of 2^-p);
    - the rest is small: f32 (x' < 2^37): e1 + p2 as an exact double word (TwoSum),
      e2 + p3 below 2^-33 rounded; f64 (x' < 2^141, pieces up to 1/2 after their integer
      part): the same with one more level.

    In quadrants (times 4, exact) j = rint(4 (h + s)) and 4h - j is exact; the fine part is
    added to it with one rounding each, which are exact where the sum cancels (Sterbenz)
    and relative to the result elsewhere, so r keeps its relative accuracy next to the
    zeros of sin and cos (where x mod pi/2 is at least 2^-29.9 (f32) / 2^-61 (f64)).
    """
    t = e.k["reduction"]
    masks = [e.ge(ax, e.c(v)) for v in t["thresholds"][1:]]
    u = []
    for i in range(len(t["words"][0])):  # the bucket's words, selected
        w = e.c(t["words"][0][i])
        for m, row in zip(masks, t["words"][1:]):
            w = e.sel(m, e.c(row[i]), w)
        u.append(w)
    xs = e.mul(x, e.c(t["scale"]))  # signed: every step below is odd in x
    nx = e.neg(xs)
    p0 = e.mul(xs, u[0])
    u0 = e.fma(nx, u[0], e.rint(p0))  # k0 - V0, exact
    a0 = e.sub(e.rint(u0), u0)  # V0 mod 1
    p1 = e.mul(xs, u[1])
    e1 = e.fma(nx, u[1], p1)  # p1 - V1, exact
    h = e.add(a0, e.sub(p1, e.rint(p1)))  # exact: both on the 2^-p grid, |h| <= 1
    p2 = e.mul(xs, u[2])
    e2 = e.fma(nx, u[2], p2)
    p3 = e.mul(xs, u[3])
    four = e.c(4.0)
    h4 = e.mul(h, four)
    if e.fmt.name == "f32":
        s, lo = two_sum(e, p2, e.neg(e1))  # V1 - p1 + p2, |s| < 2^-9
        lo = e.add(e.sub(lo, e2), p3)  # |lo| < 2^-32
        s4 = e.mul(s, four)
        j = e.rint(e.add(h4, s4))
        f, lo4 = fast_two_sum(e, e.sub(h4, j), s4)
        lo4 = e.fma(lo, four, lo4)
    else:
        d1 = e.sub(e.rint(e1), e1)  # (V1 - p1) mod 1
        e3 = e.fma(nx, u[3], p3)
        p4 = e.mul(xs, u[4])
        s1, t1 = two_sum(e, e.sub(p2, e.rint(p2)), d1)
        s1 = e.sub(s1, e.rint(s1))  # (V1 - p1 + p2) mod 1
        s2, t2 = two_sum(e, p3, e.neg(e2))  # |s2| < 2^-15
        s2, t3 = two_sum(e, s2, t1)
        lo = e.add(e.sub(e.add(t2, t3), e3), p4)  # |lo| < 2^-66
        s14, s24 = e.mul(s1, four), e.mul(s2, four)
        j = e.rint(e.add(e.add(h4, s14), s24))
        f, t4 = fast_two_sum(e, e.sub(h4, j), s14)
        f, t5 = two_sum(e, f, s24)
        lo4 = e.fma(lo, four, e.add(t4, t5))
    pio2 = e.k["pio2"]  # r = (f + lo4) pi/2, one rounding of the double-word product
    r = e.fma(f, e.c(pio2[0]), e.fma(lo4, e.c(pio2[0]), e.mul(f, e.c(pio2[1]))))
    return r, j


def _reduce_large_quadrant(e: MathEmitter, x: Value, ax: Value) -> tuple[Value, Value]:
    """:func:`_reduce_large` with j as an integer (0 for inf and NaN: no conversion of
    them)."""
    r, j = _reduce_large(e, x, ax)
    return r, e.to_int(e.sel(e.lt(ax, e.c(math.inf)), j, e.c(0.0)))


def _sincos(e: MathEmitter, x: Value, cos: bool) -> Value:
    ax = e.fabs(x)
    # |x| < 2^17 (f32) / 2^46 (f64): x - j pi/2 with j = rint(x 2/pi) (its integer in the
    # low bits) and pi/2 in three parts: the first fma is exact, the others round relative
    # to r itself.
    jf, n = round_mul(e, x, e.k["two_over_pi"])
    r = x
    for part in e.k["pio2"]:
        r = e.fma(jf, e.c(-part), r)
    # Larger |x| (and inf): Payne-Hanek.
    big = e.ge(ax, e.c(e.k["reduction"]["thresholds"][0]))
    r, q = e.rarely(big, (r, n), _reduce_large_quadrant, x, ax)
    finite = e.lt(ax, e.c(math.inf))
    z = e.mul(r, r)
    sin_r = e.fma(e.mul(r, z), horner(e, z, e.k["sin"]), r)
    cos_r = e.fma(z, e.fma(z, horner(e, z, e.k["cos"]), e.c(-0.5)), e.c(1.0))
    if cos:
        q = e.iadd(q, e.ci(1))
    swap = e.ine(e.iand(q, e.ci(1)), e.ci(0))
    negate = e.ine(e.iand(q, e.ci(2)), e.ci(0))
    y = e.sel(swap, cos_r, sin_r)
    y = e.sel(negate, e.neg(y), y)
    if not cos:
        y = e.sel(e.eq(x, e.c(0.0)), x, y)  # sin(-0.0) = -0.0
    return e.sel(finite, y, e.sub(x, x))  # inf - inf and NaN - NaN are NaN


def _sin(e: MathEmitter, x: Value) -> Value:
    return _sincos(e, x, cos=False)


def _cos(e: MathEmitter, x: Value) -> Value:
    return _sincos(e, x, cos=True)


# ---------------------------------------------------------------- pow
def _log2_dd(e: MathEmitter, ax: Value) -> tuple[Value, Value]:
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
    rest = e.mul(e.mul(s3, z), horner(e, z, e.k["log"][1:]))
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


def _pow_magnitude_f64(e: MathEmitter, x: Value, y: Value) -> Value:
    """|x|^y in double-word precision, with the IEEE results for |x| in {0, inf, NaN}."""
    ax = e.fabs(x)
    gh, gl = _log2_dd(e, ax)
    regular = e.and_(e.lt(e.c(0.0), ax), e.lt(ax, e.c(math.inf)))
    gh = e.sel(regular, gh, e.sel(e.eq(ax, e.c(0.0)), e.c(-math.inf), ax))  # inf, NaN: ax
    gl = e.sel(regular, gl, e.c(0.0))
    th = e.mul(y, gh)
    tl = e.fma(y, gl, e.fma(y, gh, e.neg(th)))
    tl = e.sel(e.lt(e.fabs(th), e.c(math.inf)), tl, e.c(0.0))
    return _exp2(e, th, lo=tl)


def _pow_magnitude_f32(e: MathEmitter, x: Value, y: Value) -> Value:
    """|x|^y for f32 x and y, in f64 (``e`` an f64 emitter, x and y widened to f64), with
    the IEEE results for |x| in {0, inf, NaN}: exp2(y log2|x|) with both errors near
    2^-45, which the rounding to f32 hides (about one result in a million is off by one
    ulp). Cheaper than the f64 functions it replaces, since the f32 range needs less:
    an f32 subnormal is a normal f64 (no scaling first), log2|x| needs no double word
    (|y log2|x|| < 160 where the result is not 0 or inf), and 2^k for the f32 range is
    one f64 power of two (an f32 subnormal result is rounded once, by the conversion)."""
    ax = e.fabs(x)
    ix = e.isub(e.bits(ax), e.ci(e.k["sqrt_half_bits"]))
    k = e.to_float(e.ashr(ix, e.ci(52)))
    m = e.from_bits(e.iadd(e.iand(ix, e.ci((1 << 52) - 1)), e.ci(e.k["sqrt_half_bits"])))
    f = e.sub(m, e.c(1.0))  # exact, m in [sqrt(1/2), sqrt(2))
    s = e.div(f, e.add(e.c(2.0), f))
    z = e.mul(s, s)
    log1p = e.fma(s, e.mul(z, horner(e, z, e.k["pow_log"])), e.add(s, s))  # 2s + s z P(z)
    lg = e.fma(log1p, e.c(e.k["log2e"]), k)
    regular = e.and_(e.lt(e.c(0.0), ax), e.lt(ax, e.c(math.inf)))
    lg = e.sel(regular, lg, e.sel(e.eq(ax, e.c(0.0)), e.c(-math.inf), ax))  # inf, NaN: ax
    t = e.mul(y, lg)
    tc = clamp(e, t, -160.0, 160.0)  # past f32's range on either side
    kf = e.rint(tc)
    r = e.sub(tc, kf)  # exact
    p = e.fma(r, horner(e, r, e.k["pow_exp2"]), e.c(1.0))
    return e.sel(e.isnan(t), t, e.mul(p, e.pow2i(e.to_int(kf))))


def _pow(e: MathEmitter, x: Value, y: Value) -> Value:
    if e.fmt.name == "f32":
        e64 = e.for_format(F64)
        xd, yd = e.convert(x, F64), e.convert(y, F64)
        mag = e64.convert(_pow_magnitude_f32(e64, xd, yd), e.fmt)
    else:
        mag = _pow_magnitude_f64(e, x, y)
    # C99 F.9.4.4 on top of exp2(y log2|x|), which already gives the 0/inf cases.
    one = e.c(1.0)
    y_int = e.eq(e.floor(y), y)  # infinities count as even integers
    half = e.mul(y, e.c(0.5))
    y_odd = e.and_(y_int, e.ne(e.floor(half), half))
    x_sign = e.ilt(e.bits(x), e.ci(0))
    res = e.sel(e.and_(x_sign, y_odd), e.neg(mag), mag)
    finite_neg = e.and_(e.lt(x, e.c(0.0)), e.lt(e.c(-math.inf), x))
    res = e.sel(e.and_(finite_neg, e.not_(y_int)), e.c(math.nan), res)
    unit_inf = e.and_(e.eq(e.fabs(x), one), e.eq(e.fabs(y), e.c(math.inf)))
    res = e.sel(e.or_(unit_inf, e.eq(x, one)), one, res)
    return e.sel(e.eq(y, e.c(0.0)), one, res)


_ALGORITHMS: dict[str, Callable[..., Value]] = {
    "exp": _exp, "exp2": _exp2, "expm1": _expm1, "log": _log, "log2": _log2,
    "log1p": _log1p, "tanh": _tanh, "sigmoid": _sigmoid, "erf": _erf, "sin": _sin,
    "cos": _cos, "pow": _pow,
}


def arity(name: str) -> int:
    """How many arguments function ``name`` takes (pow: 2, the others 1)."""
    check(name)
    return 2 if name == "pow" else 1


def check(name: str) -> None:
    """Raise ValueError unless ``name`` is one of :data:`FUNCTIONS`."""
    if name not in _ALGORITHMS:
        raise ValueError(f"mathlib has no function {name!r} (known: {', '.join(FUNCTIONS)})")


def emit(e: MathEmitter, name: str, *args: Value) -> Value:
    """Function ``name`` of ``args`` (values of ``e``'s format), written with ``e``'s
    primitives; returns the result value."""
    if len(args) != arity(name):
        raise TypeError(f"mathlib {name} takes {arity(name)} argument(s), not {len(args)}")
    return _ALGORITHMS[name](e, *args)
