"""Soft floating point (hologram.backends.cpu.softfloat): bit-exact against references, no
runtime-library calls, and straight-line functions that vectorize.

Each function is wrapped in a loop ``void f(A* x, [A* y, A* z,] R* out, i64 n)`` and compiled
twice: for this machine (``llvm.compile_ir``) and for the baseline CPU of its architecture
(x86-64: SSE2 only, no SSE4.1, F16C or FMA), the targets the functions exist for. Both
builds are checked bit for bit (NaN: NaN-ness, sign and the quiet bit, or the exact NaN the
instruction gives). References: numpy (half conversions, floor/ceil/trunc/rint, fmod: all
exact), and exact rational arithmetic (fractions) rounded by hand for fma; where this
machine has FMA, also the hardware ``llvm.fma`` on a larger sample.
"""

from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess
import tempfile
from fractions import Fraction
from functools import cache
from pathlib import Path

import llvmlite.binding as llb
import numpy as np
import pytest
from llvmlite import ir
from util import map_kernel

from hologram.backends.cpu import llvm, softfloat

I16, F32, F64 = ir.IntType(16), ir.FloatType(), ir.DoubleType()
NP = {str(I16): np.uint16, str(F32): np.float32, str(F64): np.float64}
UINT = {np.float16: np.uint16, np.float32: np.uint32, np.float64: np.uint64}
TARGETS = ("host", "baseline")

# kernel name: (softfloat name, argument type)
KERNELS = {f"{name}_{bits}": (name, ty) for name in ("fma", "fmod", "floor", "ceil", "trunc",
                                                     "rint")
           for bits, ty in ((32, F32), (64, F64))}
KERNELS.update(f16_to_f32=("f16_to_f32", I16), f16_to_f64=("f16_to_f64", I16),
               f32_to_f16=("f32_to_f16", F32), f64_to_f16=("f64_to_f16", F64))


# ------------------------------------------------------------------ building and calling
def _module(kernels: dict[str, tuple[str, ir.Type]]) -> str:
    module = ir.Module(name="softfloat_test")
    module.triple = llvm.host_cpu()[0]
    for kernel, (name, ty) in kernels.items():
        map_kernel(module, kernel, softfloat.get(module, name, ty))
    return str(module)


def _baseline_machine() -> llb.TargetMachine:
    triple = llvm.host_cpu()[0]  # also initializes LLVM's native target
    cpu = "x86-64" if triple.startswith("x86_64") else "generic"
    return llb.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features="", opt=3, reloc="pic", codemodel="jitdefault")


def _baseline_object(text: str) -> bytes:
    """O3 with vectorization for the baseline CPU, as compile_ir does for this machine."""
    machine = _baseline_machine()
    module = llb.parse_assembly(text)
    module.triple = llvm.host_cpu()[0]
    module.data_layout = str(machine.target_data)
    module.verify()
    options = llb.create_pipeline_tuning_options(speed_level=3)
    options.loop_vectorization = True
    options.slp_vectorization = True
    builder = llb.create_pass_builder(machine, options)
    builder.getModulePassManager().run(module, builder)
    return machine.emit_object(module)


@cache
def _objects(target: str) -> bytes:
    text = _module(KERNELS)
    return llvm.compile_ir(text) if target == "host" else _baseline_object(text)


@cache
def _kernels(target: str) -> dict[str, object]:
    addresses = llvm.load_object(_objects(target), list(KERNELS))
    kernels = {}
    for kernel, (name, _) in KERNELS.items():
        nptr = {"fma": 4, "fmod": 3}.get(name, 2)
        proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * nptr, ctypes.c_int64)
        kernels[kernel] = proto(addresses[kernel])
    return kernels


