"""The LLVM IR math library (hologram.backends.cpu.mathlib): accuracy, special values, and
that a loop calling it vectorizes.

Each function is wrapped in a loop ``void f(T* x, T* y, i64 n)`` (``void f(T* x, T* y,
T* out, i64 n)`` for pow), compiled for the host with the backend's O3 pipeline and called
through ctypes.

Error measure: ``|got - ref| / ulp(ref)`` where ``ref`` is the exact value (float64 for f32
results, x87 long double for f64 results; ``math.erf`` for erf in f64) and ``ulp(ref)`` is the
spacing of the result format at ``|ref|``, but never less than the smallest denormal. So
results in the denormal range are measured in absolute units of the smallest denormal
(2^-149 / 2^-1074): that is the absolute error near zero. sin and cos need no other
threshold: thanks to the exact range reduction their errors near their zeros are small in
ulps too. Where the rounded reference is inf or NaN, the result must match it exactly.
"""

from __future__ import annotations

import ctypes
import math
import re
from functools import cache

import numpy as np
import pytest
from llvmlite import ir
from util import map_kernel

from hologram.backends.cpu import llvm, mathlib
from hologram.backends.cpu.mathlib import FUNCTIONS

UNARY = tuple(name for name in FUNCTIONS if name != "pow")
TYPES = {32: ir.FloatType(), 64: ir.DoubleType()}
NP = {32: np.float32, 64: np.float64}

# max error in ulps (f32 against float64 references, f64 against long double; where long
# double is no wider than double, the reference's own error needs one more ulp)
BOUND32 = dict(exp=2, exp2=2, expm1=2, log=2, log2=2, log1p=2, tanh=7, sigmoid=4, erf=7,
               sin=4, cos=4, pow=4)
BOUND64 = dict(exp=2, exp2=2, expm1=2, log=2, log2=2, log1p=2, tanh=4, sigmoid=4, erf=4,
               sin=4, cos=4, pow=4)
if np.finfo(np.longdouble).nmant < 63:
    BOUND64 = {name: bound + 1 for name, bound in BOUND64.items()}


# ------------------------------------------------------------------ building and calling
def _loop(module: ir.Module, name: str, bits: int) -> str:
    fname = f"loop_{name}_{bits}"
    map_kernel(module, fname, mathlib.get(module, name, TYPES[bits]))
    return fname


def _ir(names: list[tuple[str, int]]) -> tuple[str, list[str]]:
    module = ir.Module(name="mathlib_test")
    module.triple = llvm.host_cpu()[0]
    fnames = [_loop(module, name, bits) for name, bits in names]
    return str(module), fnames


@cache
def _kernels() -> dict[tuple[str, int], object]:
    names = [(name, bits) for name in FUNCTIONS for bits in (32, 64)]
    text, fnames = _ir(names)
    addresses = llvm.load_object(llvm.compile_ir(text), fnames)
    kernels = {}
    for (name, bits), fname in zip(names, fnames):
        nptr = 3 if name == "pow" else 2
        proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * nptr, ctypes.c_int64)
        kernels[name, bits] = proto(addresses[fname])
    return kernels


def run(name: str, bits: int, *args: np.ndarray) -> np.ndarray:
    """Apply hg.<name> elementwise to ``args`` (converted to the format)."""
    arrays = [np.ascontiguousarray(a, dtype=NP[bits]) for a in np.broadcast_arrays(*args)]
    out = np.empty_like(arrays[0])
    _kernels()[name, bits](*[a.ctypes.data for a in arrays], out.ctypes.data, out.size)
    return out


