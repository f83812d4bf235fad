"""The device-neutral math library (hologram.codegen.mathlib) on a second device: NumPy.

:class:`NumpyEmitter` implements the :class:`~hologram.codegen.mathlib.MathEmitter`
primitives with NumPy array operations (each call evaluates at once, element by element),
so :func:`~hologram.codegen.mathlib.emit` computes every function directly. Its results
are compared with the LLVM-compiled functions of the cpu backend (tests/test_mathlib.py's
``run``: ``hg.<name>`` in a loop compiled with the O3 pipeline): both run the same
algorithm from the same module, so they agree bit for bit (any two NaNs count as equal),
f32 sigmoid excepted (within 1 ulp: below).

NumPy has no fused multiply-add, so :func:`fma` computes one exactly:

- f32: ``a*b`` is exact in float64 (48 bits); ``a*b + c`` in float64 is then rounded to
  odd (TwoSum gives the rounding error; where it is nonzero and the sum's last bit is 0,
  step to the neighbour on the error's side) and rounded to float32: rounding to odd with
  at least two more bits, then to nearest, is one correct rounding. (Plain ``a*b + c`` in
  float64 then float32 would round twice, and differ from a true fma now and then.)
- f64: Boldo and Melquiond's emulation: Dekker's exact product ``ph + pl`` (Veltkamp
  splitting), ``th + tl = c + ph`` (TwoSum), ``v = RO(tl + pl)`` rounded to odd,
  ``RN(th + v)``. It assumes no overflow or underflow in the steps, so elements with
  operands or a product outside [2^-900, 2^990] in magnitude are computed with ``Fraction``
  instead (correctly rounded by CPython's int division), and a zero, inf or NaN operand by
  ``a*b + c`` itself (the product is exact then).

:func:`test_fma_emulation_is_exact` checks both against ``Fraction`` arithmetic.

The one primitive whose result is not fully specified is ``fast_recip`` (f32 sigmoid's
1/(1+t)): here it is a true division, where LLVM's is a reciprocal estimate and a Newton
step. The residual correction after it leaves 2^-20 ulp of that difference, which can
still decide the last bit near a rounding boundary: f32 sigmoid agrees within 1 ulp.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import ClassVar

import numpy as np
import pytest
from test_mathlib import SINCOS_HUGE, _hard_sincos_arguments, _pow_samples, run

from hologram.codegen import mathlib
from hologram.codegen.mathlib import FORMATS, FUNCTIONS, Format, MathEmitter

NP = {"f32": (np.float32, np.int32, np.uint32), "f64": (np.float64, np.int64, np.uint64)}


# ------------------------------------------------------------------ exact fma in NumPy
def _two_sum(a, b):
    """s + t == a + b exactly (no overflow), s = RN(a + b)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _split(a):
    """Veltkamp: a == hi + lo, each with at most 26 significant bits (|a| < 2^995)."""
    c = a * 134217729.0  # 2^27 + 1
    hi = c - (c - a)
    return hi, a - hi