def run(target: str, kernel: str, *args: np.ndarray) -> np.ndarray:
    name, ty = KERNELS[kernel]
    fn_ty = softfloat.get(ir.Module(), name, ty).function_type
    arrays = [np.ascontiguousarray(a, dtype=NP[str(t)])
              for a, t in zip(np.broadcast_arrays(*args), fn_ty.args)]
    out = np.empty(arrays[0].shape, NP[str(fn_ty.return_type)])
    _kernels(target)[kernel](*[a.ctypes.data for a in arrays], out.ctypes.data, out.size)
    return out


@pytest.fixture(params=TARGETS)
def target(request) -> str:
    return request.param


def assert_same(got: np.ndarray, want: np.ndarray, *inputs: np.ndarray, what: str = "") -> None:
    """Bit-identical, except that any NaN matches any NaN (callers check NaN bits apart)."""
    uint = UINT[got.dtype.type]
    nan = np.isnan(got) & np.isnan(want)
    bad = (got.view(uint) != want.view(uint)) & ~nan
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        args = ", ".join(repr(x.ravel()[k]) for x in np.broadcast_arrays(*inputs))
        raise AssertionError(f"{what}: {bad.sum()} wrong, first at ({args}): got "
                             f"{got.ravel()[k]!r}, want {want.ravel()[k]!r}")


# ------------------------------------------------------------------ code properties
def _undefined_symbols(obj: bytes) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "softfloat.o"
        path.write_bytes(obj)
        out = subprocess.run(["nm", "-u", str(path)], capture_output=True, text=True,
                             check=True).stdout
    return sorted({line.split()[-1] for line in out.splitlines() if line.strip()})


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_no_library_calls(target):
    undefined = set(_undefined_symbols(_objects(target))) - {"_GLOBAL_OFFSET_TABLE_"}
    assert not undefined


@pytest.mark.skipif(shutil.which("nm") is None or not llvm.host_cpu()[0].startswith("x86_64"),
                    reason="needs nm and an x86-64 host")
def test_baseline_lacks_the_instructions():
    """The baseline build is the case softfloat exists for: LLVM's own IR calls libm there."""
    text = """
    declare float @llvm.floor.f32(float)
    declare double @llvm.fma.f64(double, double, double)
    define void @f(ptr %p, ptr %h) {
      %x = load float, ptr %p
      %y = call float @llvm.floor.f32(float %x)
      %d = fpext float %y to double
      %z = call double @llvm.fma.f64(double %d, double %d, double %d)
      %r = frem double %z, %d
      %t = fptrunc double %r to half
      store half %t, ptr %h
      ret void
    }"""
    undefined = set(_undefined_symbols(_baseline_object(text)))
    assert {"floorf", "fma", "fmod", "__truncdfhf2"} <= undefined


def test_straight_line_functions_vectorize():
    names = {k: v for k, v in KERNELS.items() if v[0] != "fmod"}
    optimized = str(llvm.optimize_ir(_module(names)))
    for kernel in names:
        body = optimized.split(f"@{kernel}(", 1)[1].split("\n}\n", 1)[0]
        assert re.search(r"<\d+ x (float|double|i16|i32|i64)>", body), kernel


def test_get():
    module = ir.Module()
    fn = softfloat.get(module, "fma", F64)
    assert fn.name == "hg.sf.fma.f64" and softfloat.get(module, "fma", F64) is fn
    assert softfloat.get(module, "f16_to_f32", I16).name == "hg.sf.f16_to_f32.i16"
    assert str(softfloat.get(module, "f64_to_f16", F64).function_type) == "i16 (double)"
    assert "alwaysinline" in fn.attributes and fn.linkage == "internal"
    with pytest.raises(TypeError):
        softfloat.get(module, "f32_to_f16", F64)
    with pytest.raises(TypeError):
        softfloat.get(module, "floor", I16)
    with pytest.raises(ValueError):
        softfloat.get(module, "sqrt", F32)


# ------------------------------------------------------------------ half conversions
ALL_HALVES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