# ------------------------------------------------------------------ references and errors
def _erf(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    out = np.sign(x)  # erf(|x| >= 6) rounds to +-1 in both formats; keeps +-0 and NaN
    inner = np.abs(x) < 6
    out[inner] = np.frompyfunc(math.erf, 1, 1)(x[inner]).astype(np.float64)
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


REFERENCE = dict(exp=np.exp, exp2=np.exp2, expm1=np.expm1, log=np.log, log2=np.log2,
                 log1p=np.log1p, tanh=np.tanh, sigmoid=_sigmoid, erf=_erf, sin=np.sin,
                 cos=np.cos, pow=np.power)


def reference(name: str, bits: int, *args: np.ndarray) -> np.ndarray:
    """The exact result, in float64 (f32) or long double (f64; erf: float64)."""
    wide = np.float64 if bits == 32 or name == "erf" else np.longdouble
    with np.errstate(all="ignore"):
        return REFERENCE[name](*[np.asarray(a, dtype=NP[bits]).astype(wide) for a in args])


def ulp_errors(bits: int, got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Error of each result in ulps (inf where a non-finite/flushed expectation is missed)."""
    info = np.finfo(NP[bits])
    wide = ref.dtype.type
    with np.errstate(all="ignore"):
        expected = ref.astype(NP[bits])
        mag = np.abs(ref)
        exponent = np.frexp(mag)[1] - 1
        ulp = np.ldexp(wide(1), np.maximum(exponent, info.minexp) - info.nmant)
        err = (np.abs(got.astype(wide) - ref) / ulp).astype(np.float64)
    err[np.isnan(err)] = np.inf
    exact = ~np.isfinite(expected)
    same = (got == expected) | (np.isnan(got) & np.isnan(expected))
    err[exact] = np.where(same[exact], 0.0, np.inf)
    return err


def max_error(name: str, bits: int, *args: np.ndarray) -> tuple[float, tuple]:
    got = run(name, bits, *args)
    err = ulp_errors(bits, got, reference(name, bits, *args))
    worst = int(np.argmax(err))
    return float(err[worst]), tuple(np.broadcast_arrays(*args)[k].ravel()[worst]
                                    for k in range(len(args)))


# ------------------------------------------------------------------ samples
def _f32_range(lo: float, hi: float, count: int) -> np.ndarray:
    """About ``count`` float32 values evenly spaced in bit pattern between lo and hi."""
    def key(v):  # monotonic integer for a float32
        b = np.array(v, np.float32).view(np.int32).astype(np.int64)
        return np.where(b < 0, -(b & 0x7FFFFFFF), b)
    a, b = int(key(lo)), int(key(hi))
    k = np.unique(np.linspace(a, b, count).astype(np.int64))
    bits = np.where(k < 0, (-k) | 0x80000000, k).astype(np.uint32)
    return bits.view(np.float32)


def whole_f32() -> np.ndarray:
    """Every 997th float32 bit pattern: all exponents, both signs, NaNs included."""
    return np.arange(0, 2 ** 32, 997, dtype=np.uint64).astype(np.uint32).view(np.float32)


DENSE32 = dict(
    exp=[(-104, 89)], exp2=[(-151, 129)], expm1=[(-20, 89), (-1, 1)],
    log=[(0.5, 2), (0, 1e-37)], log2=[(0.5, 2), (0, 1e-37)], log1p=[(-1, 1), (-1e-4, 1e-4)],
    tanh=[(-10, 10), (-1, 1)], sigmoid=[(-105, 20), (-2, 2)], erf=[(-4, 4), (-1.1, 1.1)],
    # sin, cos: also every exponent of the large-argument reduction (|x| >= 2^17), densely
    sin=[(-2e5, 2e5), (-10, 10), (1e5, 3.4e38), (-3.4e38, -1e5)],
    cos=[(-2e5, 2e5), (-10, 10), (1e5, 3.4e38), (-3.4e38, -1e5)],
)


@pytest.fixture(scope="module")
def whole() -> np.ndarray:
    return whole_f32()


# ------------------------------------------------------------------ (a) f32 accuracy
@pytest.mark.parametrize("name", UNARY)
def test_f32_accuracy(name, whole):
    samples = [whole] + [_f32_range(lo, hi, 400_000) for lo, hi in DENSE32[name]]
    x = np.concatenate(samples)
    err, where = max_error(name, 32, x)
    assert err <= BOUND32[name], f"{name} f32: {err:.3f} ulp at x={where[0]!r}"


def _pow_samples(bits: int, count: int, seed: int = 0,
                 negatives: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Random bases of every magnitude and exponents that keep |x|^y near the format's range,
    plus small bases/exponents and (``negatives`` of them, default ``count``) integer
    exponents of negative bases."""
    negatives = count if negatives is None else negatives
    rng = np.random.default_rng(seed)
    dt, uint = NP[bits], {32: np.uint32, 64: np.uint64}[bits]
    info = np.finfo(dt)
    x = rng.integers(0, np.iinfo(uint).max, count, dtype=uint).view(dt)
    x = np.abs(x[np.isfinite(x) & (x != 0)])
    t = rng.uniform(info.minexp - info.nmant - 5, info.maxexp + 5, x.size)
    with np.errstate(all="ignore"):
        y = (t / np.log2(x.astype(np.float64))).astype(dt)
    xs = rng.uniform(-10, 10, count).astype(dt)
    ys = rng.uniform(-40, 40, count).astype(dt)
    xi = -rng.uniform(0.1, 20, negatives).astype(dt)
    yi = rng.integers(-30, 30, negatives).astype(dt)
    return np.concatenate([x, xs, xi]), np.concatenate([y, ys, yi])


def test_f32_pow_accuracy():
    err, where = max_error("pow", 32, *_pow_samples(32, 400_000))
    assert err <= BOUND32["pow"], f"pow f32: {err:.3f} ulp at {where!r}"


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("name", ["tanh", "erf"])
def test_bounded_functions_stay_within_one(name, bits, whole):
    """|tanh| and |erf| never exceed 1, also where the approximation is rounded to it."""
    x = np.concatenate([whole, _f32_range(-10, 10, 400_000)])
    x = x[np.isfinite(x)].astype(np.float32 if bits == 32 else np.float64)
    assert np.all(np.abs(run(name, bits, x)) <= 1)


# ------------------------------------------------------------------ (b) special values
INF, NAN = math.inf, math.nan
SPECIALS = dict(
    exp=[(-INF, 0.0), (INF, INF), (NAN, NAN), (1000.0, INF), (-2000.0, 0.0), (0.0, 1.0),
         (-0.0, 1.0)],
    exp2=[(-INF, 0.0), (INF, INF), (NAN, NAN), (10.0, 1024.0), (0.0, 1.0), (-3.0, 0.125)],
    expm1=[(-INF, -1.0), (INF, INF), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0), (1e-30, 1e-30),
           (-1e-30, -1e-30), (1e-40, 1e-40), (1000.0, INF), (-100.0, -1.0)],
    log=[(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-INF, NAN), (INF, INF), (NAN, NAN),
         (1.0, 0.0)],
    log2=[(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (INF, INF), (NAN, NAN), (1.0, 0.0),
          (8.0, 3.0), (2.0 ** -149, -149.0), (0.5, -1.0)],
    log1p=[(-1.0, -INF), (-2.0, NAN), (-INF, NAN), (INF, INF), (NAN, NAN), (0.0, 0.0),
           (-0.0, -0.0), (1e-30, 1e-30), (-1e-40, -1e-40)],
    tanh=[(INF, 1.0), (-INF, -1.0), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0), (1e-30, 1e-30),
          (-1e-40, -1e-40), (20.0, 1.0), (-1e30, -1.0)],
    sigmoid=[(-INF, 0.0), (INF, 1.0), (NAN, NAN), (0.0, 0.5), (-0.0, 0.5), (200.0, 1.0),
             (-1000.0, 0.0)],
    erf=[(INF, 1.0), (-INF, -1.0), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0), (10.0, 1.0),
         (-10.0, -1.0), (1e-40, None), (1e30, 1.0)],
    sin=[(INF, NAN), (-INF, NAN), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0), (1e-30, 1e-30),
         (-1e-40, -1e-40)],
    cos=[(INF, NAN), (-INF, NAN), (NAN, NAN), (0.0, 1.0), (-0.0, 1.0), (1e-30, 1.0)],
)
# overflow and underflow thresholds differ per format
SPECIALS_BY_BITS = {
    32: dict(exp=[(88.73, INF), (-103.9, 2.0 ** -149), (-104.0, 0.0)],
             exp2=[(128.0, INF), (-149.0, 2.0 ** -149), (-150.0, 0.0)],
             expm1=[(88.73, INF)],
             # past the f32 rational functions' range (they round to +-1 there)
             tanh=[(9.1, 1.0), (-9.5, -1.0)], erf=[(3.93, 1.0), (-4.0, -1.0)]),
    64: dict(exp=[(709.79, INF), (-745.1, 2.0 ** -1074), (-745.2, 0.0)],
             exp2=[(1024.0, INF), (-1074.0, 2.0 ** -1074), (-1075.0, 0.0)],
             expm1=[(709.79, INF)]),
}
POW_SPECIALS = [
    (NAN, 0.0, 1.0), (NAN, -0.0, 1.0), (INF, 0.0, 1.0), (1.0, NAN, 1.0), (1.0, INF, 1.0),
    (1.0, -INF, 1.0), (-1.0, INF, 1.0), (-1.0, -INF, 1.0), (NAN, 1.0, NAN), (2.0, NAN, NAN),
    (-1.0, NAN, NAN), (-8.0, 1 / 3, NAN), (-2.0, 0.5, NAN), (-2.0, 3.0, -8.0),
    (-2.0, 2.0, 4.0), (-2.0, -1.0, -0.5), (2.0, 10.0, 1024.0), (0.0, -1.0, INF),
    (-0.0, -1.0, -INF), (0.0, -2.0, INF), (-0.0, -2.0, INF), (-0.0, -0.5, INF),
    (0.0, 3.0, 0.0), (-0.0, 3.0, -0.0), (-0.0, 2.0, 0.0), (-0.0, 0.5, 0.0),
    (0.0, -INF, INF), (-0.0, -INF, INF), (0.0, INF, 0.0),
    (0.5, INF, 0.0), (-0.5, INF, 0.0), (2.0, INF, INF), (-2.0, INF, INF),
    (0.5, -INF, INF), (-0.5, -INF, INF), (2.0, -INF, 0.0), (-2.0, -INF, 0.0),
    (INF, 2.0, INF), (INF, -2.0, 0.0), (INF, 0.5, INF), (INF, -0.5, 0.0),
    (-INF, 3.0, -INF), (-INF, 2.0, INF), (-INF, 0.5, INF), (-INF, -3.0, -0.0),
    (-INF, -2.0, 0.0), (-INF, -0.5, 0.0), (10.0, 1000.0, INF), (10.0, -1000.0, 0.0),
    (-10.0, 1001.0, -INF), (-10.0, -1001.0, -0.0), (4.0, 0.5, 2.0),
]