def _two_prod(a, b):
    """p + e == a * b exactly (Dekker), p = RN(a * b), barring over/underflow."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _round_odd(s, err, uint):
    """s = RN(x) with x - s == err turned into x rounded to odd."""
    step = (err != 0) & np.isfinite(err) & ((s.view(uint) & 1) == 0)
    return np.where(step, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)


def _fma_scalar(a: float, b: float, c: float) -> float:
    """fma(a, b, c) of Python floats (binary64), exactly, by rational arithmetic."""
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)) or a == 0 or b == 0:
        return a * b + c  # the product is exact (0, inf or NaN)
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        return a * b + c  # an exact cancellation: +0, as the rounded sum gives it
    sign = -1.0 if exact < 0 else 1.0
    try:
        return math.copysign(float(exact), sign)  # correctly rounded; -0 from -tiny
    except OverflowError:
        return sign * math.inf


def fma(a, b, c, fmt: str):
    """a*b + c rounded once to ``fmt`` ("f32" or "f64"), elementwise."""
    a, b, c = np.broadcast_arrays(*(np.asarray(v, NP[fmt][0]) for v in (a, b, c)))
    with np.errstate(all="ignore"):
        if fmt == "f32":
            s, t = _two_sum(a.astype(np.float64) * b.astype(np.float64), c.astype(np.float64))
            return _round_odd(s, t, np.uint64).astype(np.float32)
        ph, pl = _two_prod(a, b)
        th, tl = _two_sum(c, ph)
        v, ve = _two_sum(tl, pl)
        out = th + _round_odd(v, ve, np.uint64)

        def inside(x):
            return (np.abs(x) >= 2.0 ** -900) & (np.abs(x) <= 2.0 ** 990)

        safe = inside(a) & inside(b) & inside(c) & inside(a * b)
    for i in np.flatnonzero(~safe):
        out.flat[i] = _fma_scalar(float(a.flat[i]), float(b.flat[i]), float(c.flat[i]))
    return out


# ------------------------------------------------------------------ the NumPy emitter
class NumpyEmitter(MathEmitter):
    """The primitives as NumPy operations on arrays (float, int of the same width, bool);
    :meth:`pow2i` and :meth:`scale` are the interface's defaults."""

    def __init__(self, fmt: Format):
        super().__init__(fmt)
        self.ft, self.it, self.ut = NP[fmt.name]

    def _f(self, x):
        x = np.asarray(x)
        assert x.dtype == self.ft, (x.dtype, self.fmt.name)
        return x

    def _i(self, x):
        x = np.asarray(x)
        assert x.dtype == self.it, (x.dtype, self.fmt.name)
        return x

    def for_format(self, fmt):
        return NumpyEmitter(fmt)

    def convert(self, a, fmt):
        return self._f(a).astype(NP[fmt.name][0])

    def c(self, value):
        return np.asarray(value, self.ft)

    def ci(self, value):
        return np.asarray(value, self.it)

    def add(self, a, b):
        return self._f(self._f(a) + self._f(b))

    def sub(self, a, b):
        return self._f(self._f(a) - self._f(b))

    def mul(self, a, b):
        return self._f(self._f(a) * self._f(b))

    def div(self, a, b):
        return self._f(self._f(a) / self._f(b))

    def fast_recip(self, a):
        return self.div(self.c(1.0), a)

    def neg(self, a):
        return self._f(-self._f(a))

    def fma(self, a, b, c):
        return self._f(fma(self._f(a), self._f(b), self._f(c), self.fmt.name))

    def fabs(self, a):
        return np.abs(self._f(a))

    def copysign(self, a, b):
        return np.copysign(self._f(a), self._f(b))

    def floor(self, a):
        return np.floor(self._f(a))

    def rint(self, a):
        return np.rint(self._f(a))  # ties to even

    def lt(self, a, b):
        return self._f(a) < self._f(b)

    def ge(self, a, b):
        return self._f(a) >= self._f(b)

    def eq(self, a, b):
        return self._f(a) == self._f(b)

    def ne(self, a, b):
        return (a != b) & ~np.isnan(self._f(a)) & ~np.isnan(self._f(b))

    def ult(self, a, b):
        return ~(self._f(a) >= self._f(b))

    def ule(self, a, b):
        return ~(self._f(a) > self._f(b))

    def isnan(self, a):
        return np.isnan(self._f(a))

    def and_(self, a, b):
        return np.logical_and(a, b)

    def or_(self, a, b):
        return np.logical_or(a, b)

    def not_(self, a):
        return np.logical_not(a)

    def sel(self, cond, a, b):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.dtype in (self.ft, self.it), (a.dtype, b.dtype)
        return np.where(cond, a, b)

    def iadd(self, a, b):
        return self._i(self._i(a) + self._i(b))

    def isub(self, a, b):
        return self._i(self._i(a) - self._i(b))

    def iand(self, a, b):
        return self._i(self._i(a) & self._i(b))

    def shl(self, a, b):
        return self._i(np.left_shift(self._i(a), self._i(b)))

    def ashr(self, a, b):
        return self._i(np.right_shift(self._i(a), self._i(b)))  # arithmetic for signed

    def ilt(self, a, b):
        return self._i(a) < self._i(b)

    def ine(self, a, b):
        return self._i(a) != self._i(b)

    def to_int(self, a):
        return np.trunc(self._f(a)).astype(self.it)  # garbage for inf/NaN, never used

    def to_float(self, n):
        return self._i(n).astype(self.ft)

    def bits(self, a):
        return self._f(a).view(self.it)

    def from_bits(self, n):
        return self._i(n).view(self.ft)