@pytest.mark.parametrize("bits", [32, 64])
def test_f16_to_float_exhaustive(target, bits):
    dtype = np.float32 if bits == 32 else np.float64
    got = run(target, f"f16_to_f{bits}", ALL_HALVES)
    half = ALL_HALVES.view(np.float16)
    assert_same(got, half.astype(dtype), ALL_HALVES, what=f"f16_to_f{bits}")
    # NaN: sign and payload kept, made quiet (vcvtph2ps)
    nan = np.isnan(half)
    h = ALL_HALVES[nan].astype(np.uint64)
    mant = 52 if bits == 64 else 23
    want = ((h >> 15) << (bits - 1)) | (((1 << (bits - mant - 1)) - 1) << mant) \
        | (1 << (mant - 1)) | ((h & 0x3FF) << (mant - 10))
    assert np.array_equal(got[nan].view(UINT[dtype]), want.astype(UINT[dtype]))


def _half_nan(sign: np.ndarray, top_payload: np.ndarray) -> np.ndarray:
    """The quiet NaN vcvtps2ph gives: sign, quiet bit, the payload's top bits."""
    return ((sign.astype(np.uint16) << 15) | 0x7E00 | top_payload.astype(np.uint16)).astype(
        np.uint16)


def _near_half_boundaries(dtype) -> np.ndarray:
    """Every half value and every midpoint between neighbours, as ``dtype``, each with its
    nearest neighbours in ``dtype`` (and a few further steps), both signs; plus the
    overflow threshold 65520 and the range around it."""
    finite = ALL_HALVES[:0x7C00].view(np.float16).astype(np.float64)
    points = np.concatenate([finite, (finite[:-1] + finite[1:]) / 2, [65520.0, 65536.0,
                                                                      2.0 ** -25, 2.0 ** -26]])
    x = points.astype(dtype)
    steps = np.array([-3, -2, -1, 0, 1, 2, 3, 1 << 20], dtype=np.int64)
    uint = UINT[dtype]
    xb = x.view(uint).astype(np.int64)[:, None] + steps[None, :]
    xb = xb[xb >= 0].astype(uint)
    x = xb.view(dtype)
    return np.concatenate([x, -x])


def _special_floats(dtype) -> np.ndarray:
    info = np.finfo(dtype)
    uint, nbits = UINT[dtype], np.dtype(dtype).itemsize * 8
    exp_mask = ((1 << (nbits - info.nmant - 1)) - 1) << info.nmant
    nans = [exp_mask | 1, exp_mask | (1 << (info.nmant - 1)), exp_mask | 0x5555,
            exp_mask | ((1 << info.nmant) - 1), exp_mask | (1 << (info.nmant - 2))]
    nans += [n | (1 << (nbits - 1)) for n in nans]
    values = np.array([0.0, np.inf, info.max, info.tiny, info.smallest_subnormal, 1.0,
                       65504.0, 65519.0, 1e-8, 1e30], dtype)
    return np.concatenate([values, -values, np.array(nans, uint).view(dtype)])


@pytest.mark.parametrize("bits", [32, 64])
def test_float_to_f16(target, bits):
    dtype = np.float32 if bits == 32 else np.float64
    rng = np.random.default_rng(bits)
    uint = UINT[dtype]
    random_bits = rng.integers(0, np.iinfo(uint).max, 1_000_000, dtype=uint, endpoint=True)
    # values in and around the half range, at every exponent: random low bits
    near = rng.uniform(-30, 17, 1_000_000)
    x = np.concatenate([_near_half_boundaries(dtype), _special_floats(dtype),
                        random_bits.view(dtype),
                        (np.exp2(near) * rng.choice([-1, 1], near.size)).astype(dtype)])
    if bits == 64:  # just off a half midpoint, on the scale of float32's last bit and below:
        # rounding to float32 first would make a tie of these
        mids = _near_half_boundaries(np.float64)
        x = np.concatenate([x, mids * (1 + 2.0 ** -40), mids * (1 - 2.0 ** -40)])
    got = run(target, f"f{bits}_to_f16", x)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    assert_same(got.view(np.float16), want, x, what=f"f{bits}_to_f16")
    nan = np.isnan(x)
    xb = x[nan].view(uint)
    nmant = np.finfo(dtype).nmant
    expected = _half_nan(xb >> uint(bits - 1), (xb >> uint(nmant - 10)) & uint(0x3FF))
    assert np.array_equal(got[nan], expected)


