"""The f32 math functions on the webgpu backend against float64 NumPy rounded to f32: the
largest error in ulps stays within what docs/webgpu.md reports (measured there with
``SAMPLES = 1 << 16``; CI runs fewer). On an adapter that flushes subnormals (its probe
says so), a result may instead be the function's value at the input flushed to a zero
of its sign: functions lose subnormal inputs there (docs/webgpu.md)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from conformance.numerics import float_edges, flush, ulp_distance

import hologram
import hologram as hg
from hologram.backends.webgpu import device as devices
from hologram.backends.webgpu.backend import WebGpuBackend
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder

pytestmark = pytest.mark.skipif(
    not WebGpuBackend.is_available() and not os.environ.get("HOLOGRAM_REQUIRE_WEBGPU"),
    reason="no WebGPU adapter (apt-get install mesa-vulkan-drivers libvulkan1)")

SAMPLES = 1 << 12  # per input range
#: function -> (float64 reference, its input ranges, the bound docs/webgpu.md states)
_erf = np.vectorize(math.erf)


def _uniform(lo, hi):
    return lambda rng: rng.uniform(lo, hi, SAMPLES)


def _magnitudes(lo, hi, signs=True):
    def make(rng):
        m = 10.0 ** rng.uniform(lo, hi, SAMPLES)
        return m * rng.choice([-1.0, 1.0], SAMPLES) if signs else m
    return make


FUNCTIONS = {
    "exp": (np.exp, [_uniform(-104, 89), _magnitudes(-30, 1.9)], 1),
    "exp2": (np.exp2, [_uniform(-150, 128), _magnitudes(-30, 2)], 1),
    "expm1": (np.expm1, [_uniform(-20, 89), _magnitudes(-30, 1)], 1),
    "log": (np.log, [_magnitudes(-45, 38, False), _uniform(0.5, 2)], 1),
    "log2": (np.log2, [_magnitudes(-45, 38, False), _uniform(0.5, 2)], 1),
    "log1p": (np.log1p, [_magnitudes(-30, 38, False), _uniform(-0.9, 1)], 1),
    "tanh": (np.tanh, [_uniform(-10, 10), _magnitudes(-30, 1)], 6),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), [_uniform(-100, 100), _magnitudes(-30, 1.5)],
                2),
    "erf": (_erf, [_uniform(-5, 5), _magnitudes(-30, 0.6)], 5),
    "sin": (np.sin, [_uniform(-1e4, 1e4), _uniform(-4, 4), _magnitudes(-30, 0),
                     _magnitudes(4, 38.5)], 1),
    "cos": (np.cos, [_uniform(-1e4, 1e4), _uniform(-4, 4), _magnitudes(4, 38.5)], 1),
    "sqrt": (np.sqrt, [_magnitudes(-45, 38, False)], 0),
    "rsqrt": (lambda x: 1 / np.sqrt(x), [_magnitudes(-37, 38, False)], 1),
}


@pytest.fixture(scope="module")
def ex():
    with hg.Executor("webgpu") as executor:
        yield executor


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_math_function_error_in_ulps(ex, name):
    reference, ranges, bound = FUNCTIONS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    with np.errstate(over="ignore"):
        x = np.concatenate([make(rng) for make in ranges]).astype(np.float32)
    x = x[np.isfinite(x)]
    b = ProgramBuilder(f"ulp_{name}")
    xi = b.input("x", "f32", (x.size,))
    yo = b.output("y", "f32", (x.size,))
    k = b.kernel((x.size,))
    k.store(yo, k.unary(name, k.load(xi)))
    xb, yb = ex.from_numpy(x), ex.empty(x.size)
    hologram.compile(b.build(), backend="webgpu").launch((xb.handle, yb.handle))
    got = yb.to_numpy()
    with np.errstate(all="ignore"):
        want = reference(x.astype(np.float64)).astype(np.float32)
        if devices.get("webgpu").flushes_subnormals:
            flushed = reference(flush(x, dt.float32).astype(np.float64)).astype(np.float32)
            closer = ulp_distance(got, flushed, dt.float32) < ulp_distance(got, want,
                                                                          dt.float32)
            want = np.where(closer, flushed, want)  # log(0) = -inf: not counted
    normal = np.isfinite(want) & (np.abs(want) >= np.finfo(np.float32).tiny)
    ulps = ulp_distance(got[normal], want[normal], dt.float32)
    worst = int(ulps.argmax())
    print(f"{name}: max {int(ulps.max())} ulp at x = {x[normal][worst]!r}, mean "
          f"{ulps.mean():.3f}, {normal.sum()} inputs")
    assert int(ulps.max()) <= bound, (name, x[normal][worst], got[normal][worst],
                                      want[normal][worst])


# --- pow: exp2(y log2|x|) in double-f32 words (hologram/backends/webgpu/mathlib.py) ------
def _pow_inputs(rng) -> tuple[np.ndarray, np.ndarray]:
    """Pairs whose y log2|x| spans the whole result range (overflow and subnormal results
    included), bases near 1 with large exponents, small bases and exponents, negative
    bases with integer exponents."""
    x = 2.0 ** rng.uniform(-149, 128, SAMPLES)
    y = rng.uniform(-152, 129, SAMPLES) / np.log2(x)
    near = 1 + rng.uniform(-1e-3, 1e-3, SAMPLES)
    xs = [x, near, rng.uniform(0, 10, SAMPLES), -rng.uniform(0, 4, SAMPLES)]
    ys = [y, rng.uniform(-1e5, 1e5, SAMPLES), rng.uniform(-10, 10, SAMPLES),
          rng.integers(-60, 60, SAMPLES)]
    return (np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.float32))


def _run_pow(ex, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    b = ProgramBuilder("ulp_pow")
    xi, yi = b.input("x", "f32", (x.size,)), b.input("y", "f32", (x.size,))
    zo = b.output("z", "f32", (x.size,))
    k = b.kernel((x.size,))
    k.store(zo, k.binary("pow", k.load(xi), k.load(yi)))
    xb, yb, zb = ex.from_numpy(x), ex.from_numpy(y), ex.empty(x.size)
    hologram.compile(b.build(), backend="webgpu").launch((xb.handle, yb.handle, zb.handle))
    return zb.to_numpy()


def _pow_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.power(x.astype(np.float64), y.astype(np.float64)).astype(np.float32)


def test_pow_error_in_ulps(ex):
    """Within 1 ulp of float64 pow rounded to f32, subnormal results included (counted in
    units of the smallest subnormal, where the distance is the same count)."""
    x, y = _pow_inputs(np.random.default_rng(7))
    got, want = _run_pow(ex, x, y), _pow_reference(x, y)
    assert not np.isnan(want).any()
    ulps = ulp_distance(got, want, dt.float32)
    normal = np.isfinite(want) & (np.abs(want) >= np.finfo(np.float32).tiny)
    worst = int(ulps.argmax())
    print(f"pow: max {int(ulps.max())} ulp at ({x[worst]!r}, {y[worst]!r}), max "
          f"{int(ulps[normal].max())} on normal results, mean {ulps.mean():.3f}, "
          f"{x.size} pairs, {int((~normal & np.isfinite(want) & (want != 0)).sum())} "
          "subnormal results")
    assert int(ulps.max()) <= 1, (x[worst], y[worst], got[worst], want[worst])


def test_pow_special_values_are_the_c99_ones(ex):
    """Every pair of edge values (zeros, infinities, NaN, ±1, subnormals, the largest
    finite values, odd, even and non-integer exponents): NaN where float64 pow gives NaN,
    the same bits where the result is exact (zeros, infinities, 1, exact powers), within
    1 ulp otherwise."""
    info = np.finfo(np.float32)
    edges = np.array(float_edges(dt.float32) + [
        4.0, -4.0, 7.0, -7.0, 0.25, -0.75, 1 + info.eps, 1 - info.epsneg, -1 - info.eps,
        2.0 ** 24, 2.0 ** 24 + 2, -(2.0 ** 24 + 2), 2.0 ** 31, 2.0 ** 33, -(2.0 ** 33),
        128.0, -149.0, -150.0, info.max, -info.max, 1e-45, -1e-45], np.float32)
    x, y = np.repeat(edges, edges.size), np.tile(edges, edges.size)
    got, want = _run_pow(ex, x, y), _pow_reference(x, y)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), list(zip(x[np.isnan(got) != nan],
                                                         y[np.isnan(got) != nan]))
    with np.errstate(all="ignore"):
        exact = ~nan & (np.power(x.astype(np.float64), y.astype(np.float64))
                        == want.astype(np.float64))
    same = got.view(np.uint32) == want.view(np.uint32)
    assert same[exact].all(), list(zip(x[exact & ~same], y[exact & ~same], got[exact & ~same]))
    assert int(ulp_distance(got[~nan], want[~nan], dt.float32).max()) <= 1