def _same(got: float, want: float) -> bool:
    if math.isnan(want):
        return math.isnan(got)
    return got == want and math.copysign(1, got) == math.copysign(1, want)


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("name", UNARY)
def test_special_values(name, bits):
    cases = SPECIALS[name] + SPECIALS_BY_BITS[bits].get(name, [])
    x = np.array([c[0] for c in cases], dtype=NP[bits])
    got = run(name, bits, x)
    for xi, (_, want), g in zip(x, cases, got):
        if want is None:  # tiny argument: only finite and with the sign of x
            assert np.isfinite(g) and np.signbit(g) == np.signbit(xi), (name, xi, g)
            continue
        want = NP[bits](want)
        assert _same(float(g), float(want)), f"{name} f{bits}({xi!r}) = {g!r}, want {want!r}"


def test_denormal_results_f32():
    """exp of large negative arguments rounds once into the denormal range, not to 0."""
    x = np.array([-100.0, -103.0, -88.0, -95.5], dtype=np.float32)
    got = run("exp", 32, x)
    want = np.exp(x.astype(np.float64)).astype(np.float32)
    assert np.all(got > 0)
    assert np.all(np.abs(got.view(np.int32) - want.view(np.int32)) <= 1), (got, want)
    x = np.array([1e-45, 3e-39, 1e-40], dtype=np.float32)  # log of denormals
    err = ulp_errors(32, run("log", 32, x), reference("log", 32, x))
    assert np.all(err <= 1)