def test_numpy_f64_to_f16_is_correctly_rounded():
    """The f64 -> f16 reference: numpy rounds once (checked against exact rounding)."""
    rng = np.random.default_rng(5)
    mids = _near_half_boundaries(np.float64)
    x = np.concatenate([rng.choice(mids, 3000), rng.choice(mids, 2000) * (1 + 2.0 ** -40)])
    got = x.astype(np.float16).astype(np.float64)
    want = np.array([round_exact(Fraction(float(v)), 10, -14, 15) for v in x])
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))


# ------------------------------------------------------------------ exact rounding
def round_exact(q: Fraction, nmant: int, emin: int, emax: int) -> float:
    """``q`` rounded to nearest even in a binary format with ``nmant`` explicit significand
    bits and normal exponents ``emin..emax`` (subnormals below, inf above)."""
    if q == 0:
        return 0.0
    negative = q < 0
    n, d = abs(q.numerator), q.denominator
    e = n.bit_length() - d.bit_length()  # 2^e <= |q| < 2^(e+1) after the correction
    if (n << max(-e, 0)) < (d << max(e, 0)):
        e -= 1
    quantum = max(e, emin) - nmant
    num, den = (n, d << quantum) if quantum >= 0 else (n << -quantum, d)
    m, rem = divmod(num, den)
    if 2 * rem > den or (2 * rem == den and m & 1):
        m += 1
    overflow = m.bit_length() + quantum > emax + 1
    value = math.inf if overflow else math.ldexp(m, quantum)
    return -value if negative else value


# ------------------------------------------------------------------ fma
def _fma_reference(a: float, b: float, c: float, fmt: tuple[int, int, int]) -> float:
    """fma(a, b, c) per IEEE 754, rounded once to the format (nmant, emin, emax)."""
    if not all(map(math.isfinite, (a, b, c))):
        if math.isfinite(a) and math.isfinite(b):
            return c  # a finite product does not matter against inf, and NaN stays NaN
        return float(np.float64(a) * np.float64(b) + np.float64(c))  # exact: inf or NaN
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:  # IEEE: an exact zero sum is +0, unless both terms are -0
        product_negative = (math.copysign(1, a) * math.copysign(1, b)) < 0
        if (a == 0 or b == 0) and c == 0 and product_negative and math.copysign(1, c) < 0:
            return -0.0
        return 0.0
    return round_exact(exact, *fmt)


FMT = {32: (23, -126, 127), 64: (52, -1022, 1023)}


