"""Fused programs from the front end (softmax, layer norm, gelu, losses): elementwise
producers fused into reductions, stores of several shapes in one kernel, edge values."""

from __future__ import annotations

import numpy as np
import pytest

from hologram.frontend import functional as F
from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt

from .numerics import INF, NAN, assert_close, both, reduction_tolerance


def _normal(*shape, scale=3.0, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _layer_norm(g, x, w, b):
    d = x - g.mean(x, 1, keepdim=True)
    return d * g.unary("rsqrt", g.mean(d * d, 1, keepdim=True) + 1e-5) * w + b


FUSED = {
    "softmax_rows_1000": (lambda g, x: F.softmax(x, 1), lambda: [_normal(8, 1000)]),
    "softmax_rows_of_1": (lambda g, x: F.softmax(x, 1), lambda: [_normal(5, 1)]),
    "softmax_empty_batch": (lambda g, x: F.softmax(x, 1), lambda: [_normal(0, 10)]),
    "log_softmax": (lambda g, x: F.log_softmax(x, 1), lambda: [_normal(16, 300)]),
    "layer_norm": (_layer_norm, lambda: [_normal(16, 64), _normal(64, seed=1),
                                         _normal(64, seed=2)]),
    "gelu_erf": (lambda g, x: F.gelu(x), lambda: [_normal(32, 65)]),
    "gelu_tanh": (lambda g, x: F.gelu(x, "tanh"), lambda: [_normal(32, 65)]),
    "relu_mad": (lambda g, a, b, c: F.relu(a * b + c), lambda: [_normal(1001, seed=s)
                                                                 for s in range(3)]),
    "mse": (lambda g, a, b: F.mse_loss(a, b), lambda: [_normal(40, 25), _normal(40, 25, seed=1)]),
    "cross_entropy": (lambda g, x, t: F.cross_entropy(x, t),
                      lambda: [_normal(24, 11), np.random.default_rng(3).integers(0, 11, 24)]),
}
# Kernels a backend may run elsewhere by its declared policy: a zero extent (the empty
# batch) and a mean over per-row reductions (one kernel whose reduction varies along a
# loop). run() still requires the backend to declare it.
MAY_DELEGATE = {"softmax_empty_batch", "cross_entropy"}


@pytest.mark.parametrize("name", FUSED)
def test_fused_program(backend, name):
    build, make_inputs = FUSED[name]
    inputs = make_inputs()
    g = Graph(name)
    tensors = [g.input(f"x{i}", dt.dtype(a.dtype), a.shape) for i, a in enumerate(inputs)]
    g.output("y", build(g, *tensors))
    (got,), (want,) = both(g.program(), backend, inputs, delegation_ok=name in MAY_DELEGATE)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_softmax_with_edge_values(backend):
    x = np.array([[1000.0, 1000.0, -1000.0], [-INF, 0.0, 0.0], [NAN, 1.0, 2.0],
                  [INF, 1.0, 2.0], [-INF, -INF, -INF], [3.4e38, -3.4e38, 0.0]], dtype=np.float32)
    g = Graph("softmax_edges")
    g.output("y", F.softmax(g.input("x", "f32", x.shape), 1))
    (got,), (want,) = both(g.program(), backend, [x])
    assert_close(got, want, dt.float32, ulps=4, inputs=[x.reshape(-1)], what="softmax",
                 backend=backend)


def test_softmax_with_its_row_statistics(backend):
    """One kernel storing per-row and per-element values."""
    g = Graph("softmax_stats")
    x = g.input("x", "f32", (12, 257))
    m = g.max(x, 1, keepdim=True)
    e = g.unary("exp", x - m)
    s = g.sum(e, 1, keepdim=True)
    g.output("y", e / s)
    g.output("m", m)
    g.output("s", s)
    g.output("am", g.reduce("argmax", x, 1))
    data = _normal(12, 257, seed=3)
    got, want = both(g.program(), backend, [data])
    terms = np.exp(data.astype(np.float64) - data.max(1, keepdims=True))
    _, s_atol = reduction_tolerance("sum", dt.float32, want[2], terms)
    relative = np.repeat(s_atol / want[2].astype(np.float64), 257)  # y = e / s inherits it
    y_atol = relative * np.abs(want[0].astype(np.float64))
    checks = [("y", 4, y_atol), ("m", 0, 0.0), ("s", 0, s_atol), ("argmax", 0, 0.0)]
    for (name, ulps, atol), a, b in zip(checks, got, want):
        assert_close(a, b, dt.int64 if name == "argmax" else dt.float32, ulps, atol, what=name,
                     backend=backend)