@pytest.mark.parametrize("bits", [32, 64])
def test_pow_special_values(bits):
    x, y, want = (np.array(col, dtype=NP[bits]) for col in zip(*POW_SPECIALS))
    got = run("pow", bits, x, y)
    for xi, yi, g, w in zip(x, y, got, want):
        assert _same(float(g), float(w)), f"pow f{bits}({xi!r}, {yi!r}) = {g!r}, want {w!r}"


# ------------------------------------------------------------------ (c) f64 accuracy
F64_RANGES = dict(
    exp=(-746, 710), exp2=(-1076, 1025), expm1=(-40, 710), log=None, log2=None,
    log1p=None, tanh=(-20, 20), sigmoid=(-750, 40), erf=(-6, 6), sin=(-1e4, 1e4),
    cos=(-1e4, 1e4),
)


def _f64_samples(name: str, count: int = 200_000) -> np.ndarray:
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2 ** 64, count, dtype=np.uint64).view(np.float64)
    bits = bits[np.isfinite(bits)]
    parts = [bits, rng.uniform(-1, 1, count), rng.uniform(-1e-3, 1e-3, count)]
    if F64_RANGES[name] is None:  # log family: positive bit patterns, near 1, denormals
        parts = [np.abs(bits), rng.uniform(0.5, 2, count), rng.uniform(-1, 1, count),
                 rng.integers(1, 2 ** 52, 1000, dtype=np.uint64).view(np.float64)]
    else:
        parts.append(rng.uniform(*F64_RANGES[name], count))
    if name in ("sin", "cos"):  # near the zeros; every magnitude up to the largest
        parts.append(np.pi / 2 * rng.integers(-10_000, 10_000, 1000))
        parts.append(10.0 ** rng.uniform(13, 308.25, count) * rng.choice([-1.0, 1.0], count))
    return np.concatenate(parts)