def evaluate(name: str, fmt: str, *args: np.ndarray) -> np.ndarray:
    """Function ``name`` elementwise on NumPy arrays, through the shared algorithm."""
    e = NumpyEmitter(FORMATS[fmt])
    args = np.broadcast_arrays(*(np.asarray(a, e.ft) for a in args))
    with np.errstate(all="ignore"):
        out = mathlib.emit(e, name, *args)
    return np.broadcast_to(out, args[0].shape).astype(e.ft)


# ------------------------------------------------------------------ inputs
def _specials(fmt: str) -> np.ndarray:
    ft, _, ut = NP[fmt]
    info = np.finfo(ft)
    tiny = info.smallest_subnormal
    values = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 0.5, 2.0, -2.0, 3.0,
              tiny, -tiny, 2 * tiny, info.smallest_normal, -info.smallest_normal,
              info.smallest_normal - tiny, info.max, -info.max, info.eps, 1 - info.eps / 2,
              1 + info.eps, 1e-30, -1e-30, 1e-7, -1e-7, 1e30, -1e30, 88.72, 88.73, 89.0,
              -87.0, -103.9, -104.0, -105.0, 127.9, 128.0, 129.0, -149.0, -149.5, -150.0,
              -151.0, 709.78, 709.79, -745.1, -745.2, 1023.9, 1024.0, -1074.0, -1075.0,
              9.1, -9.1, 8.4, 3.93, -3.93, 3.7, 5.95, 20.0, -20.0, 40.0, -40.0, 2e5, -2e5,
              205887.0, 1e14, math.pi / 2, math.pi, -math.pi / 4, 0.6931471805599453,
              0.3466, -0.3466, 2.0 ** -25, 2.0 ** -54, -(2.0 ** -25), 1.4142135623730951,
              0.7071067811865476]
    with np.errstate(over="ignore"):
        x = np.array(values, np.float64).astype(ft)
    # denormals, and the float neighbours of every value above
    rng = np.random.default_rng(7)
    den = rng.integers(1, 1 << (info.nmant), 64, dtype=np.uint64).astype(ut).view(ft)
    finite = x[np.isfinite(x)]
    with np.errstate(over="ignore"):  # the neighbours of max are inf
        near = np.concatenate([np.nextafter(finite, np.inf), np.nextafter(finite, -np.inf)])
    return np.concatenate([x, den, -den, near.astype(ft)])


