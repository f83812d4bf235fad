"""webgpu's division and square root, rounded once whatever the driver's own do: WGSL
allows a division 2.5 ulp off and an inexact sqrt (NVIDIA's Vulkan driver gives both).

lavapipe's estimates are exact, so the corrections are also run from estimates made a
few ulps off on purpose (the helpers' source changed for the test): the results must
stay the correctly rounded ones. NumPy's float32 division and sqrt are the reference."""

from __future__ import annotations

import os

import numpy as np
import pytest

import hologram as hg
from hologram.backends.webgpu import bitlib
from hologram.backends.webgpu.backend import WebGpuBackend
from hologram.isa.builder import ProgramBuilder

REQUIRED = os.environ.get("HOLOGRAM_REQUIRE_WEBGPU", "") not in ("", "0")
pytestmark = pytest.mark.skipif(not WebGpuBackend.is_available() and not REQUIRED,
                                reason="no WebGPU adapter (apt-get install "
                                       "mesa-vulkan-drivers libvulkan1, or a GPU driver)")

N = 1 << 16
DIV_ESTIMATE = "var k = u32(f32(mx) / f32(my) * 0x1p23f);"
SQRT_ESTIMATE = "var k = u32(sqrt(f32(m) * 0x1p-23f) * 0x1p23f);"


def _operands() -> tuple[np.ndarray, np.ndarray]:
    """Random bit patterns (every binade, subnormals, NaNs, infinities), quotients near 1,
    subnormal results, and the edge values."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, 2**32, N, dtype=np.uint64).astype(np.uint32).view(np.float32).copy()
    y = rng.integers(0, 2**32, N, dtype=np.uint64).astype(np.uint32).view(np.float32).copy()
    quarter = N // 4
    with np.errstate(all="ignore"):
        y[:quarter] = x[:quarter] * np.float32(1 + 2.0 ** -23)
    x[quarter:2 * quarter] = rng.random(quarter).astype(np.float32) * np.float32(1e-37)
    y[quarter:2 * quarter] = rng.random(quarter).astype(np.float32) * np.float32(1e4)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-40, -1e-45, 2.0 ** -126,
                      3.4028235e38, 3.0, 7.0, 0.1], np.float32)
    x[-edges.size ** 2:] = np.repeat(edges, edges.size)
    y[-edges.size ** 2:] = np.tile(edges, edges.size)
    return x, y


def _program():
    b = ProgramBuilder("division_and_sqrt")
    x, y = b.input("x", "f32", (N,)), b.input("y", "f32", (N,))
    k = b.kernel((N,), grid_rank=1)  # one invocation per element
    a, c = k.load(x), k.load(y)
    k.store(b.output("quotient", "f32", (N,)), k.binary("div", a, c))
    k.store(b.output("root", "f32", (N,)), k.unary("sqrt", a))
    return b.build()


def _run(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The program built and loaded by the backend itself (no cache: the helpers' source
    may differ from the one the cache key knows)."""
    backend = WebGpuBackend()
    executable = backend.load(backend.compile(_program()))
    with hg.Executor("webgpu") as ex:
        buffers = [ex.from_numpy(x), ex.from_numpy(y), ex.empty((N,)), ex.empty((N,))]
        executable.launch(tuple(b.handle for b in buffers))
        return buffers[2].to_numpy(), buffers[3].to_numpy()


def _differing(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    return np.flatnonzero(~same)


@pytest.mark.parametrize("off", [0, 3, -3, 40], ids=lambda d: f"estimate{d:+d}")
def test_rounded_once_from_an_estimate_some_ulps_off(monkeypatch, off):
    if off:
        for name, line in (("hg_div", DIV_ESTIMATE), ("hg_sqrt", SQRT_ESTIMATE)):
            assert line in bitlib.HELPERS[name]
            monkeypatch.setitem(bitlib.HELPERS, name, bitlib.HELPERS[name].replace(
                line, line.replace(");", f") + {off & 0xFFFFFFFF}u;")))
    x, y = _operands()
    quotient, root = _run(x, y)
    with np.errstate(all="ignore"):
        want_q, want_r = x / y, np.sqrt(x)
    for what, got, want in (("div", quotient, want_q), ("sqrt", root, want_r)):
        bad = _differing(got, want)
        assert bad.size == 0, (what, [(x[i], y[i], got[i], want[i]) for i in bad[:5]])