@pytest.mark.parametrize("name", UNARY)
def test_f64_accuracy(name):
    err, where = max_error(name, 64, _f64_samples(name))
    assert err <= BOUND64[name], f"{name} f64: {err:.3f} ulp at x={where[0]!r}"


def test_f64_pow_accuracy():
    err, where = max_error("pow", 64, *_pow_samples(64, 200_000))
    assert err <= BOUND64["pow"], f"pow f64: {err:.3f} ulp at {where!r}"


def test_get_reuses_one_internal_inlined_function():
    module = ir.Module()
    fn = mathlib.get(module, "exp", ir.FloatType())
    assert mathlib.get(module, "exp", ir.FloatType()) is fn
    assert fn.name == "hg.exp.f32" and fn.linkage == "internal"
    assert "alwaysinline" in fn.attributes
    pow64 = mathlib.get(module, "pow", ir.DoubleType())
    assert pow64.name == "hg.pow.f64" and len(pow64.args) == 2
    with pytest.raises(ValueError):
        mathlib.get(module, "gamma", ir.FloatType())
    with pytest.raises(TypeError):
        mathlib.get(module, "exp", ir.IntType(32))


# ------------------------------------------------------------------ (d) vectorization
def test_f32_exp_loop_vectorizes():
    if not llvm.has_feature("avx2"):
        pytest.skip("host CPU lacks AVX2: no packed-float assembly to look for")
    text, (fname,) = _ir([("exp", 32)])
    asm = llvm.assembly(text)
    body = asm[asm.index(f"{fname}:"):]
    assert re.search(r"\bvfmadd\w*ps\b|%[yz]mm", body), "no packed float instructions"
    assert not re.search(r"\bcall\w*\s+\S*exp", body), "exp is still a library call"


def test_f32_avx512_scaling_and_reciprocal():
    """On AVX-512, exp scales with vscalefps (no ldexp call) and sigmoid divides with a
    reciprocal estimate (vrcp14ps) instead of vdivps."""
    if not (llvm.has_feature("avx512f") and mathlib._use_scalef()):
        pytest.skip("host CPU lacks AVX-512")
    text, fnames = _ir([("exp", 32), ("sigmoid", 32)])
    asm = llvm.assembly(text)
    exp_body = asm[asm.index(f"{fnames[0]}:"):asm.index(f"{fnames[1]}:")]
    sig_body = asm[asm.index(f"{fnames[1]}:"):]
    assert "vscalefps" in exp_body and not re.search(r"\bcall", exp_body)
    assert "vrcp14ps" in sig_body and "vdivps" not in sig_body
    assert not re.search(r"\bcall", sig_body)