def unary_inputs(fmt: str, count: int = 3000) -> np.ndarray:
    """Special values, random bit patterns (every exponent, NaNs with payloads) and random
    values where the functions change behaviour."""
    ft, _, ut = NP[fmt]
    rng = np.random.default_rng(0)
    patterns = rng.integers(0, np.iinfo(ut).max, count, dtype=ut, endpoint=True).view(ft)
    ranges = [(-1.0, 1.0), (-20.0, 20.0), (-110.0, 90.0), (-760.0, 720.0), (0.0, 4.0),
              (-2e5, 2e5), (-1e-6, 1e-6)]
    uniform = [rng.uniform(lo, hi, count // 6).astype(ft) for lo, hi in ranges]
    return np.concatenate([_specials(fmt), patterns, *uniform])


def pow_inputs(fmt: str, count: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of a set of special values, and random pairs whose |x|^y spans the
    format's range, small ones, and negative bases with integer exponents (a quarter as
    many: test_mathlib's samples)."""
    ft = NP[fmt][0]
    info = np.finfo(ft)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0,
                        3.0, -3.0, 0.25, 1 / 3, -8.0, 10.0, -10.0, 1e-40, 1000.0, -1001.0,
                        info.max, info.smallest_subnormal], np.float64).astype(ft)
    sx, sy = (a.ravel() for a in np.meshgrid(special, special))
    x, y = _pow_samples(info.bits, count, seed=1, negatives=count // 4)
    return np.concatenate([sx, x]), np.concatenate([sy, y])


def ulp_distance(a: np.ndarray, b: np.ndarray, fmt: str) -> np.ndarray:
    """How many floats lie between a and b (0 for equal values and for two NaNs; the
    largest integer where exactly one is NaN)."""
    _, it, _ = NP[fmt]
    big = np.iinfo(it).max

    def key(v):  # monotonic integer of a float, -0.0 and 0.0 both 0
        bits = v.view(it).astype(np.int64)
        return np.where(bits < 0, -(bits & big), bits).astype(object)

    d = np.abs(key(a) - key(b))
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    d[nan_a & nan_b] = 0
    d[nan_a ^ nan_b] = 1 << 64
    return d


def _first_difference(name, fmt, args, got, want, bad) -> str:
    i = int(np.flatnonzero(bad)[0])
    where = ", ".join(repr(a[i]) for a in args)
    return (f"{name} {fmt}({where}): NumPy emitter {got[i]!r}, LLVM {want[i]!r} "
            f"({int(bad.sum())} of {bad.size} differ)")


# ------------------------------------------------------------------ tests
def test_fma_emulation_is_exact():
    """The NumPy fma against rational arithmetic, on cancellations, near-ties, far-apart
    exponents, subnormal results and special values."""
    rng = np.random.default_rng(5)
    for fmt in ("f32", "f64"):
        ft, _, ut = NP[fmt]
        info = np.finfo(ft)
        n = 3000
        a = rng.uniform(-2, 2, n).astype(ft)
        b = rng.uniform(-2, 2, n).astype(ft)
        c = np.concatenate([  # cancelling, ties decided by a small tail, far apart, random
            -(a[:500].astype(np.float64) * b[:500]).astype(ft),
            (a[500:1000].astype(np.float64) * b[500:1000]).astype(ft) * ft(1 + info.eps),
            rng.uniform(-1, 1, 500).astype(ft) * ft(2.0 ** -40),
            rng.integers(0, np.iinfo(ut).max, n - 1500, dtype=ut).view(ft)])
        a[2000:2200] *= ft(info.smallest_normal)  # subnormal products
        c[2000:2100] = ft(0.0)
        specials = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, info.max,
                             info.smallest_subnormal], ft)
        sa, sb, sc = (v.ravel() for v in np.meshgrid(specials, specials, specials))
        a, b, c = np.concatenate([a, sa]), np.concatenate([b, sb]), np.concatenate([c, sc])
        got = fma(a, b, c, fmt)
        for i in range(a.size):
            want = _fma_scalar(float(a[i]), float(b[i]), float(c[i]))
            if fmt == "f32" and math.isfinite(want) and want != 0:
                # exact value rounded once to f32: via the rational, not via a double
                exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
                want = _round_to_f32(exact)
            with np.errstate(over="ignore"):
                want = ft(want)
            same = np.isnan(want) or (ulp_distance(np.array([got[i]]), np.array([want]), fmt)[0]
                                       == 0 and np.signbit(got[i]) == np.signbit(want))
            assert same, (fmt, a[i], b[i], c[i], got[i], want)


def _round_to_f32(exact: Fraction) -> float:
    """A nonzero rational rounded to the nearest float32 (ties to even), as a float."""
    sign = -1 if exact < 0 else 1
    m = abs(exact)
    e = max(m.numerator.bit_length() - m.denominator.bit_length(), -126)
    while Fraction(2) ** e > m:
        e -= 1
    while Fraction(2) ** (e + 1) <= m:
        e += 1
    e = max(e, -126)
    quantum = Fraction(2) ** (e - 23)
    q, r = divmod(m, quantum)
    if r * 2 > quantum or (r * 2 == quantum and q % 2):
        q += 1
    value = float(q * quantum)
    return sign * (math.inf if value > float(np.finfo(np.float32).max) else value)


