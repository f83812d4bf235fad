"""The ``cpu`` backend against the reference interpreter (and, for fused programs, PyTorch).

The interpreter defines the ISA's semantics (docs/isa.md); the CPU backend must agree with
it on every opcode and dtype. Tolerances:

- bit for bit (:func:`util.same_bits`, -0.0 differs from +0.0, any NaN equals any NaN) for
  integer and bool results and for exactly rounded float operations: ``add sub mul div mod
  sqrt fma min max abs neg sign floor ceil round trunc``, compares, ``select`` and casts;
- ``rsqrt`` is ``1/sqrt(x)`` rounded twice on the CPU: 1 ulp;
- transcendentals, in f32 and f64: :data:`ULPS` (2 ulp for exp/log and friends, 4 for
  tanh/sigmoid/erf/sin/cos/pow), plus an absolute 1e-6 where the reference is below 1e-30
  in magnitude, and for sin/cos near their zeros;
- f16 and bf16 results of inexact operations: 1 ulp of their own format; casts to bf16 from
  f64/i64/i32, bf16 fma and bf16 sums double-round through f32 today (1 bf16 ulp; the ISA
  forbids it, and the ``*_rounds_once`` tests pin that down as expected failures);
- float sums: the bound docs/isa.md states for the cpu backend (:func:`sum_bound`), also
  on large and adversarial inputs (cancellation, mixed magnitudes, 2**25 ones) against
  math.fsum; float products: 1 ulp for f16/bf16/f32 (both sides multiply in f64 and round
  once), the recursive bound ``2 n eps |result|`` for f64;
- f32/f64 matmuls may run through BLAS (f32 sums in f32): the forward error bound
  ``k eps sum|a||b|``;
- fused programs: rtol 1e-5 (atol 1e-6) against the interpreter and against PyTorch;
  random programs: rtol 1e-4 (8 ulps for f16/bf16) plus atol 1e-5;
- NaN positions always match exactly, infinities match exactly, and where both results
  are zero their signs match.

Outputs start as poison (0xFF bytes), so an element the backend forgets to write fails.
Known bugs are pinned by ``xfail(strict=True)`` tests whose reasons name the culprit.

Distances are measured by :func:`ulp_distance` on the bit patterns (bf16 through its uint16
pattern, i.e. its float32 value), so -0.0 and +0.0 are 0 ulp apart and the largest finite
number is 1 ulp from infinity (which the infinity rule excludes).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from conformance import numerics
from conformance.numerics import (
    REDUCTION_INPUTS,
    UNIT_ROUNDOFF,
    accepts,
    as_float,
    axis_sets,
    elementwise,
    float_tolerance,
    pairs,
    reduction_inputs,
    rmw_program,
    seed_of,
    storage,
    terms_of,
    tie_values,
    ulp_distance,
    values,
)
from util import execute, inputs_for, random_array, same_bits

import hologram
from hologram.backends.cpu import backend as interpreted
from hologram.backends.cpu import gemm, llvm, threads
from hologram.backends.cpu import target as cpu_targets
from hologram.backends.cpu.backend import CpuBackend
from hologram.backends.cpu.reduce import EXTREMUM_INTERLEAVE, FAST_EXTREMUM_INTERLEAVE
from hologram.backends.cpu.render import (
    MATH_INTERLEAVE,
    PART_WORK,
    independent_iterations,
    render,
    split_parts,
    unsupported,
)
from hologram.codegen import loops
from hologram.compiler import pipeline
from hologram.frontend.graph import Graph, Tensor
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder
from hologram.isa.dtypes import DType
from hologram.isa.ir import BINARY_OPS, COMPARE_OPS, UNARY_OPS, Program

pytestmark = pytest.mark.skipif(not CpuBackend.is_available(), reason="LLVM cannot target "
                                "this host")

ROOT = Path(__file__).resolve().parents[1]
NAN, INF = math.nan, math.inf
ALL = dt.ALL
FLOATS = dt.FLOATS
NUMERIC = tuple(t for t in ALL if not t.is_bool)


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    """Keep this module's artifacts out of the user's cache directory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path_factory.mktemp("cpu-cache")))
        mp.delenv("HOLOGRAM_DISABLE_DISK_CACHE", raising=False)
        mp.delenv("HOLOGRAM_FAST_MATH", raising=False)
        mp.delenv("HOLOGRAM_NUM_THREADS", raising=False)
        yield


@contextlib.contextmanager
def num_threads(n: int | None):
    """Run with ``n`` worker threads, restoring the previous setting afterwards."""
    previous = threads._override
    threads.set_num_threads(n)
    try:
        yield
    finally:
        threads.set_num_threads(previous)