def test_f32_sigmoid_every_array_length():
    """The vector body, the narrower vector epilogue (vrcpps, 12-bit estimate) and the scalar
    tail (divss) all stay within the bound and give exact 0, 1/2 and 1."""
    rng = np.random.default_rng(3)
    for n in range(1, 70):
        x = rng.uniform(-95, 20, n).astype(np.float32)
        err = ulp_errors(32, run("sigmoid", 32, x), reference("sigmoid", 32, x))
        assert err.max() <= BOUND32["sigmoid"], (n, float(err.max()))
        for value, want in ((INF, 1.0), (200.0, 1.0), (0.0, 0.5), (-INF, 0.0)):
            got = run("sigmoid", 32, np.full(n, value, np.float32))
            assert np.all(got == want), (n, value, got)


# ------------------------------------------------------------------ (e) sin, cos: large |x|
SINCOS_HUGE = {
    32: [1e20, -1e20, 3.4e38, -3.4e38, float(np.finfo(np.float32).max), 1e30, -1e10,
         2.0 ** 127, 2.0 ** 24 + 1, 131072.0, 205888.0, 1e6, 16367173 * 2.0 ** 72],
    64: [1e20, -1e20, 1e300, -1e300, 1.7e308, float(np.finfo(np.float64).max), 3.4e38,
         2.0 ** 1023, 2.0 ** 53 + 2, 1e14, 1.2e15, 1e22, 6381956970095103 * 2.0 ** 797],
}