def test_emitter_implements_every_primitive():
    """The NumPy emitter is a complete MathEmitter (abstract methods all defined)."""
    assert not NumpyEmitter.__abstractmethods__
    assert set(FUNCTIONS) == set(mathlib._ALGORITHMS)
    with pytest.raises(ValueError):
        mathlib.emit(NumpyEmitter(FORMATS["f32"]), "gamma", np.float32(1))
    with pytest.raises(TypeError):
        mathlib.emit(NumpyEmitter(FORMATS["f32"]), "pow", np.float32(1))


def test_an_infix_emitter_spells_or_writes_every_spelled_primitive():
    """InfixEmitter's primitives of one expression come from the subclass's SPELLING
    table (formatted with the operands and the emitter); a language that neither spells
    nor overrides one is refused when its class is made, not when a kernel needs it."""
    class Spelled(mathlib.InfixEmitter):
        SPELLING: ClassVar[dict] = {name: f"{name}({{a}}, {{e.tag}})"
                                    for name in mathlib.SPELLED}
        tag = "t"

        def floating(self, expression):
            return ("f", expression)

        def integer(self, expression):
            return ("i", expression)

        def mask(self, expression):
            return ("m", expression)

        c = ci = convert = for_format = sel = None  # (not used here)

    e = Spelled(FORMATS["f32"])
    assert e.fma("x", "y", "z") == ("f", "fma(x, t)")
    assert e.shl("x", "3") == ("i", "shl(x, t)")
    assert e.isnan("x") == ("m", "isnan(x, t)")
    assert all(getattr(mathlib.InfixEmitter, name).__name__ == name for name in mathlib.SPELLED)
    with pytest.raises(TypeError, match=r"neither spells nor overrides .*'rint'"):
        class Missing(mathlib.InfixEmitter):
            SPELLING: ClassVar[dict] = {name: "{a}" for name in mathlib.SPELLED if name != "rint"}


@pytest.mark.parametrize("fmt", ["f32", "f64"])
@pytest.mark.parametrize("name", [n for n in FUNCTIONS if n != "pow"])
def test_numpy_emitter_matches_llvm(name, fmt):
    x = unary_inputs(fmt)
    got = evaluate(name, fmt, x)
    want = run(name, int(fmt[1:]), x)
    d = ulp_distance(got, want, fmt)
    limit = 1 if (name, fmt) == ("sigmoid", "f32") else 0  # fast_recip (module docstring)
    same_zero_sign = (np.signbit(got) == np.signbit(want)) | np.isnan(got)
    bad = (d > limit) | ((d == 0) & ~same_zero_sign)
    assert not bad.any(), _first_difference(name, fmt, (x,), got, want, bad)


@pytest.mark.parametrize("fmt", ["f32", "f64"])
def test_numpy_emitter_matches_llvm_pow(fmt):
    x, y = pow_inputs(fmt)
    got = evaluate("pow", fmt, x, y)
    want = run("pow", int(fmt[1:]), x, y)
    d = ulp_distance(got, want, fmt)
    bad = (d > 0) | ((np.signbit(got) != np.signbit(want)) & ~np.isnan(got))
    assert not bad.any(), _first_difference("pow", fmt, (x, y), got, want, bad)


@pytest.mark.parametrize("fmt", ["f32", "f64"])
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_numpy_emitter_matches_llvm_on_large_sincos_arguments(name, fmt):
    """The large-argument reduction (its buckets' thresholds and their neighbours, the
    arguments closest to multiples of pi/2, huge values) gives the same bits on both."""
    ft = NP[fmt][0]
    t = np.array(FORMATS[fmt].k["reduction"]["thresholds"], ft)
    bits = int(fmt[1:])
    x = np.concatenate([t, np.nextafter(t, 0), np.nextafter(t, np.inf), t * ft(1.7),
                        ft(SINCOS_HUGE[bits]), _hard_sincos_arguments(bits, per=1)[::3]])
    x = np.concatenate([x, -x])
    got = evaluate(name, fmt, x)
    want = run(name, bits, x)
    bad = ulp_distance(got, want, fmt) > 0
    assert not bad.any(), _first_difference(name, fmt, (x,), got, want, bad)