# --- running -----------------------------------------------------------------------------
def _call(program: Program, backend: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Outputs start as poison (every byte 0xFF: NaN, -1, True), so an element a backend
    forgets to write cannot pass for a right one by luck."""
    compiled = hologram.compile(program, backend=backend)
    given = iter(inputs)
    arrays = [np.array(next(given), copy=True) if p.kind != "out" else
              np.full(p.nbytes, 0xFF, dtype=np.uint8).view(p.dtype.storage).reshape(p.shape)
              for p in program.params]
    out = compiled(*arrays)
    out = out if isinstance(out, tuple) else (out,)
    return [np.asarray(a).reshape(-1) for a in out]


def run_cpu(program: Program, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The program's out/inout arrays (flat) after a run on the CPU backend."""
    return _call(program, "cpu", inputs)


def run_interp(program: Program, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The same on the reference interpreter."""
    return _call(program, "interp", inputs)


def native(program: Program) -> bool:
    """Does every kernel of the lowered program run as generated code (no fallback)?"""
    return all(unsupported(k) is None for k in pipeline.run(program).kernels)


# --- the ISA's tolerances and input values: tests/conformance/numerics.py ------------------
assert_close = functools.partial(numerics.assert_close, backend="cpu")
SINCOS_LIMIT = 1e4  # |x| of the main sin/cos inputs; larger arguments are tested apart


def test_ulp_distance_helper():
    f32 = np.array([1.0, 0.0, -0.0, -1e-45, 3.4028235e38, -1.0], dtype=np.float32)
    g32 = np.array([np.nextafter(np.float32(1), np.float32(2)), -0.0, 1e-45, 1e-45, np.inf,
                    np.nextafter(np.float32(-1), np.float32(0))], dtype=np.float32)
    assert ulp_distance(f32, g32, dt.float32).tolist() == [1, 0, 1, 2, 1, 1]
    big = np.array([-1.7e308], dtype=np.float64)
    across = ulp_distance(big, -big, dt.float64)[0]  # exact, though past int64's range
    assert int(across) == 2 * int(ulp_distance(big, np.zeros(1), dt.float64)[0])
    one, next_one = dt.to_bf16_bits(np.float32([1.0, 1.0078125]))
    assert ulp_distance(np.array([one]), np.array([next_one]), dt.bfloat16)[0] == 1
    h = np.array([1.0, -0.0], dtype=np.float16)
    assert ulp_distance(h, np.array([1.0009766, 6e-8], dtype=np.float16), dt.float16).tolist() \
        == [1, 1]


UNARY_CASES = [(op, t.name) for op in UNARY_OPS for t in ALL if accepts(op, [t])]
BINARY_CASES = [(op, t.name) for op in BINARY_OPS for t in ALL if accepts(op, [t, t])]
COMPARE_CASES = [(op, t.name) for op in COMPARE_OPS for t in ALL]
CAST_CASES = [(s.name, d.name) for s in ALL for d in ALL]


def test_the_cases_cover_every_opcode_and_dtype():
    assert {op for op, _ in UNARY_CASES} == set(UNARY_OPS)
    assert {op for op, _ in BINARY_CASES} == set(BINARY_OPS)
    assert len(UNARY_CASES) == 3 * 9 + 6 + 17 * 4  # abs/neg/sign, not, float-only
    assert ("pow", "f16") in BINARY_CASES and ("mod", "u8") in BINARY_CASES
    assert len(CAST_CASES) == 100


@pytest.mark.parametrize("op, name", UNARY_CASES)
def test_unary(op, name):
    t = dt.dtype(name)
    rng = np.random.default_rng(seed_of(op, name))
    limit = SINCOS_LIMIT if op in ("sin", "cos") else INF
    x = values(t, 1000, rng, limit)
    program = elementwise(op, [t], x.size)
    (got,), (want,) = run_cpu(program, [x]), run_interp(program, [x])
    ulps, atol = float_tolerance(op, t, want)
    assert_close(got, want, t, ulps, atol, [x], f"{op} {name}")


def check_sin_cos(op: str, t: DType, low: float, high: float, special: list[float]) -> None:
    rng = np.random.default_rng(7)
    x = storage(np.concatenate([
        special, 10.0 ** rng.uniform(low, high, 300) * rng.choice([-1.0, 1.0], 300)]), t)
    program = elementwise(op, [t], x.size)
    (got,), (want,) = run_cpu(program, [x]), run_interp(program, [x])
    ulps, atol = float_tolerance(op, t, want)
    assert_close(got, want, t, ulps, atol, [x], f"{op} {t.name}")


@pytest.mark.parametrize("op", ["sin", "cos"])
@pytest.mark.parametrize("name", ["f32", "f64"])
def test_sin_cos_large_arguments(op, name):
    """Up to 1e5 (f32) and 1e9 (f64), around the end of the Cody-Waite reduction."""
    high = 5 if name == "f32" else 9
    check_sin_cos(op, dt.dtype(name), 4, high, [1e4, -1e4, 12345.678, 2.0 ** 16 * math.pi,
                                                 -(10.0 ** high), 10.0 ** high])


@pytest.mark.parametrize("op", ["sin", "cos"])
@pytest.mark.parametrize("name", ["f32", "f64"])
def test_sin_cos_huge_arguments(op, name):
    """Past Cody-Waite's range, reduced with Payne-Hanek (docs/mathlib.md)."""
    check_sin_cos(op, dt.dtype(name), 10, 38, [1e10, -1e15, 1e20, 3.4e38, -3.4e38])


@pytest.mark.parametrize("op, name", BINARY_CASES)
def test_binary(op, name):
    check_binary(op, dt.dtype(name))


def check_binary(op: str, t: DType) -> None:
    rng = np.random.default_rng(seed_of(op, t.name))
    a, b = pairs(t, 500, rng)
    if op == "pow" and t.is_float:  # also integral exponents of negative bases
        a = np.concatenate([a, values(t, 200, rng)[-200:]])
        b = np.concatenate([b, storage(rng.integers(-12, 12, 200), t)])
    program = elementwise(op, [t, t], a.size)
    (got,), (want,) = run_cpu(program, [a, b]), run_interp(program, [a, b])
    ulps, atol = float_tolerance(op, t, want)
    assert_close(got, want, t, ulps, atol, [a, b], f"{op} {t.name}")


def test_pow_f64_overflows_to_inf_and_underflows_to_zero():
    x = np.array([1.5, 1.5, 0.75, 100.0, -3.0, 2.0])
    y = np.array([65519.0, -1e300, 1e6, 1e5, 65519.0, 1e4])
    (got,) = run_cpu(elementwise("pow", [dt.float64] * 2, x.size), [x, y])
    assert got.tolist() == [INF, 0.0, 0.0, INF, -INF, INF]


def test_u8_arithmetic_wraps_around():
    a = np.array([255, 0, 16, 200, 255, 0, 7], dtype=np.uint8)
    b = np.array([1, 1, 16, 100, 255, 0, 0], dtype=np.uint8)
    for op, expected in [("add", [0, 1, 32, 44, 254, 0, 7]), ("sub", [254, 255, 0, 100, 0, 0, 7]),
                         ("mul", [255, 0, 0, 32, 1, 0, 0]), ("div", [255, 0, 1, 2, 1, 0, 0]),
                         ("mod", [0, 0, 0, 0, 0, 0, 7])]:
        (got,) = run_cpu(elementwise(op, [dt.uint8, dt.uint8], a.size), [a, b])
        assert got.tolist() == expected, op


@pytest.mark.parametrize("name", ["i8", "i16", "i32", "i64"])
def test_int_division_corner_cases(name):
    t = dt.dtype(name)
    lo, hi = t.min, t.max
    a = np.array([lo, lo, 7, -7, 7, -7, hi, 5, lo], dtype=t.storage)
    b = np.array([-1, 0, 2, 2, -2, -2, -1, 0, lo], dtype=t.storage)
    (q,) = run_cpu(elementwise("div", [t, t], a.size), [a, b])
    (r,) = run_cpu(elementwise("mod", [t, t], a.size), [a, b])
    assert q.tolist() == [lo, 0, 3, -3, -3, 3, -hi, 0, 1]
    assert r.tolist() == [0, lo, 1, -1, 1, -1, 0, 5, 0]


@pytest.mark.parametrize("op, name", COMPARE_CASES)
def test_compare(op, name):
    t = dt.dtype(name)
    a, b = pairs(t, 300, np.random.default_rng(seed_of(op, name)))
    program = elementwise(op, [t, t], a.size)
    (got,), (want,) = run_cpu(program, [a, b]), run_interp(program, [a, b])
    assert_close(got, want, dt.bool_, inputs=[a, b], what=f"{op} {name}")


@pytest.mark.parametrize("name", [t.name for t in ALL])
def test_select(name):
    t = dt.dtype(name)
    rng = np.random.default_rng(3)
    a = values(t, 300, rng)
    b = values(t, 300, rng)[::-1].copy()
    c = rng.random(a.size) < 0.5
    program = elementwise("select", [dt.bool_, t, t], a.size)
    (got,), (want,) = run_cpu(program, [c, a, b]), run_interp(program, [c, a, b])
    assert_close(got, want, t, inputs=[c, a, b], what=f"select {name}")


def cast_inputs(t: DType, rng: np.random.Generator) -> np.ndarray:
    """Values of ``t`` that probe saturation, wrapping, NaN, and single rounding."""
    if t.is_float:
        special = [127.5, 128.0, -128.5, -129.0, 255.5, 256.0, -0.7, 0.7, 32767.5, 32768.0,
                   -32769.0, 2147483520.0, 2147483648.0, -2147483904.0, 9.2e18, 9.3e18,
                   -9.3e18, 1 + 2.0 ** -8 + 2.0 ** -30, 1 + 2.0 ** -11 + 2.0 ** -40,
                   1 + 2.0 ** -24 + 2.0 ** -60, 3.0e38, 1e39, -1e39, 1e300]
        return np.concatenate([values(t, 500, rng), storage(special, t)])
    big = [2**24 + 1, 2**24 + 2**16 + 1, 16842753, 2**31 - 1, 2**53 + 1, 2**62 + 2**38 + 1,
           -(2**62) - 2**38 - 1, 2**63 - 1, -(2**63), 65519, 65520, 300, -300]
    fits = [v for v in big if t.min <= v <= t.max]
    return np.concatenate([values(t, 500, rng), np.array(fits, dtype=np.int64).astype(t.storage)])


# i64 -> f64 can round before the (round-to-odd) f64 -> bf16 step: rare 1-ulp differences.
DOUBLE_ROUNDING_CASTS = {("i64", "bf16")}


@pytest.mark.parametrize("src, dst", CAST_CASES)
def test_cast(src, dst):
    s, d = dt.dtype(src), dt.dtype(dst)
    x = cast_inputs(s, np.random.default_rng(seed_of(src, dst)))
    program = elementwise("cast", [s], x.size, result=d)
    (got,), (want,) = run_cpu(program, [x]), run_interp(program, [x])
    ulps = 1 if (src, dst) in DOUBLE_ROUNDING_CASTS else 0
    assert_close(got, want, d, ulps, inputs=[x], what=f"cast {src} -> {dst}")


# --- rounding once (the ISA forbids double rounding) ---------------------------------------
# Each input's exact result lies just off a midpoint of the narrow format, but rounds onto
# the midpoint in float32 first, so rounding twice picks the wrong neighbour.
BF16_UP = 1 + 2.0 ** -8 + 2.0 ** -30  # correct bf16: 1.0078125; twice: 1.0
F16_UP = 1 + 2.0 ** -11 + 2.0 ** -40  # correct f16: 1.0009766; twice: 1.0


def test_cast_f16_nan_to_i16_is_zero():
    x = np.array([np.nan, -np.nan, 1.5], dtype=np.float16)
    (got,) = run_cpu(elementwise("cast", [dt.float16], 3, result=dt.int16), [x])
    assert got.tolist() == [0, 0, 1]


def test_cast_f64_to_f16_rounds_once():
    x = np.array([F16_UP, -F16_UP], dtype=np.float64)
    (got,) = run_cpu(elementwise("cast", [dt.float64], 2, result=dt.float16), [x])
    assert got.tolist() == [1.0009765625, -1.0009765625]


def test_cast_f64_to_bf16_rounds_once():
    x = np.array([BF16_UP, -BF16_UP], dtype=np.float64)
    (got,) = run_cpu(elementwise("cast", [dt.float64], 2, result=dt.bfloat16), [x])
    assert dt.from_bf16_bits(got).tolist() == [1.0078125, -1.0078125]


@pytest.mark.parametrize("name", ["i32", "i64"])
def test_cast_int_to_bf16_rounds_once(name):
    t = dt.dtype(name)
    x = np.array([2**24 + 2**16 + 1, -(2**24 + 2**16 + 1)], dtype=t.storage)  # 0x01010001
    (got,) = run_cpu(elementwise("cast", [t], 2, result=dt.bfloat16), [x])
    assert dt.from_bf16_bits(got).tolist() == [2.0**24 + 2.0**17, -(2.0**24 + 2.0**17)]


def test_fma_bf16_rounds_once():
    # a*b = 1.51171875 is a bf16 midpoint; c pulls it just below.
    a, b, c = (dt.to_bf16_bits(np.float32(v))[None] for v in (1.0078125, 1.5, -(2.0 ** -40)))
    (got,) = run_cpu(elementwise("fma", [dt.bfloat16] * 3, 1), [a, b, c])
    assert float(dt.from_bf16_bits(got)[0]) == 1.5078125


@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_sum_of_narrow_floats_within_the_bound(name):
    """The interpreter rounds the exact sum once; the cpu backend accumulates f16/bf16 in
    float32 (1 + half is exact there, the tail is lost) and may round twice: within the
    bound, not bit for bit."""
    t = dt.dtype(name)
    tail = 2.0 ** -24 if t is dt.float16 else 2.0 ** -30
    half = 2.0 ** -11 if t is dt.float16 else 2.0 ** -8
    g = Graph(f"sum_{name}")
    x = g.input("x", t, (3,))
    g.output("s", g.sum(x))
    data = storage([1.0, half, tail], t)
    expected = 1 + 2 * half
    (got,) = run_cpu(g.program(), [data])
    (want,) = run_interp(g.program(), [data])
    assert as_float(want, t)[0] == expected
    exact = 1 + half + tail
    assert abs(as_float(got, t)[0] - exact) <= sum_bound(t, exact, exact)


# --- reductions ----------------------------------------------------------------------------
REDUCE_SHAPES = [(7,), (4, 5), (2, 3, 4)]
REDUCE_CASES = [(kind, t.name) for kind in ("sum", "prod", "max", "min", "argmax", "argmin")
                for t in ALL if not (t.is_bool and kind in ("sum", "prod"))]


def reduce_program(kind: str, t: DType,
                   keepdim: bool) -> tuple[Program, list[tuple[str, tuple, tuple]]]:
    """One program reducing a 1-D, a 2-D and a 3-D input over every axis combination;
    returns it and (output name, input shape, axes) per output."""
    g = Graph(f"reduce_{kind}_{t.name}")
    outputs = []
    for shape in REDUCE_SHAPES:
        x = g.input(f"x{len(shape)}", t, shape)
        for axes in axis_sets(len(shape)):
            name = f"r{len(shape)}_{''.join(map(str, axes))}"
            g.output(name, g.reduce(kind, x, axes, keepdim=keepdim))
            outputs.append((name, shape, axes))
    return g.program(), outputs


#: The cpu backend's bound for a float sum of n terms x_i with exact sum s (docs/isa.md,
#: "Reductions"): |result - s| <= SUM_TERMS * u * sum|x_i| + u_r * |s|, with u the unit
#: roundoff of the accumulation (f32 for f16/bf16/f32, f64 for f64) and u_r the result's.
SUM_TERMS = 28


def sum_bound(t: DType, magnitudes, exact):
    """The largest error :data:`SUM_TERMS` allows: ``magnitudes`` is sum|x_i|, ``exact``
    the exact sum (the interpreter's result will do: it is rounded once)."""
    u = UNIT_ROUNDOFF["f64" if t is dt.float64 else "f32"]
    exact = np.abs(np.asarray(exact, dtype=np.float64))
    return SUM_TERMS * u * np.asarray(magnitudes, dtype=np.float64) + UNIT_ROUNDOFF[t.name] * exact


def reduce_tolerance(kind: str, t: DType, want, x: np.ndarray, shape, axes):
    """Float sums: :func:`sum_bound`. Float products accumulate in f64 in another order
    than the interpreter: 1 ulp for f16/bf16/f32 (rounded once), and for f64 the classical
    bound ``2 n eps |result|``."""
    if kind not in ("sum", "prod") or not t.is_float:
        return 0, 0.0
    n = math.prod(shape[a] for a in axes)
    if kind == "sum":
        scale = np.abs(terms_of(x, t, shape, axes)).sum(axis=1)
        return 0, sum_bound(t, scale, as_float(want, t))
    if t is not dt.float64:
        return 1, 0.0
    return 0, 2 * n * np.finfo(np.float64).eps * np.abs(as_float(want, t))


# keepdim only changes the output's shape (a view): every dtype without it, and the
# keepdim=True spelling in f32 (each small reduction kernel costs LLVM ~20-100 ms at O3).
@pytest.mark.parametrize("kind, name, keepdim", [
    *((kind, name, False) for kind, name in REDUCE_CASES),
    *((kind, name, True) for kind, name in REDUCE_CASES if name == "f32")])
def test_reduce(kind, name, keepdim):
    t = dt.dtype(name)
    program, outputs = reduce_program(kind, t, keepdim)
    assert native(program)
    rng = np.random.default_rng(seed_of(kind, name))
    params = [p for p in program.params if p.kind == "in"]
    datasets = {label: reduction_inputs(label, t, params, rng) for label in REDUCTION_INPUTS}
    for label, inputs in datasets.items():
        got, want = run_cpu(program, inputs), run_interp(program, inputs)
        for (out, shape, axes), g, w in zip(outputs, got, want):
            x = inputs[len(shape) - 1]
            rt = dt.int64 if kind.startswith("arg") else t
            ulps, atol = reduce_tolerance(kind, t, w, x, shape, axes)
            assert_close(g, w, rt, ulps, atol, what=f"{kind} {name} {out} on {label} inputs "
                         f"{as_float(x, t) if t.is_float else x}")


# NaN and signed zeros in max/min/argmax/argmin (the same rows, every float dtype), and
# reductions over empty axes (the same shapes and axes, every dtype):
# tests/conformance/test_reductions.py runs them on every backend, cpu included.


def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("data, n", [("uniform", 1_000_003), ("normal", 1_000_003),
                                     ("magnitudes", 1_000_003), ("cancel", 1_000_003),
                                     ("uniform", 10_000_000)])
def test_large_f32_sums_within_the_bound(data, n):
    """Against math.fsum, on large, cancelling and mixed-magnitude inputs."""
    rng = np.random.default_rng(n)
    x = {
        "uniform": lambda: rng.random(n),
        "normal": lambda: rng.standard_normal(n),
        "magnitudes": lambda: rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n),
        "cancel": lambda: np.concatenate([rng.standard_normal(n // 2) * 1e3,
                                          -rng.standard_normal(n - n // 2) * 1e3]) + 1e-3,
    }[data]().astype(np.float32)
    g = Graph("big_sum")
    g.output("s", g.sum(g.input("x", "f32", (n,))))
    (got,) = run_cpu(g.program(), [x])
    exact = math.fsum(x.astype(np.float64).tolist())
    bound = sum_bound(dt.float32, math.fsum(np.abs(x.astype(np.float64)).tolist()), exact)
    assert abs(float(got[0]) - exact) <= bound, (float(got[0]), exact, bound)


def blocked_sum(x: np.ndarray) -> np.float32:
    """The cpu backend's float32 sum of one row (docs/isa.md, "Float sums"), in NumPy:
    blocks of ``BLOCK`` terms; term ``i`` of a block's whole groups of ``LANES`` in lane
    ``i % LANES``, the lanes added as a balanced tree; the block's further whole vectors
    (``VECTOR`` terms) in ``VECTOR`` more lanes, added as a tree; its last ``< VECTOR``
    terms in order; the three sums of each block added in order in float64."""

    def tree(lanes):
        while len(lanes) > 1:
            lanes = lanes[:len(lanes) // 2] + lanes[len(lanes) // 2:]
        return np.float64(lanes[0])

    outer = np.float64(-0.0)
    for start in range(0, len(x), loops.BLOCK):
        block = x[start:start + loops.BLOCK]
        full = len(block) // loops.LANES * loops.LANES
        vectors = len(block) // loops.VECTOR * loops.VECTOR
        lanes = np.full(loops.LANES, -0.0, np.float32)
        for g in range(0, full, loops.LANES):
            lanes += block[g:g + loops.LANES]
        outer += tree(lanes)
        lanes = np.full(loops.VECTOR, -0.0, np.float32)
        for v in range(full, vectors, loops.VECTOR):
            lanes += block[v:v + loops.VECTOR]
        outer += tree(lanes)
        tail = np.float32(-0.0)
        for term in block[vectors:]:
            tail = np.float32(tail + term)
        outer += np.float64(tail)
    return np.float32(outer)


@pytest.mark.parametrize("n", [17, 63, 64, 65, 79, 80, 1023, 1024, 1025, 1087, 1104, 3000,
                               65_000])
def test_f32_sum_follows_the_documented_order(n):
    """Bit for bit the order docs/isa.md states, at lengths around the lane, vector and
    block boundaries (a whole row in one kernel: below the split of large reductions)."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 4, n)).astype(np.float32)
    g = Graph("ordered_sum")
    g.output("s", g.sum(g.input("x", "f32", (n,))))
    (got,) = run_cpu(g.program(), [x])
    assert same_bits(got, np.array([blocked_sum(x)])), (got, blocked_sum(x))


def column_sum(x: np.ndarray) -> np.ndarray:
    """The order docs/isa.md states for column sums (sums over axis 0 of ``x``, float32):
    blocks of loops.SHORT_ROW rows, each a sequential float32 sum, added in order in
    float64, rounded once."""
    total = np.full(x.shape[1:], -0.0)
    for start in range(0, x.shape[0], loops.SHORT_ROW):
        partial = np.full(x.shape[1:], -0.0, np.float32)
        for row in x[start:start + loops.SHORT_ROW]:
            partial = partial + row
        total = total + partial.astype(np.float64)
    return total.astype(np.float32)


@pytest.mark.parametrize("rows, columns", [(3, 8), (16, 9), (37, 300), (64, 600)])
def test_column_sums_follow_the_documented_order(rows, columns):
    """``x.sum(0)`` of a row-major matrix is summed a tile of columns at a time
    (loops.column_tile), bit for bit in the documented order, on any thread count (the
    threads' ranges split tiles), with the terms and epilogue of a mean of a product."""
    rng = np.random.default_rng(seed_of("columns", str(rows), str(columns)))
    x = (rng.standard_normal((rows, columns))
         * 10.0 ** rng.uniform(-4, 4, (rows, columns))).astype(np.float32)
    w = rng.standard_normal(columns).astype(np.float32)
    g = Graph("column_sums")
    xs, ws = g.input("x", "f32", (rows, columns)), g.input("w", "f32", (columns,))
    g.output("s", g.sum(xs, 0))
    g.output("m", g.sum(xs * ws, 0) / float(rows))
    caps = cpu_targets.host().capabilities
    assert all(loops.plan(k, caps).columns == loops.COLUMN_TILE
               for k in pipeline.run(g.program()).kernels if k.grid_rank)
    for n in (1, 2, 3):
        with num_threads(n):
            s, m = run_cpu(g.program(), [x, w])
        assert same_bits(s, column_sum(x)), n
        mean = (column_sum(x * w).astype(np.float64) / np.float32(rows)).astype(np.float32)
        assert same_bits(m, column_sum(x * w) / np.float32(rows)) or same_bits(m, mean), n


@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape, axes", [((40, 24), (0,)), ((5, 20, 24), (0, 1)),
                                         ((3, 21, 24), (1,)), ((2, 18, 3, 40), (1, 2))])
def test_column_sums_match_the_interpreter_with_edge_values(name, shape, axes):
    """Column sums of every float dtype they serve, over one or several axes and under a
    batch (a grid of two dimensions), on random values and on NaN, infinities, signed
    zeros and subnormals: within the sum bound, with NaN, infinity and zero signs where
    the interpreter has them."""
    t = dt.dtype(name)
    g = Graph("column_edges")
    x = g.input("x", t, shape)
    g.output("s", g.sum(x, axes))
    g.output("q", g.sum(x * x, axes))
    assert all(loops.plan(k, cpu_targets.host().capabilities).columns
               for k in pipeline.run(g.program()).kernels)
    rng = np.random.default_rng(seed_of("column edges", name, str(shape)))
    (param,) = [p for p in g.program().params if p.kind == "in"]
    for edges in (False, True):
        inputs = [random_array(param, rng, edges=edges)]
        got, want = run_cpu(g.program(), inputs), run_interp(g.program(), inputs)
        values = as_float(inputs[0], t).reshape(shape)
        for out, gv, wv, terms in zip("sq", got, want, (values, values * values)):
            ulps, atol = reduce_tolerance("sum", t, wv, storage(terms, t), shape, axes)
            assert_close(gv, wv, t, ulps, atol, what=f"column sum {out} {name} {shape}")


@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
def test_many_equal_terms_do_not_stall_the_sum(name):
    """2**25 ones (2**15 in f16, whose largest finite value is 65504), loaded broadcast,
    so no memory: a float32 running sum stalls at 2**24, a float16 one at 2048; blocked
    lanes with a wide outer sum get every one."""
    t = dt.dtype(name)
    n = 1 << (15 if t is dt.float16 else 25)
    b = ProgramBuilder("ones")
    x = b.input("x", t, (1,))
    out = b.output("y", dt.float32, (1,))
    k = b.kernel((n,))
    k.store(out, k.cast(k.reduce("sum", k.load(x, (1,), 0, (0,)), 0), dt.float32),
            strides=(0,), shape=(1,))
    (got,) = run_cpu(b.build(), [storage([1.0], t)])
    assert float(got[0]) == n


@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_narrow_sums_accumulate_wider_than_their_format(name):
    t = dt.dtype(name)
    n = 100_003
    rng = np.random.default_rng(11)
    data = storage(rng.uniform(0.05, 0.5, n), t)  # sum < 65504
    g = Graph("narrow_sum")
    g.output("s", g.sum(g.input("x", t, (n,))))
    (got,), (want,) = run_cpu(g.program(), [data]), run_interp(g.program(), [data])
    exact = math.fsum(as_float(data, t).tolist())
    assert abs(as_float(got, t)[0] - exact) <= sum_bound(t, exact, exact)
    assert abs(as_float(want, t)[0] - exact) <= UNIT_ROUNDOFF[name] * exact


def test_large_f64_sum_within_the_bound():
    n = 2_000_003
    x = np.random.default_rng(5).standard_normal(n) * 10.0 ** np.random.default_rng(6).uniform(
        -5, 5, n)
    g = Graph("big_sum64")
    g.output("s", g.sum(g.input("x", "f64", (n,))))
    (got,) = run_cpu(g.program(), [x])
    exact = math.fsum(x.tolist())
    assert abs(got[0] - exact) <= sum_bound(dt.float64, math.fsum(np.abs(x).tolist()), exact)


# A reduction of a whole large domain runs as partials on the threads, folded in order
# (render.split_parts): the cases above are too small to split.
SPLIT_CASES = [(kind, t.name) for kind in ("sum", "prod", "max", "min", "argmax", "argmin")
               for t in (dt.float32, dt.float64, dt.bfloat16, dt.int32, dt.uint8, dt.bool_)
               if not (t.is_bool and kind in ("sum", "prod"))]


def split_program(kind: str, t: DType) -> Program:
    g = Graph(f"split_{kind}_{t.name}")
    flat = g.input("flat", t, (2 * PART_WORK + 3,))  # two partials, of unequal length
    rows = g.input("rows", t, (300, 700))  # split along rows; read transposed too
    g.output("r_flat", g.reduce(kind, flat))
    g.output("r_rows", g.reduce(kind, rows))
    g.output("r_cols", g.reduce(kind, rows.permute(1, 0)))
    return g.program()


@pytest.mark.parametrize("kind, name", SPLIT_CASES)
def test_split_reductions_match_the_interpreter_on_any_thread_count(kind, name):
    t = dt.dtype(name)
    program = split_program(kind, t)
    assert all(split_parts(k) >= 2 for k in pipeline.run(program).kernels)
    rng = np.random.default_rng(seed_of("split", kind, name))
    params = [p for p in program.params if p.kind == "in"]
    # products of many values over/underflow: values near 1 keep them finite
    datasets = {"ties": [tie_values(t, p.size, rng) for p in params]}
    if kind == "prod" and t.is_float:
        datasets["random"] = [storage(rng.uniform(0.999, 1.001, p.size), t) for p in params]
    else:
        datasets["random"] = [random_array(p, rng, edges=True) for p in params]
    for label, inputs in datasets.items():
        want = run_interp(program, inputs)
        by_threads = []
        for n in (1, 2, 3):
            with num_threads(n):
                by_threads.append(run_cpu(program, inputs))
        for got in by_threads[1:]:  # fixed partials: the same bits on any thread count
            assert all(same_bits(a, b) for a, b in zip(by_threads[0], got)), label
        rt = dt.int64 if kind.startswith("arg") else t
        for out, g, w, x in zip(("flat", "rows", "cols"), by_threads[0], want,
                                 (inputs[0], inputs[1], inputs[1])):
            shape = x.shape if out == "flat" else (300, 700)
            ulps, atol = reduce_tolerance(kind, t, w, x, shape, tuple(range(len(shape))))
            assert_close(g, w, rt, ulps, atol, what=f"{kind} {name} {out} on {label} inputs")


def test_split_reduction_runs_what_follows_it_and_dot_products():
    n = 3 * PART_WORK + 1
    g = Graph("split_rest")
    x, y = g.input("x", "f32", (n,)), g.input("y", "f32", (n,))
    g.output("mean", g.mean(x))
    g.output("dot", g.reduce("sum", x * y))
    g.output("norm", g.unary("sqrt", g.sum(x * x)))
    program = g.program()
    assert sum(split_parts(k) for k in pipeline.run(program).kernels) >= 6
    rng = np.random.default_rng(3)
    x, y = inputs = [rng.standard_normal(n).astype(np.float32) for _ in range(2)]
    mean, dot, norm = run_interp(program, inputs)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    one_ulp = float(np.spacing(np.float32(1.0)))
    tolerances = [sum_bound(dt.float32, np.abs(x64).sum(), mean * n) / n,
                  sum_bound(dt.float32, np.abs(x64 * y64).sum(), dot),
                  sum_bound(dt.float32, (x64 * x64).sum(), norm ** 2) / (2 * norm)
                  + one_ulp * norm]
    for got, want, atol in zip(run_cpu(program, inputs), (mean, dot, norm), tolerances):
        assert_close(got, want, dt.float32, ulps=1, atol=atol)


def test_what_is_not_split():
    def kernels(build) -> list:
        g = Graph("not_split")
        build(g)
        return pipeline.run(g.program()).kernels

    small = kernels(lambda g: g.output("s", g.sum(g.input("x", "f32", (PART_WORK,)))))
    rows = kernels(lambda g: g.output("s", g.sum(g.input("x", "f32", (512, 4096)), 1)))
    both = kernels(lambda g: g.output("e", g.unary("exp", g.input("x", "f32", (1 << 20,)))))
    assert [split_parts(k) for k in small + rows + both] == [0] * len(small + rows + both)


# --- fused programs -------------------------------------------------------------------------
def softmax(g: Graph, x: Tensor) -> Tensor:
    e = g.unary("exp", x - g.max(x, 1, keepdim=True))
    return e / g.sum(e, 1, keepdim=True)


def log_softmax(g: Graph, x: Tensor) -> Tensor:
    shifted = x - g.max(x, 1, keepdim=True)
    return shifted - g.unary("log", g.sum(g.unary("exp", shifted), 1, keepdim=True))


def layer_norm(g: Graph, x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    d = x - g.mean(x, 1, keepdim=True)
    return d * g.unary("rsqrt", g.mean(d * d, 1, keepdim=True) + 1e-5) * w + b


def gelu_erf(g: Graph, x: Tensor) -> Tensor:
    return x * 0.5 * (g.unary("erf", x * (1 / math.sqrt(2))) + 1.0)


def gelu_tanh(g: Graph, x: Tensor) -> Tensor:
    inner = (x + x * x * x * 0.044715) * math.sqrt(2 / math.pi)
    return x * 0.5 * (g.unary("tanh", inner) + 1.0)


def relu_mad(g: Graph, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    return g.maximum(a * b + c, 0.0)


def mse(g: Graph, a: Tensor, b: Tensor) -> Tensor:
    d = a - b
    return g.mean(d * d)


def cross_entropy(g: Graph, x: Tensor, target: Tensor) -> Tensor:
    n, c = x.shape
    picked = g.where(g.binary("eq", g.arange(c, "i64"), target.reshape(n, 1)), x, 0.0)
    lse = g.unary("log", g.sum(g.unary("exp", x - g.max(x, 1, keepdim=True)), 1))
    return g.mean(lse + g.max(x, 1) - g.sum(picked, 1))


def _normal(*shape, scale=3.0, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


FUSED = {
    "softmax_rows_1000": (softmax, lambda: [_normal(8, 1000)],
                          lambda F, x: F.softmax(x, 1)),
    "softmax_rows_of_1": (softmax, lambda: [_normal(5, 1)], lambda F, x: F.softmax(x, 1)),
    "softmax_empty_batch": (softmax, lambda: [_normal(0, 10)], lambda F, x: F.softmax(x, 1)),
    "log_softmax": (log_softmax, lambda: [_normal(16, 300)], lambda F, x: F.log_softmax(x, 1)),
    "layer_norm": (layer_norm, lambda: [_normal(16, 64), _normal(64, seed=1),
                                        _normal(64, seed=2)],
                   lambda F, x, w, b: F.layer_norm(x, (64,), w, b, eps=1e-5)),
    "gelu_erf": (gelu_erf, lambda: [_normal(32, 65)], lambda F, x: F.gelu(x)),
    "gelu_tanh": (gelu_tanh, lambda: [_normal(32, 65)],
                  lambda F, x: F.gelu(x, approximate="tanh")),
    "relu_mad": (relu_mad, lambda: [_normal(1001, seed=s) for s in range(3)],
                 lambda F, a, b, c: F.relu(a * b + c)),
    "mse": (mse, lambda: [_normal(40, 25), _normal(40, 25, seed=1)],
            lambda F, a, b: F.mse_loss(a, b)),
    "cross_entropy": (cross_entropy,
                      lambda: [_normal(24, 11),
                               np.random.default_rng(3).integers(0, 11, 24)],
                      lambda F, x, t: F.cross_entropy(x, t)),
}


def fused_program(name: str) -> tuple[Program, list[np.ndarray]]:
    build, make_inputs, _ = FUSED[name]
    inputs = make_inputs()
    g = Graph(name)
    tensors = [g.input(f"x{i}", dt.dtype(a.dtype), a.shape) for i, a in enumerate(inputs)]
    g.output("y", build(g, *tensors))
    return g.program(), inputs


@pytest.mark.parametrize("name", FUSED)
def test_fused_program_matches_interpreter(name):
    program, inputs = fused_program(name)
    # cross entropy's mean over per-row reductions is one kernel with a reduction that
    # varies along a loop, and an empty batch gives kernels with a zero extent: the
    # renderer hands both to the interpreter
    assert native(program) or name in ("cross_entropy", "softmax_empty_batch")
    (got,), (want,) = run_cpu(program, inputs), run_interp(program, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", FUSED)
def test_fused_program_matches_torch(name):
    torch = _torch()
    program, inputs = fused_program(name)
    (got,) = run_cpu(program, inputs)
    want = FUSED[name][2](torch.nn.functional, *map(torch.from_numpy, inputs)).numpy()
    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-5, atol=1e-6)


def test_softmax_with_edge_values_matches_interpreter():
    x = np.array([[1000.0, 1000.0, -1000.0], [-INF, 0.0, 0.0], [NAN, 1.0, 2.0],
                  [INF, 1.0, 2.0], [-INF, -INF, -INF], [3.4e38, -3.4e38, 0.0]], dtype=np.float32)
    g = Graph("softmax_edges")
    g.output("y", softmax(g, g.input("x", "f32", x.shape)))
    (got,), (want,) = run_cpu(g.program(), [x]), run_interp(g.program(), [x])
    assert_close(got, want, dt.float32, ulps=4, inputs=[x.reshape(-1)], what="softmax")


def test_fused_programs_are_one_kernel():
    for name in ("softmax_rows_1000", "layer_norm", "gelu_erf", "relu_mad"):
        program, _ = fused_program(name)
        assert len(pipeline.run(program).kernels) == 1, name


def matmul_program(t: DType, a_shape, b_shape, epilogues) -> Program:
    g = Graph("mm")
    x, c = g.input("a", t, a_shape), g.input("c", t, b_shape[-1:])
    w = g.input("b", t, b_shape)
    wt = g.input("b_t", t, b_shape[::-1])  # the same matrix, stored transposed
    products = {"plain": lambda: x @ w, "relu": lambda: g.maximum(x @ w + c, 0.0),
                "bt": lambda: x @ wt.T, "scaled": lambda: (x @ w) * 2.0}
    for name in epilogues:
        g.output(name, products[name]())
    return g.program()


def check_matmul(t: DType, a_shape, b_shape, epilogues) -> None:
    """Matmuls may run through BLAS, whose f32 sums are f32 (the ISA says f64): results must
    be within the forward error bound ``k eps sum|a||b|`` of the interpreter's."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal(a_shape).astype(t.storage)
    b = rng.standard_normal(b_shape).astype(t.storage)
    c = rng.standard_normal(b_shape[-1:]).astype(t.storage)
    inputs = [a, c, b, np.ascontiguousarray(b.T)]
    program = matmul_program(t, a_shape, b_shape, epilogues)
    got, want = run_cpu(program, inputs), run_interp(program, inputs)
    scale = (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))).reshape(-1)
    bound = (a_shape[-1] + 2) * np.finfo(t.storage).eps * (scale + np.abs(c).max()) * 2
    for name, g, w in zip(epilogues, got, want):
        error = np.abs(g.astype(np.float64) - w)
        assert (error <= bound).all(), f"{name}: error up to {error.max()}, first values " \
            f"cpu {g[:4]} interp {w[:4]}"


MATMUL_SHAPES = [((17, 33), (33, 9)), ((3, 8, 5), (5, 7)), ((1, 4), (4, 1)), ((64, 1), (1, 3)),
                 ((4, 64, 200), (200, 96))]


@pytest.mark.parametrize("name", ["f32", "f64"])
@pytest.mark.parametrize("shapes", MATMUL_SHAPES)
@pytest.mark.parametrize("epilogue", ["plain", "relu", "bt", "scaled"])
def test_matmul(name, shapes, epilogue):
    check_matmul(dt.dtype(name), *shapes, [epilogue])


def uses_sgemm(program: Program) -> bool:
    """Does the CPU backend hand one of the program's contractions to BLAS in f32?"""
    _, gemms = gemm.split(pipeline.run(program))
    return any(g.dtype == "f32" for group in gemms.values() for g in group)


def test_f32_matmul_is_within_the_gemm_error_bound():
    """Float contractions accumulate in an implementation-defined order and precision (at
    least the operands'; docs/isa.md); BLAS sums f32 in f32. The result must stay within
    the classic bound k * eps * sum |a_i b_i| of the exact value, and non-finite inputs
    must give non-finite outputs."""
    g = Graph("mm_bound")
    g.output("y", g.input("a", "f32", (64, 300)) @ g.input("b", "f32", (300, 48)))
    assert uses_sgemm(g.program())
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((64, 300)) * 10 ** rng.uniform(-3, 3, (64, 300))).astype(np.float32)
    b = rng.standard_normal((300, 48)).astype(np.float32)
    a[0, 0] = np.inf
    a[1, 5] = np.nan
    (got,) = run_cpu(g.program(), [a, b])
    got = got.reshape(64, 48).astype(np.float64)
    with np.errstate(invalid="ignore"):  # the inf and NaN rows
        exact = a.astype(np.float64) @ b.astype(np.float64)
        bound = 300 * np.finfo(np.float32).eps * (np.abs(a.astype(np.float64)) @ np.abs(b))
    finite = np.isfinite(exact)
    assert (np.abs(got[finite] - exact[finite]) <= bound[finite] + 1e-30).all()
    assert not np.isfinite(got[~finite]).any()


@pytest.mark.parametrize("epilogues", [["plain", "relu"], ["plain", "bt"], ["bt", "relu"]])
def test_several_matmuls_in_one_program(epilogues):
    check_matmul(dt.float32, (17, 33), (33, 9), epilogues)


@pytest.mark.parametrize("name", ["i8", "u8", "i32", "i64", "f16", "bf16"])
def test_matmul_in_other_dtypes_runs_the_generated_loops(name):
    """Ints wrap; floats accumulate in f64 and round once (bf16: 1 ulp, see
    test_sum_of_narrow_floats_rounds_once)."""
    t = dt.dtype(name)
    rng = np.random.default_rng(seed_of("mm", name))
    g = Graph("mm_" + name)
    a, b = g.input("a", t, (9, 40)), g.input("b", t, (40, 7))
    g.output("y", a @ b)
    g.output("yt", a @ g.input("bt", t, (7, 40)).T)
    inputs = [random_array(p, rng, edges=False) for p in g.program().params if p.kind == "in"]
    if t.is_int:  # products big enough to wrap
        inputs = [(x.astype(np.int64) * 3 + 1).astype(t.storage) for x in inputs]
    got, want = run_cpu(g.program(), inputs), run_interp(g.program(), inputs)
    for g_, w in zip(got, want):
        assert_close(g_, w, t, ulps=1 if t is dt.bfloat16 else 0, what=f"matmul {name}")


@pytest.mark.parametrize("name", ["f16", "bf16"])
@pytest.mark.parametrize("transposed", [False, True])
def test_half_precision_operands_of_a_float32_product_make_a_mixed_precision_gemm(
        name, transposed):
    """A float32 product of f16/bf16 operands widened by casts (what PyTorch's
    half-precision ``mm`` lowers to) fuses the casts into the contraction, which is then one
    GEMM of the half-precision matrices into float32 (no widened copies of them); the
    epilogue rounds once. Within the GEMM bound of the exact products, plus the rounding:
    one ulp of the result's dtype."""
    t = dt.dtype(name)
    g = Graph("mm_mixed_" + name)
    a = g.input("a", t, (33, 70))
    b = g.input("bt", t, (17, 70)).T if transposed else g.input("b", t, (70, 17))
    g.output("y", g.cast(g.cast(a, "f32") @ g.cast(b, "f32"), t))
    lowered, gemms = gemm.split(pipeline.run(g.program()))
    assert [(x.dtype, x.out) for group in gemms.values() for x in group] == [(name, "f32")]
    assert len(lowered.kernels) == 1  # the epilogue: no kernel widens an operand
    rng = np.random.default_rng(seed_of("mm_mixed", name))
    inputs = [random_array(p, rng, edges=False) for p in g.program().params if p.kind == "in"]
    (got,), (want,) = run_cpu(g.program(), inputs), run_interp(g.program(), inputs)
    assert_close(got, want, t, ulps=1, what=f"mixed-precision matmul {name}")


@pytest.mark.parametrize("name", ["f32", "i32"])
@pytest.mark.parametrize("shapes", [
    ((0, 5), (5, 3)), ((3, 0), (0, 4)),
    ((2, 0, 3), (3, 4)), ((4, 3), (3, 0))])
def test_empty_matmuls(name, shapes):
    t = dt.dtype(name)
    g = Graph("mm_empty")
    g.output("y", g.input("a", t, shapes[0]) @ g.input("b", t, shapes[1]))
    inputs = [np.ones(math.prod(s), dtype=t.storage) for s in shapes]
    (got,), (want,) = run_cpu(g.program(), inputs), run_interp(g.program(), inputs)
    assert same_bits(got, want)
    assert (got == 0).all() and not np.signbit(got.astype(np.float64)).any()





@pytest.mark.parametrize("kind", ["sum", "prod", "max", "argmin"])
@pytest.mark.parametrize("name", ["f32", "i32", "bf16"])
def test_reducing_a_broadcast_value_counts_the_domain_extent(kind, name):
    """A value constant along the reduced axis is reduced as often as the axis is long."""
    t = dt.dtype(name)
    b = ProgramBuilder("broadcast_reduce")
    x = b.input("x", t, (5,))
    out = b.output("y", dt.int64 if kind == "argmin" else t, (5,))
    k = b.kernel((5, 300))
    value = k.reduce(kind, k.load(x, (5, 1), 0, (1, 0)), 1)
    k.store(out, value, strides=(1, 0), shape=(5, 1))
    program = b.build()
    data = storage([1.001, -1.0, 0.1, 3.0, -0.0], t) if t.is_float else \
        np.array([2, -1, 7, 0, 3], dtype=t.storage)
    (got,), (want,) = run_cpu(program, [data]), run_interp(program, [data])
    atol = sum_bound(t, 300 * np.abs(as_float(data, t)), as_float(want, t)) \
        if t.is_float and kind == "sum" else 0.0
    assert_close(got, want, dt.dtype(want.dtype) if name != "bf16" or kind == "argmin"
                 else t, ulps=1 if t.is_float and kind == "prod" else 0, atol=atol,
                 inputs=[data], what=kind)


def test_index_inside_reductions():
    g = Graph("iota")
    x = g.input("x", "f32", (6, 50))
    w = g.cast(g.arange(50, "i32"), "f32")
    g.output("weighted", g.sum(x * w, 1))
    g.output("argmax", g.reduce("argmax", x - w, 1))
    g.output("wrapped", g.sum(g.arange(300, "i8")))
    g.output("rows", g.sum(g.arange(6, "i64").reshape(6, 1) * g.cast(x, "i64"), 1))
    program = g.program()
    assert native(program)
    x0 = (np.random.default_rng(15).standard_normal(300) * 10).astype(np.float32)
    got, want = run_cpu(program, [x0]), run_interp(program, [x0])
    terms = np.abs(x0.astype(np.float64).reshape(6, 50) * np.arange(50))
    assert_close(got[0], want[0], dt.float32, atol=sum_bound(dt.float32, terms.sum(1), want[0]))
    for a, b in zip(got[1:], want[1:]):
        assert same_bits(a, b)


# --- layout -------------------------------------------------------------------------------
@pytest.mark.parametrize("strided", [False, True])
def test_inout_read_modify_write(strided):
    program = rmw_program(strided, total=True)  # x in place, then its row sums
    rng = np.random.default_rng(4)
    x = rng.standard_normal(80).astype(np.float32)
    y = rng.standard_normal(80).astype(np.float32)
    got, want = run_cpu(program, [x, y]), run_interp(program, [x, y])
    assert same_bits(got[0], want[0])  # x, read-modified-written
    magnitudes = np.abs(want[0].astype(np.float64)).reshape(8, 10).sum(1)
    assert_close(got[1], want[1], dt.float32, atol=sum_bound(dt.float32, magnitudes, want[1]))
    if strided:
        untouched = np.ones((8, 10), dtype=bool)
        untouched[1:7, ::2] = False
        assert (got[0].reshape(8, 10)[untouched] == x.reshape(8, 10)[untouched]).all()
    # in place, through the full calling convention
    compiled = hologram.compile(program, backend="cpu")
    inout, total = x.copy(), np.empty(8, dtype=np.float32)
    compiled(inout, y, total)
    assert same_bits(inout, want[0]) and same_bits(total, got[1])


def test_temporaries_in_the_arena():
    """A row sum read column-wise stays materialized; a second stage reuses the arena."""
    g = Graph("arena")
    x = g.input("x", "f32", (16, 16))
    s1 = g.sum(x, 1)  # [16], read below along columns
    y1 = x / s1
    s2 = g.max(y1, 1)
    g.output("y", y1 - s2 + g.sum(y1 * y1, 0))
    program = g.program()
    lowered = pipeline.run(program)
    assert lowered.arena_bytes > 0 and len(lowered.kernels) >= 2
    assert native(program)
    x0 = np.random.default_rng(8).random((16, 16)).astype(np.float32) + 0.5
    (got,), (want,) = run_cpu(program, [x0]), run_interp(program, [x0])
    # First-order propagation of the sum bound (rows of 16: one sequential f32 sum, 15
    # roundings): y1 = x / s1 and s2 within 16u relative, y1 * y1 within 33u, its column
    # sum within 28u more, three final roundings.
    u = UNIT_ROUNDOFF["f32"]
    x64 = x0.astype(np.float64)
    y1 = x64 / x64.sum(1)
    s2 = y1.max(1, keepdims=True)
    squares = (y1 * y1).sum(0)
    atol = u * (16 * (np.abs(y1) + np.abs(s2)) + 61 * squares + 3 * np.abs(want).reshape(16, 16))
    assert_close(got, want, dt.float32, ulps=1, atol=atol.reshape(-1), what="arena")


# --- threads ---------------------------------------------------------------------------------
@pytest.fixture
def pool_spy(monkeypatch):
    """Records the number of chunks of every parallel kernel launch the backend issues."""
    calls = []
    original = threads.run_kernel

    def spy(kernel, pointers, total, grain):
        calls.append(len(threads.chunks(total, grain, threads.num_threads())))
        return original(kernel, pointers, total, grain)

    monkeypatch.setattr(threads, "run_kernel", spy)
    return calls


BIG = 2_000_003


def test_elementwise_results_do_not_depend_on_thread_count(pool_spy):
    g = Graph("big_elementwise")
    a, b = g.input("a", "f32", (BIG,)), g.input("b", "f32", (BIG,))
    g.output("e", g.unary("exp", a))
    g.output("y", a * b + g.unary("sqrt", g.unary("abs", b)))
    g.output("i", g.cast(a * 1000.0, "i32"))
    program = g.program()
    inputs = inputs_for(program, 9)
    with num_threads(1):
        one = run_cpu(program, inputs)
    assert pool_spy == [] or max(pool_spy) == 1
    with num_threads(2):
        two = run_cpu(program, inputs)
        again = run_cpu(program, inputs)
    assert pool_spy and max(pool_spy) == 2, "the pool was not used"
    for x, y, z in zip(one, two, again):
        assert same_bits(x, y) and same_bits(y, z)
    want = run_interp(program, inputs)
    assert_close(two[0], want[0], dt.float32, ulps=2, inputs=inputs[:1], what="exp")
    assert same_bits(two[1], want[1]) and same_bits(two[2], want[2])


def test_grain_weighs_a_looping_rows_arithmetic():
    """A row's work for the pool's grain counts its points, math functions and arithmetic:
    a layer norm's 512 rows of 64 split over two threads, a plain row sum's do not."""
    from hologram.backends.cpu import target as targets

    def only_kernel(graph: Graph):
        program = pipeline.for_target(pipeline.run(graph.program()),
                                      targets.host().capabilities)
        (kernel,) = program.kernels
        return kernel

    g = Graph("row_sums")
    g.output("s", g.sum(g.input("x", "f32", (512, 64)), 1))
    plain = only_kernel(g)
    g = Graph("row_norms")
    x = g.input("x", "f32", (512, 64))
    d = x - g.mean(x, 1, keepdim=True)
    g.output("y", d / g.unary("sqrt", g.mean(d * d, 1, keepdim=True) + 1e-5))
    norm = only_kernel(g)
    assert interpreted._row_work(plain) == 64
    assert interpreted._row_work(norm) == 64 * 3  # 8 arithmetic instructions: 1 + 8 // 4
    native_grain = 1 << 15  # threads.min_chunk_work() with native workers
    for kernel, split in ((plain, False), (norm, True)):
        grain = -(-native_grain // interpreted._row_work(kernel))
        assert (kernel.domain[0] >= 2 * grain) == split


def test_reductions_are_reproducible_across_runs(pool_spy):
    g = Graph("big_reduce")
    x = g.input("x", "f32", (2000, 1000))
    g.output("rows", g.sum(x, 1))
    g.output("amax", g.reduce("argmax", x, 1))
    g.output("all", g.sum(x))
    g.output("cols", g.sum(x, 0))
    program = g.program()
    x0 = np.random.default_rng(10).standard_normal(2_000_000).astype(np.float32)
    results = {}
    for n in (1, 2):
        with num_threads(n):
            runs = [run_cpu(program, [x0]) for _ in range(3)]
        for r in runs[1:]:
            assert all(same_bits(a, b) for a, b in zip(runs[0], r)), n
        results[n] = runs[0]
    assert max(pool_spy) == 2, "the pool was not used"
    for a, b in zip(results[1], results[2]):
        assert same_bits(a, b)
    want = run_interp(program, [x0])
    magnitudes = np.abs(x0.astype(np.float64)).reshape(2000, 1000)
    scales = {"rows": magnitudes.sum(1), "all": magnitudes.sum(), "cols": magnitudes.sum(0)}
    for out, a, b in zip(("rows", "amax", "all", "cols"), results[2], want):
        atol = sum_bound(dt.float32, scales[out], b) if out in scales else 0.0
        assert_close(a, b, dt.dtype(b.dtype) if out != "amax" else dt.int64, atol=atol,
                     what=out)


def test_big_read_modify_write_on_threads(pool_spy):
    b = ProgramBuilder("big_rmw")
    x = b.buffer("x", "i32", (BIG,), "inout")
    k = b.kernel((BIG,))
    k.store(x, k.add(k.mul(k.load(x), 3), k.index(0, "i32")))
    program = b.build()
    data = np.random.default_rng(13).integers(-1000, 1000, BIG).astype(np.int32)
    with num_threads(2):
        (got,) = run_cpu(program, [data])
    assert max(pool_spy) == 2
    assert same_bits(got, data * 3 + np.arange(BIG, dtype=np.int32))


def test_concurrent_callers_from_python_threads():
    """Two Python threads share the pool (one of them runs its chunks inline)."""
    g = Graph("concurrent")
    a = g.input("a", "f32", (BIG,))
    g.output("y", g.unary("sqrt", g.unary("abs", a)) * 2.0 + a)
    program = g.program()
    inputs = inputs_for(program, 14)
    (want,) = run_cpu(program, inputs)
    results, errors = [], []

    def work():
        try:
            for _ in range(3):
                results.append(run_cpu(program, inputs)[0])
        except BaseException as exc:  # reported below
            errors.append(exc)

    with num_threads(2):
        workers = [threading.Thread(target=work) for _ in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert not errors and len(results) == 6
    assert all(same_bits(r, want) for r in results)


@pytest.mark.parametrize("nthreads", [1, 2])
def test_split_sums_from_concurrent_python_threads(nthreads):
    """Each calling thread has its own partials' scratch: two threads summing different
    data through one compiled split reduction each get their own sums, on one worker
    thread (partials run on the caller) and on two."""
    n = 1 << 18
    g = Graph("split_sum")
    g.output("s", g.sum(g.input("x", "f32", (n,))))
    compiled = hologram.compile(g.program(), backend="cpu")
    assert sum(split_parts(k) for k in pipeline.run(g.program()).kernels) > 1
    rng = np.random.default_rng(3)
    data = [rng.random(n, dtype=np.float32) + k for k in range(2)]
    with num_threads(nthreads):
        want = [compiled(x) for x in data]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for _ in range(200):
                got = compiled(data[k])
                assert same_bits(got, want[k]), (k, got, want[k])
        except BaseException as exc:  # reported below
            errors.append(exc)

    with num_threads(nthreads):
        workers = [threading.Thread(target=work, args=(k,)) for k in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=60)
    assert not errors and not any(w.is_alive() for w in workers)


def test_read_only_and_reshaped_arrays():
    g = Graph("arrays")
    x = g.input("x", "f32", (6, 4))
    g.output("y", x * 2.0)
    compiled = hologram.compile(g.program(), backend="cpu")
    data = np.arange(24, dtype=np.float32)
    frozen = np.frombuffer(data.tobytes(), dtype=np.float32)  # read-only
    assert not frozen.flags.writeable
    out = np.zeros((2, 12), dtype=np.float32)  # any shape of the right size
    compiled(frozen.reshape(4, 6), out)
    assert out.reshape(-1).tolist() == (data * 2).tolist()


# --- generated code -----------------------------------------------------------------------
def assembly(program: Program) -> str:
    lowered = pipeline.run(program)
    symbols = {k.name: f"asm_{k.name}" for k in lowered.kernels}
    return llvm.assembly(render(lowered, symbols))


@pytest.mark.skipif(not llvm.has_feature("avx2"), reason="the host has no AVX2: packed "
                    "vector code is not expected")
@pytest.mark.parametrize("op", ["add", "exp"])
def test_kernels_use_packed_vector_instructions(op):
    g = Graph(f"vector_{op}")
    a, b = g.input("a", "f32", (4096,)), g.input("b", "f32", (4096,))
    g.output("y", a + b if op == "add" else g.unary("exp", a))
    asm = assembly(g.program())
    packed = re.findall(r"^\s*v\w*ps\s.*%[yz]mm\d+", asm, re.M)
    assert packed, f"no packed single-precision instruction on ymm/zmm:\n{asm[:3000]}"
    if op == "add":
        assert re.search(r"^\s*vaddps\s.*%[yz]mm", asm, re.M)
    calls = re.findall(r"^\s*(?:call|jmp)\w*\s+(\S+)", asm, re.M)
    assert not [c for c in calls if "exp" in c.lower()], calls


@pytest.mark.skipif(not llvm.has_feature("avx2"), reason="the host has no AVX2: packed "
                    "vector code is not expected")
def test_short_rows_are_vectorized_before_they_are_unrolled():
    """A softmax gradient's rows of 32: the loop that writes a row after its sum has a
    constant length LLVM unrolls whole before its loop vectorizer runs, and the scalar
    code it left (32 ``vmovss`` stores a row, 50 µs for 2048 rows instead of 22) was not
    put back into vectors. Vectorized first, the row is two packed stores. A transposing
    copy, whose stores step by a row, keeps LLVM's unrolling."""
    g = Graph("softmax_grad")
    p, dy = g.input("p", "f32", (64, 32)), g.input("dy", "f32", (64, 32))
    g.output("dx", p * (dy - g.sum(p * dy, axes=1, keepdim=True)))
    asm = assembly(g.program())
    assert not re.findall(r"^\s*vmovss\s+%xmm\d+, -?\d*\(", asm, re.M), asm[:3000]
    assert re.search(r"^\s*vmovups\s+%[yz]mm\d+, -?\d*\(", asm, re.M)
    program = g.program()
    inputs = inputs_for(program, seed=2)
    (got,), (expected,) = run_cpu(program, inputs), execute(program, inputs)
    # float sums agree within docs/isa.md's bound, not bit for bit
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)

    t = Graph("transpose")
    x = t.input("x", "f32", (64, 32))
    t.output("y", x.permute(1, 0) + 1.0)
    assert not _loop_hints(t)


def _loop_hints(g: Graph) -> list[str]:
    """The block of each back edge that carries a loop ID, in the rendered (unoptimized) IR."""
    lowered = pipeline.run(g.program())
    ir = render(lowered, {k.name: f"ir_{k.name}" for k in lowered.kernels})
    nodes = dict(re.findall(r"^!(\d+) = (.*)$", ir, re.M))
    loops = re.findall(r"^(\S+):\n(?:  .*\n)*?  br label %\"\S+\", !llvm.loop !(\d+)$", ir, re.M)
    # Loop IDs carrying more than parallel_accesses (which every loop of a kernel without
    # dependences through memory has)
    hinted = [block for block, loop_id in loops
              if any("parallel_accesses" not in nodes[n]
                     for n in re.findall(r"!(\d+)", nodes[loop_id])[1:])]
    if hinted:
        assert f'!"llvm.loop.interleave.count", i32 {MATH_INTERLEAVE}' in ir
    return hinted


POW_OF_POW = """
import sys
import numpy as np
import hologram as hg

dtype, shape = np.dtype(sys.argv[1]), tuple(map(int, sys.argv[2].split(",")))
ex = hg.Executor()
x = np.full(shape, 2.0, dtype)
got = hg.jit(lambda a: (a ** 2.5) ** 1.5)(ex.from_numpy(x)).to_numpy()
# broadcast into a larger grid: the same chain, uniform inside the grid loops
z = np.arange(12 * 7, dtype=dtype).reshape(12, 7)
pow_plus = hg.jit(lambda a, b: (a ** 2.5) ** 1.5 + b)
big = pow_plus(ex.from_numpy(x.reshape(1, 1)), ex.from_numpy(z)).to_numpy()
want = np.power(np.power(x.astype(np.float64), 2.5), 1.5)
np.testing.assert_allclose(got, want, rtol=1e-6)
np.testing.assert_allclose(big, want.reshape(-1)[0] + z, rtol=1e-6)
print("ok")
"""


@pytest.mark.parametrize("shape", ["1", "1,1"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_uniform_chain_of_math_compiles(dtype, shape, tmp_path):
    """``(a ** 2.5) ** 1.5`` on one element never finished compiling: every value sat in the
    grid loop, uniform, and LLVM's loop vectorizer's uniformity analysis walked the chain's
    shared operands once per path. Values that vary along no inner dimension are now
    computed before the grid loop (render._hoist). In a child process with a time limit,
    so that a regression fails instead of hanging the run."""
    env = {**os.environ, "HOLOGRAM_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", POW_OF_POW, dtype, shape], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_only_innermost_loops_with_math_ask_for_interleaving():
    g = Graph("flat")
    a, b = g.input("a", "f32", (4096,)), g.input("b", "f32", (4096,))
    g.output("y", g.unary("exp", a) * b)
    g.output("z", a + b)
    assert len(_loop_hints(g)) == 1  # one kernel, one loop: the fused exp * b and a + b

    g = Graph("plain")
    a, b = g.input("a", "f32", (4096,)), g.input("b", "f32", (4096,))
    g.output("y", a * b + 1.0)
    assert _loop_hints(g) == []

    def rows(n: int) -> list[str]:  # softmax's denominator: exp summed along rows of n
        g = Graph("rows")
        g.output("s", g.sum(g.unary("exp", g.input("x", "f32", (64, n))), axes=1))
        return _loop_hints(g)

    # A row of a whole block and 1000 more terms: the sum's lane loops (hinted to
    # vectorize: one per vector of loops.LANES in whole blocks and again in the short
    # block, plus one for its further vectors, see render._blocks) and its tail loop
    groups = loops.LANES // loops.VECTOR
    assert rows(loops.BLOCK + 1000) == [
        "d-2.body", *(f"d-2.body.{i}" for i in range(1, 2 * groups + 2))]
    # A constant row has only the loops its terms reach: no whole block in 1000 terms
    # (1000 % LANES = 40: one further vector and a tail), no further vector in 970 (15
    # groups and a tail of 10), no short block's groups nor vector in BLOCK + 10.
    assert rows(1000) == ["d-2.body", *(f"d-2.body.{i}" for i in range(1, groups + 2))]
    assert rows(970) == ["d-2.body", *(f"d-2.body.{i}" for i in range(1, groups + 1))]
    assert rows(loops.BLOCK + 10) == [
        "d-2.body", *(f"d-2.body.{i}" for i in range(1, groups + 1))]


def test_float_max_and_min_reductions_keep_more_vectors_in_flight():
    """Their innermost loop asks LLVM for EXTREMUM_INTERLEAVE vectors per iteration with
    ``llvm.maximum``/``minimum``, FAST_EXTREMUM_INTERLEAVE with ``maxnum``/``minnum`` and
    integer reductions where the target has unsigned vector max/min of the width; an
    integer max and a sum ask for none (the sum's lanes are its own, see _blocks)."""
    def step(kind: str, dtype: str, target: str) -> tuple[str, int | None]:
        g = Graph(f"{kind}_{dtype}")
        g.output("r", g.reduce(kind, g.input("x", dtype, (64, 1000)), axes=1))
        lowered = pipeline.run(g.program())
        ir = render(lowered, {k.name: f"ir_{k.name}" for k in lowered.kernels},
                    cpu_targets.named(target))
        count = re.search(r'!"llvm.loop.interleave.count", i32 (\d+)', ir)
        fast = re.search(r"call nnan nsz \w+ @\"?llvm\.(max|min)num", ir) is not None
        return ("fast" if fast else "exact"), (int(count.group(1)) if count else None)

    exact, fast = ("exact", EXTREMUM_INTERLEAVE), ("fast", FAST_EXTREMUM_INTERLEAVE)
    for target, f32, f64 in (("x86-64", exact, exact), ("x86-64-v3", fast, exact),
                             ("x86-64-v4", fast, fast), ("neoverse-n1", fast, exact)):
        assert step("max", "f32", target) == step("min", "f16", target) == f32, target
        assert step("min", "f64", target) == f64, target
    assert step("max", "i32", "x86-64-v4") == step("sum", "f32", "x86-64-v4") == ("exact", None)


def test_kernels_without_dependences_through_memory_have_parallel_loops():
    """Every loop of such a kernel is marked parallel, over one access group holding every
    load and store, so that LLVM vectorizes it without runtime overlap checks (which an
    in-place update fails); a kernel that reads a buffer through two addressings, or
    gathers, is not marked."""
    def kernels(g: Graph) -> list[bool]:
        return [independent_iterations(k) for k in pipeline.run(g.program()).kernels]

    g = Graph("flat")
    a, b = g.input("a", "f32", (64, 100)), g.input("b", "f32", (100,))
    g.output("y", g.unary("exp", a) * b + 1.0)
    assert kernels(g) == [True]
    lowered = pipeline.run(g.program())
    ir = render(lowered, {k.name: f"ir_{k.name}" for k in lowered.kernels})
    group = re.search(r"^!(\d+) = distinct !\{\}$", ir, re.M).group(1)
    accesses = re.findall(r"^  (?:%\S+ = load|store) .*$", ir, re.M)
    assert accesses and all(line.endswith(f"!llvm.access.group !{group}")
                            for line in accesses if "i8**" not in line)
    assert f'!{{ !"llvm.loop.parallel_accesses", !{group} }}' in ir

    g = Graph("transposed")  # x[i, j] and x[j, i]: iterations meet through memory
    x = g.input("x", "f32", (64, 64))
    g.output("y", x + x.permute(1, 0))
    assert kernels(g) == [False]
    g = Graph("rows")  # a reduction's store writes each row from the row's one point
    g.output("s", g.sum(g.input("x", "f32", (64, 100)), axes=1))
    assert kernels(g) == [True]
    g = Graph("lookup")
    t, k = g.input("t", "f32", (10, 8)), g.input("k", "i32", (5, 1))
    g.output("y", g.gather(t, (k, 1), (5, 8)))
    assert kernels(g) == [False]


def test_each_kernels_loops_are_parallel_over_its_own_access_group():
    """In a program of several kernels, the loops of each name that kernel's own group:
    metadata nodes are shared by content, and the groups (distinct, without operands) had
    been one, so only the first kernel's loops were parallel for LLVM (the others got
    runtime overlap checks: a transformer's softmax kernel 77 -> 67 µs)."""
    g = Graph("two")
    x = g.input("x", "f32", (64, 100))
    g.output("rows", g.sum(g.unary("exp", x), axes=1))
    g.output("cols", g.reduce("max", x, axes=0))
    g.output("y", g.unary("exp", x.permute(1, 0)) * 2.0)
    lowered = pipeline.run(g.program())
    assert [independent_iterations(k) for k in lowered.kernels].count(True) >= 2
    ir = render(lowered, {k.name: f"ir_{k.name}" for k in lowered.kernels})
    nodes = dict(re.findall(r"^!(\d+) = (.*)$", ir, re.M))
    parallel = {n: re.search(r"!(\d+) }$", body).group(1) for n, body in nodes.items()
                if '"llvm.loop.parallel_accesses"' in body}
    groups = []
    for function in re.split(r"^define ", ir, flags=re.M)[1:]:
        own = set(re.findall(r"!llvm.access.group !(\d+)", function))
        if not own:
            continue
        assert len(own) == 1
        loops = re.findall(r"!llvm.loop !(\d+)", function)
        named = {parallel[op] for n in loops
                 for op in re.findall(r"!(\d+)", nodes[n]) if op in parallel}
        assert named == own, function.splitlines()[0]
        groups += own
    assert len(groups) >= 2 and len(set(groups)) == len(groups)


@pytest.mark.parametrize("shape", [(1,), (7,), (1000,), (257, 129), (3, 0)])
@pytest.mark.parametrize("op", ["vector_add", "vector_mul", "exp", "relu", "sigmoid"])
def test_in_place_updates_match_numpy(op, shape):
    """The parallel loops' premise: an output at an input's address (SDK out=)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    x.flat[:3] = [np.nan, -0.0, np.inf][:x.size]
    y = rng.standard_normal(shape).astype(np.float32)
    ex = hologram.Executor("cpu")
    a, b = ex.from_numpy(x), ex.from_numpy(y)
    fn = getattr(hologram.ops, op)
    expected = fn(a, b).to_numpy() if op.startswith("vector") else fn(a).to_numpy()
    result = fn(a, b, out=a) if op.startswith("vector") else fn(a, out=a)
    assert result is a
    np.testing.assert_array_equal(a.to_numpy(), expected)


# --- cache and fallback -----------------------------------------------------------------------
CHILD = """
import json, sys
import numpy as np
import hologram
from hologram.frontend.graph import Graph

g = Graph("cached")
x = g.input("x", "f32", (1000,))
g.output("y", g.maximum(x * 3.0 - 1.0, 0.0) + g.unary("exp", x))
c = hologram.compile(g.program(), backend="cpu")
x0 = np.linspace(-2, 2, 1000, dtype=np.float32)
y = c(x0)
want = np.maximum(x0 * np.float32(3) - np.float32(1), 0) + np.exp(x0.astype(np.float64))
info = hologram.cache_info()
print(json.dumps({"disk_hits": info["disk_hits"], "misses": info["misses"],
                  "backend": c.backend,
                  "close": bool(np.allclose(y, want, rtol=1e-6, atol=0))}))

"""


def _child(cache_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOLOGRAM_")}
    env["HOLOGRAM_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_artifact_round_trips_through_the_disk_cache_in_a_new_process(tmp_path):
    first = _child(tmp_path)
    assert first == {"disk_hits": 0, "misses": 1, "backend": "cpu", "close": True}
    assert len(list(tmp_path.rglob("*.bin"))) >= 1
    second = _child(tmp_path)
    assert second == {"disk_hits": 1, "misses": 0, "backend": "cpu", "close": True}


def test_compiling_is_deterministic():
    """Artifacts are pure functions of the program and the target (the cache relies on it);
    kernel symbols do not depend on names."""
    program = pipeline.run(fused_program("layer_norm")[0])
    backend = CpuBackend()
    assert backend.compile(program) == backend.compile(program)
    renamed = Program("other", program.buffers, program.kernels)
    assert backend.compile(renamed) == backend.compile(program)
    assert "cpu=" in backend.target()


def fallback_program() -> Program:
    """One kernel the renderer cannot handle (a row of sums, then their max, per grid
    point) between two that it can, connected through temporaries."""
    b = ProgramBuilder("fallback")
    x = b.input("x", "f32", (4, 5, 6))
    t = b.temp("t", "f32", (4, 5, 6))
    m = b.output("m", "f32", (4,))
    y = b.output("y", "f32", (4, 5, 6))
    k0 = b.kernel((4, 5, 6))
    k0.store(t, k0.mul(k0.load(x), 2.0))
    k1 = b.kernel((4, 5, 6))
    rows = k1.reduce("sum", k1.load(t), 2)  # [4, 5, 1]: varies along a loop dimension
    k1.store(m, k1.reduce("max", k1.mul(rows, rows), 1), strides=(1, 0, 0), shape=(4, 1, 1))
    k2 = b.kernel((4, 5, 6))
    k2.store(y, k2.add(k2.load(t, (4, 5, 6), 119, (-30, -6, -1)), 1.0))
    return b.build()


def test_dump_dir_gets_the_loop_plan_llvm_ir_and_assembly(tmp_path, monkeypatch):
    monkeypatch.setenv("HOLOGRAM_DUMP_DIR", str(tmp_path / "dump"))
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path / "cache"))
    g = Graph("dumped")
    g.output("s", g.sum(g.input("x", "f32", (3000,))))
    hologram.compile(g.program(), backend="cpu")
    stages = [f.name.split(".", 2)[2] for f in sorted((tmp_path / "dump").iterdir())]
    passes = (*pipeline.PIPELINE, *pipeline.TARGET_PASSES)
    assert stages == [f"{name}.atlas" for name, _ in passes] + \
        ["library_calls", "loops", "cpu.ll", "cpu.opt.ll", "cpu.s"]
    plan = next((tmp_path / "dump").glob("*.loops")).read_text()
    assert f"x{loops.LANES} lanes per block of {loops.BLOCK}, blocks in f64" in plan, plan


def test_unsupported_kernels_run_on_the_interpreter():
    program = fallback_program()
    lowered = pipeline.run(program)
    reasons = [unsupported(k) for k in lowered.kernels]
    assert any(reasons) and not all(reasons), reasons
    x0 = np.random.default_rng(12).standard_normal(120).astype(np.float32)
    interpreted.reset_interpreted_stats()
    with pytest.warns(interpreted.InterpretedKernelWarning, match="varies along a loop"):
        got = run_cpu(program, [x0])
    want = run_interp(program, [x0])
    for a, b in zip(got, want):
        assert same_bits(a, b)
    counts = interpreted.interpreted_stats()
    assert counts == {"a reduction result varies along a loop dimension": 1}, counts
    # and again from the disk cache (the artifact carries the program text)
    hologram.clear_cache(disk=False)
    before = hologram.cache_info()["disk_hits"]
    again = run_cpu(program, [x0])
    assert hologram.cache_info()["disk_hits"] == before + 1
    for a, b in zip(again, want):
        assert same_bits(a, b)


# Random programs: tests/conformance/test_random.py runs them on every backend, cpu included.


@pytest.mark.parametrize("case", ["softmax", "reductions", "matmul_k0", "broadcast"])
def test_zero_extent_domains_match_the_interpreter(case):
    """Kernels whose domain has a zero extent store nothing or reduce empty extents; the
    cpu backend once read empty buffers there (hoisted loads) and crashed the process."""
    from hologram.frontend import functional
    from hologram.frontend.graph import Graph

    g = Graph(case)
    if case == "softmax":
        g.output("y", functional.softmax(g.input("x", "f32", (3, 0)), 1))
        args = [np.empty((3, 0), np.float32)]
    elif case == "reductions":
        x = g.input("x", "f64", (4, 0, 2))
        g.output("s", g.sum(x, 1))
        g.output("m", g.max(x, (1, 2)))
        args = [np.empty((4, 0, 2))]
    elif case == "matmul_k0":
        g.output("y", g.input("a", "f32", (3, 0)) @ g.input("b", "f32", (0, 5)) + 1.0)
        args = [np.empty((3, 0), np.float32), np.empty((0, 5), np.float32)]
    else:
        g.output("y", g.input("a", "i32", (0, 7)) + g.input("b", "i32", (7,)))
        args = [np.empty((0, 7), np.int32), np.arange(7, dtype=np.int32)]
    program = g.program()
    want = hologram.compile(program, backend="interp")(*args)
    got = hologram.compile(program, backend="cpu")(*args)
    for w, o in zip(want if isinstance(want, tuple) else (want,),
                    got if isinstance(got, tuple) else (got,)):
        assert w.shape == o.shape
        assert same_bits(w, o)