def _hard_sincos_arguments(bits: int, per: int = 2) -> np.ndarray:
    """For every exponent e of the large-argument reduction, ``per`` arguments m 2^e (m of
    the format's precision) among the closest to a multiple of pi/2: multiples of the
    continued-fraction denominators of frac(2^e 2/pi), computed with mpmath (independent of
    mathlib's copy of 2/pi). The closest of all, 16367173 * 2^72 (f32) and
    6381956970095103 * 2^797 (f64), are within 2^-29.9 and 2^-60.9 of one; both are in."""
    mpmath = pytest.importorskip("mpmath")
    from fractions import Fraction
    p = 24 if bits == 32 else 53
    top = 104 if bits == 32 else 971
    out = []
    with mpmath.workprec(top + 4 * p + 64):
        two_over_pi = 2 / mpmath.pi
        for e in range(-6, top + 1):
            frac = mpmath.frac(mpmath.ldexp(two_over_pi, e))
            alpha = Fraction(int(mpmath.floor(mpmath.ldexp(frac, 2 * p + 40))), 2 ** (2 * p + 40))
            lo, hi = 2 ** (p - 1), 2 ** p
            denominators, x, (q0, q1) = [], alpha, (1, 0)
            for _ in range(80):  # convergents' denominators q, up to the precision
                a = x.numerator // x.denominator
                q0, q1 = q1, a * q1 + q0
                if q1 >= hi or x == a:
                    break
                denominators.append(q1)
                x = 1 / (x - a)
            candidates = []
            for q in denominators:
                for m in range(-(-lo // q), -(-lo // q) + 3):
                    if lo <= m * q < hi:
                        d = m * q * alpha
                        candidates.append((abs(d - round(d)), m * q))
            out += [math.ldexp(m, e) for _, m in sorted(candidates)[:per]]
    x = np.array(out, dtype=NP[bits])
    return np.concatenate([x, -x])


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sincos_next_to_multiples_of_pi_2(name, bits):
    """Where x is closest to a multiple of pi/2 at every exponent, the reduction must keep
    30 (f32) / 61 (f64) more bits than the result: the bound holds there too."""
    x = np.concatenate([_hard_sincos_arguments(bits), NP[bits](SINCOS_HUGE[bits])])
    err, where = max_error(name, bits, x)
    assert err <= {32: BOUND32, 64: BOUND64}[bits][name], f"{name} f{bits}: {err:.3f} at {where}"


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sincos_reduction_boundaries(name, bits):
    """Both sides of the switch to the large-argument reduction and of each of its buckets'
    thresholds (a power of two: the neighbours below it belong to the bucket before)."""
    from hologram.codegen.mathlib import FORMATS
    thresholds = FORMATS[f"f{bits}"].k["reduction"]["thresholds"]
    t = np.array(thresholds, dtype=NP[bits])
    x = np.concatenate([t, np.nextafter(t, 0), np.nextafter(t, np.inf),
                        np.nextafter(np.nextafter(t, 0), 0), t * 1.5, t * 1.999])
    x = np.concatenate([x, -x])
    err, where = max_error(name, bits, x)
    assert err <= {32: BOUND32, 64: BOUND64}[bits][name], f"{name} f{bits}: {err:.3f} at {where}"


def test_sincos_huge_arguments_exact_references():
    """A few huge arguments against references from mpmath (the correctly rounded result):
    cos(-1e20) is 0.7543 (the Cody-Waite reduction alone gave 0.6967)."""
    mpmath = pytest.importorskip("mpmath")
    for bits in (32, 64):
        x = NP[bits](SINCOS_HUGE[bits])
        for name in ("sin", "cos"):
            got = run(name, bits, x)
            with mpmath.workprec(1200):
                want = np.array([float(getattr(mpmath, name)(mpmath.mpf(float(v))))
                                 for v in x])
            spacing = np.spacing(np.abs(want.astype(NP[bits]))).astype(np.float64)
            err = np.abs(got.astype(np.float64) - want) / spacing
            assert err.max() <= 2, (name, bits, x[err.argmax()], got[err.argmax()])
    assert run("cos", 32, np.float32([-1e20]))[0] == np.float32(0.7542593)  # PyTorch: 0.7543


def test_two_over_pi_bits():
    """The reduction's copy of 2/pi, against mpmath."""
    mpmath = pytest.importorskip("mpmath")
    from hologram.codegen import mathlib as shared
    with mpmath.workprec(1700):
        want = int(mpmath.floor(mpmath.ldexp(2 / mpmath.pi, shared._TWO_OVER_PI_BITS)))
    assert want == shared._TWO_OVER_PI


def test_sincos_reduction_tables():
    """Every stored word is a normal float of its format (exact), the words of a bucket add
    up to frac(2^eb / (2 pi)) and the second word lies in [2^-p, 2^(1-p))."""
    from fractions import Fraction

    from hologram.codegen import mathlib as shared
    for fmt in shared.FORMATS.values():
        ft = NP[fmt.width]
        p = fmt.mant + 1
        t = fmt.k["reduction"]
        scale = Fraction(t["scale"])
        for threshold, words in zip(t["thresholds"], t["words"]):
            eb = int(math.log2(threshold)) - p + 1
            assert float(ft(threshold)) == threshold == 2.0 ** (eb + p - 1)
            for w in words:
                assert float(ft(w)) == w and (w == 0 or abs(w) >= np.finfo(ft).tiny)
            exact = [Fraction(w) * scale * Fraction(2) ** eb for w in words]
            assert Fraction(2) ** -p <= exact[1] < Fraction(2) ** (1 - p)
            turns = Fraction(shared._turns(eb, 1200), 2 ** 1200)
            assert 0 <= turns - sum(exact) < Fraction(2) ** (2 - p * len(words))


def test_sincos_loops_vectorize_without_calls():
    """The large-argument reduction adds only selects, products and roundings: the loops
    stay vectorized and call nothing."""
    if not llvm.has_feature("avx2"):
        pytest.skip("host CPU lacks AVX2: no packed-float assembly to look for")
    names = [(name, bits) for name in ("sin", "cos") for bits in (32, 64)]
    text, fnames = _ir(names)
    asm = llvm.assembly(text)
    for (name, bits), fname in zip(names, fnames):
        body = asm[asm.index(f"{fname}:"):]
        body = body[:body.index(".Lfunc_end")]
        packed = "ps" if bits == 32 else "pd"
        assert re.search(rf"\bvfmadd\w*{packed}\b", body), (name, bits)
        assert not re.search(r"\bcall", body), (name, bits)