def _fma_inputs(bits: int, count: int, seed: int) -> tuple[np.ndarray, ...]:
    """Ordinary, cancelling, tie, near-overflow, subnormal, far-apart and special triples."""
    dtype = np.float32 if bits == 32 else np.float64
    nmant, emin, emax = FMT[bits]
    rng = np.random.default_rng(seed)
    n = count
    lo = emin - nmant  # the exponent of the smallest subnormal

    def sig(k):  # random significands in [1, 2) with random signs
        return (1 + rng.integers(0, 1 << nmant, k) * 2.0 ** -nmant) * rng.choice([-1, 1], k)

    def num(exps):
        return np.ldexp(sig(len(exps)), exps).astype(dtype)

    def ex(lo, hi, k=n):
        return rng.integers(lo, hi, k, endpoint=True)

    with np.errstate(all="ignore"):
        cases = []
        # ordinary
        cases.append((num(ex(-40, 40)), num(ex(-40, 40)), num(ex(-80, 80))))
        # cancellation: c = -RN(a*b), moved a few ulps, or scaled slightly
        a, b = num(ex(-60, 60)), num(ex(-60, 60))
        c = -(a * b)
        steps = rng.integers(-4, 5, n)
        c = (c.view(UINT[dtype]).astype(np.int64) + steps).astype(UINT[dtype]).view(dtype)
        cases.append((a, b, c))
        # ties and near-ties: a*b = +-(k/4) ulp(c), exactly or with a tiny excess
        c = num(ex(-20, 20))
        ulp = np.ldexp(1.0, np.frexp(c.astype(np.float64))[1] - 1 - nmant)
        k = rng.choice([1, 2, 3, 4, 6], n) * rng.choice([-1, 1], n) / 4
        excess = rng.choice([0.0, 0.0, 2.0 ** -nmant, -(2.0 ** -nmant)], n)
        a = (k * (1 + excess)).astype(dtype)
        cases.append((a, ulp.astype(dtype), c))
        # near-ties decided by a tail below the working precision: a*b = 2^k (1 - i^2 2^-2p)
        # with 2^k about half an ulp of c, c ordinary or near/below the smallest normal
        c = np.where(rng.random(n) < 0.5, num(ex(-20, 20)), num(ex(lo - 2, emin + 2)))
        ec = np.frexp(c.astype(np.float64))[1] - 1
        k = np.maximum(ec, emin) - nmant + rng.integers(-2, 1, n)
        i = rng.integers(1, 9, n) * 2.0 ** -nmant
        ea = rng.integers(-30, 30, n) + k // 2
        a = np.ldexp((1 + i) * rng.choice([-1, 1], n), ea).astype(dtype)
        cases.append((a, np.ldexp(1 - i, k - ea).astype(dtype), c))
        # a product just off a midpoint of the format: (1 + u)(1.5 + u) = 1.5 + 5u/2 + u^2,
        # against a c far below it that decides the rounding (sign, or a tiny magnitude)
        u = 2.0 ** -nmant
        ea, eb = ex(-60, 60), ex(-60, 60)
        a = np.ldexp(np.full(n, 1 + u) * rng.choice([-1, 1], n), ea).astype(dtype)
        b = np.ldexp(np.full(n, 1.5 + u), eb).astype(dtype)
        c = num(ea + eb - 2 * nmant + rng.integers(-130, 4, n))
        cases.append((a, b, c))
        # near overflow: products around 2^(emax+1), c near max or cancelling
        a, b = num(ex(emax // 2 - 2, emax // 2 + 2)), num(ex(emax // 2 - 2, emax // 2 + 2))
        big = np.where(rng.random(n) < 0.5, -(a * b), num(ex(emax - 3, emax)))
        big = np.where(rng.random(n) < 0.2, np.finfo(dtype).max * rng.choice([-1, 1], n),
                       big)
        cases.append((a, b, big.astype(dtype)))
        # subnormal and near-subnormal results, subnormal inputs, cancellation down there
        ea = ex(lo - 5, emax // 4)
        a, b = num(ea), num(ex(emin - 2, emin + 8) - ea)
        c = np.where(rng.random(n) < 0.5, num(ex(lo - 1, emin + 2)), -(a * b))
        c = np.where(rng.random(n) < 0.3, c * 0, c)
        cases.append((a, b, c.astype(dtype)))
        a, b = num(ex(lo, emin)), num(ex(0, 40))  # a subnormal or tiny
        cases.append((a, b, num(ex(lo, emin + 5))))
        # far apart: a tiny product against a big c (powers of two included) and vice versa
        p2 = np.ldexp(1.0, ex(-30, 30)).astype(dtype) * rng.choice([-1, 1], n).astype(dtype)
        c = np.where(rng.random(n) < 0.5, p2, num(ex(-30, 30)))
        a, b = num(ex(lo, -60)), num(ex(lo, 0))
        cases.append((a, b, c))
        cases.append((num(ex(20, emax // 2)), num(ex(20, emax // 2)), num(ex(lo, 0))))
        # random bits
        uint = UINT[dtype]
        rb = [rng.integers(0, np.iinfo(uint).max, n, dtype=uint, endpoint=True).view(dtype)
              for _ in range(3)]
        cases.append(tuple(rb))
    # every triple of special values
    info = np.finfo(dtype)
    sp = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, info.max, -info.max,
                   info.smallest_subnormal, -info.tiny, 2.0, 0.5], dtype)
    ga, gb, gc = np.meshgrid(sp, sp, sp, indexing="ij")
    cases.append((ga.ravel(), gb.ravel(), gc.ravel()))
    return tuple(np.concatenate([case[i] for case in cases]).astype(dtype) for i in range(3))


@pytest.mark.parametrize("bits", [32, 64])
def test_fma_exact(target, bits):
    a, b, c = _fma_inputs(bits, 1500, seed=bits)
    got = run(target, f"fma_{bits}", a, b, c)
    want = np.array([_fma_reference(float(x), float(y), float(z), FMT[bits])
                     for x, y, z in zip(a, b, c)], dtype=got.dtype)
    assert_same(got, want, a, b, c, what=f"fma f{bits}")
    if bits == 64:  # CPython's float(Fraction) rounds correctly too: a second reference
        fin = np.isfinite(want) & (want != 0)
        second = [float(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
                  for x, y, z in zip(a[fin], b[fin], c[fin])]
        assert np.array_equal(want[fin], np.array(second))


def _hardware_fma(a, b, c) -> np.ndarray:
    module = ir.Module(name="fma_reference")
    module.triple = llvm.host_cpu()[0]
    ty = F32 if a.dtype == np.float32 else F64
    suffix = "f32" if ty == F32 else "f64"
    intrinsic = ir.Function(module, ir.FunctionType(ty, [ty] * 3), f"llvm.fma.{suffix}")
    map_kernel(module, f"hw_fma_{suffix}", intrinsic)
    fn = llvm.load_object(llvm.compile_ir(str(module)), [f"hw_fma_{suffix}"])
    out = np.empty_like(a)
    proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 4, ctypes.c_int64)
    proto(fn[f"hw_fma_{suffix}"])(a.ctypes.data, b.ctypes.data, c.ctypes.data,
                                  out.ctypes.data, out.size)
    return out


@pytest.mark.skipif(not llvm.has_feature("fma"), reason="this machine has no FMA")
@pytest.mark.parametrize("bits", [32, 64])
def test_fma_against_hardware(target, bits):
    a, b, c = _fma_inputs(bits, 60_000, seed=100 + bits)
    assert_same(run(target, f"fma_{bits}", a, b, c), _hardware_fma(a, b, c), a, b, c,
                what=f"fma f{bits} vs hardware")


# ------------------------------------------------------------------ floor, ceil, trunc, rint
ROUNDING = dict(floor=np.floor, ceil=np.ceil, trunc=np.trunc, rint=np.rint)


def _rounding_inputs(dtype) -> np.ndarray:
    rng = np.random.default_rng(3)
    nmant = np.finfo(dtype).nmant
    uint = UINT[dtype]
    halves = np.arange(-40, 41) / 2
    p = 2.0 ** nmant
    edges = np.array([p, p - 0.5, p - 1, p + 1, 2 * p, p / 2 - 0.5, p / 2 + 0.5,
                      0.49999999999999994, 0.5000000000000001, 0.49999997, 0.50000006,
                      1e-30, 1e-300, 0.99999994, 1.0000001], dtype)
    near = (edges.view(uint).astype(np.int64)[:, None] + np.arange(-2, 3)).ravel()
    values = np.concatenate([halves.astype(dtype), edges, near.astype(uint).view(dtype),
                             (rng.uniform(-1, 1, 200_000) * np.exp2(rng.uniform(
                                 -3, nmant + 2, 200_000))).astype(dtype)])
    random_bits = rng.integers(0, np.iinfo(uint).max, 200_000, dtype=uint, endpoint=True)
    return np.concatenate([values, -values, random_bits.view(dtype), _special_floats(dtype)])


@pytest.mark.parametrize("name", list(ROUNDING))
@pytest.mark.parametrize("bits", [32, 64])
def test_rounding(target, name, bits):
    dtype = np.float32 if bits == 32 else np.float64
    x = _rounding_inputs(dtype)
    got = run(target, f"{name}_{bits}", x)
    assert_same(got, ROUNDING[name](x), x, what=f"{name} f{bits}")
    nan = np.isnan(x)  # NaN comes back as it went in
    assert np.array_equal(got[nan].view(UINT[dtype]), x[nan].view(UINT[dtype]))


def test_rounding_signed_zeros(target):
    x = np.array([-0.5, -0.5, -0.7, -0.4, 0.5, -0.0, 0.3, -2.5, 2.5], np.float64)
    cases = dict(floor=[-1.0, -1.0, -1.0, -1.0, 0.0, -0.0, 0.0, -3.0, 2.0],
                 ceil=[-0.0, -0.0, -0.0, -0.0, 1.0, -0.0, 1.0, -2.0, 3.0],
                 trunc=[-0.0, -0.0, -0.0, -0.0, 0.0, -0.0, 0.0, -2.0, 2.0],
                 rint=[-0.0, -0.0, -1.0, -0.0, 0.0, -0.0, 0.0, -2.0, 2.0])
    for name, want in cases.items():
        for bits, dtype in ((32, np.float32), (64, np.float64)):
            assert_same(run(target, f"{name}_{bits}", x), np.array(want, dtype), x,
                        what=f"{name} f{bits}")


# ------------------------------------------------------------------ fmod
def _fmod_inputs(dtype) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    uint = UINT[dtype]
    n = 50_000

    def rbits(k):
        return rng.integers(0, np.iinfo(uint).max, k, dtype=uint, endpoint=True).view(dtype)

    nmant = np.finfo(dtype).nmant
    subnormal = uint((1 << (8 * np.dtype(dtype).itemsize - 1)) | ((1 << nmant) - 1))
    with np.errstate(all="ignore"):
        y = (rng.uniform(0.5, 1, n) * np.exp2(rng.integers(-30, 30, n))).astype(dtype)
        k = rng.integers(1, 1 << min(nmant, 40), n).astype(dtype)
        multiple = (k * y).astype(dtype)  # often exact multiples, so the remainder is 0
        off = (multiple.view(uint).astype(np.int64) + rng.integers(-2, 3, n)).astype(uint)
        xs = [rbits(n), (rng.uniform(-1, 1, n) * np.exp2(rng.integers(-40, 40, n))).astype(
            dtype), multiple, off.view(dtype), rbits(n)]
        ys = [rbits(n), (rng.uniform(-1, 1, n) * np.exp2(rng.integers(-40, 40, n))).astype(
            dtype), y, -y, (rbits(n).view(uint) & subnormal).view(dtype)]
    xs.append((rbits(n).view(uint) & subnormal).view(dtype))
    ys.append((rbits(n).view(uint) & subnormal).view(dtype))
    sp = _special_floats(dtype)
    gx, gy = np.meshgrid(sp, sp, indexing="ij")
    xs += [gx.ravel()]
    ys += [gy.ravel()]
    return np.concatenate(xs), np.concatenate(ys)


@pytest.mark.parametrize("bits", [32, 64])
def test_fmod(target, bits):
    dtype = np.float32 if bits == 32 else np.float64
    x, y = _fmod_inputs(dtype)
    got = run(target, f"fmod_{bits}", x, y)
    with np.errstate(all="ignore"):
        want = np.fmod(x, y)
    assert_same(got, want, x, y, what=f"fmod f{bits}")
