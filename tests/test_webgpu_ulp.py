"""The f32 math functions on the webgpu backend against float64 NumPy rounded to f32: the
largest error in ulps stays within what docs/webgpu.md reports (measured there with
``SAMPLES = 1 << 16``; CI runs fewer)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from conformance.numerics import ulp_distance

import hologram
import hologram as hg
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
    "sin": (np.sin, [_uniform(-1e4, 1e4), _uniform(-4, 4), _magnitudes(-30, 0)], 1),
    "cos": (np.cos, [_uniform(-1e4, 1e4), _uniform(-4, 4)], 1),
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
    normal = np.isfinite(want) & (np.abs(want) >= np.finfo(np.float32).tiny)
    ulps = ulp_distance(got[normal], want[normal], dt.float32)
    worst = int(ulps.argmax())
    print(f"{name}: max {int(ulps.max())} ulp at x = {x[normal][worst]!r}, mean "
          f"{ulps.mean():.3f}, {normal.sum()} inputs")
    assert int(ulps.max()) <= bound, (name, x[normal][worst], got[normal][worst],
                                      want[normal][worst])
