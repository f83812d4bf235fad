"""hologram.frontend.functional against torch.nn.functional, on every backend."""

from __future__ import annotations

import numpy as np
import pytest

import hologram
from hologram import backends
from hologram.errors import ShapeError
from hologram.frontend import functional as F
from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt

torch = pytest.importorskip("torch")
TF = torch.nn.functional
# every registered backend that runs here (on device memory the calls copy in and out)
BACKENDS = backends.available()


def _run(backend, build, *arrays):
    g = Graph("f")
    inputs = [g.input(f"x{i}", str(a.dtype).replace("float", "f").replace("int", "i"),
                      a.shape) for i, a in enumerate(arrays)]
    g.output("y", build(*inputs))
    return hologram.compile(g.program(), backend=backend)(*arrays)


def _close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, rtol=rtol, atol=atol)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.mark.parametrize("shape, dim", [((8, 1000), -1), ((8, 1000), 0), ((3, 4, 5), 1),
                                        ((5, 1), 1), ((0, 7), 1)])
def test_softmax_and_log_softmax(backend, shape, dim):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 5
    t = torch.from_numpy(x)
    _close(_run(backend, lambda a: F.softmax(a, dim), x), TF.softmax(t, dim).numpy())
    _close(_run(backend, lambda a: F.log_softmax(a, dim), x), TF.log_softmax(t, dim).numpy(),
           atol=1e-5)


def test_softmax_is_stable_for_large_logits(backend):
    x = np.array([[1000.0, 1000.0, -1000.0], [-np.inf, 0.0, 0.0]], dtype=np.float32)
    _close(_run(backend, lambda a: F.softmax(a, 1), x), TF.softmax(torch.from_numpy(x), 1).numpy())


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(backend, approximate):
    x = np.linspace(-8, 8, 1001, dtype=np.float32)
    want = TF.gelu(torch.from_numpy(x), approximate=approximate).numpy()
    _close(_run(backend, lambda a: F.gelu(a, approximate), x), want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses(backend, reduction):
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((2, 16, 10)).astype(np.float32)
    tx, tt = torch.from_numpy(x), torch.from_numpy(t)
    _close(_run(backend, lambda a, b: F.mse_loss(a, b, reduction), x, t),
           TF.mse_loss(tx, tt, reduction=reduction).numpy())
    logits = x * 3
    labels = rng.integers(0, 10, 16)
    _close(_run(backend, lambda a, b: F.cross_entropy(a, b, reduction), logits, labels),
           TF.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels),
                            reduction=reduction).numpy(), atol=1e-5)
    probs = TF.softmax(tt, 1).numpy()
    _close(_run(backend, lambda a, b: F.cross_entropy(a, b, reduction), logits, probs),
           TF.cross_entropy(torch.from_numpy(logits), torch.from_numpy(probs),
                            reduction=reduction).numpy(), atol=1e-5)
    p = 1 / (1 + np.exp(-x))
    p[0, :3] = [0.0, 1.0, 0.5]  # log(0) clamps at -100 in both
    target = (t > 0).astype(np.float32)
    _close(_run(backend, lambda a, b: F.binary_cross_entropy(a, b, reduction), p, target),
           TF.binary_cross_entropy(torch.from_numpy(p), torch.from_numpy(target),
                                   reduction=reduction).numpy(), atol=1e-5)
    _close(_run(backend, lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction),
                x * 10, target),
           TF.binary_cross_entropy_with_logits(tx * 10, torch.from_numpy(target),
                                               reduction=reduction).numpy(), atol=1e-5)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_cross_entropy_class_indices_outside_the_classes_contribute_zero(backend, dtype):
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((6, 9)).astype(np.float32) * 3
    labels = np.array([0, 8, 9, -1, -9, 4], dtype)  # in range at both ends, then outside
    valid = (labels >= 0) & (labels < 9)
    want = TF.cross_entropy(torch.from_numpy(logits),
                            torch.from_numpy(np.where(valid, labels, 0).astype(np.int64)),
                            reduction="none").numpy() * valid
    got = _run(backend, lambda a, b: F.cross_entropy(a, b, "none"), logits, labels)
    _close(got, want, atol=1e-5)
    assert np.all(np.asarray(got).reshape(-1)[~valid] == 0)


def test_bad_arguments_name_the_problem():
    g = Graph("bad")
    x, t = g.input("x", "f32", (4, 3)), g.input("t", "i64", (5,))
    with pytest.raises(ShapeError, match=r"class indices must be \[4\]"):
        F.cross_entropy(x, t)
    with pytest.raises(ShapeError, match="dim 2 out of range"):
        F.softmax(x, 2)
    with pytest.raises(ValueError, match="reduction must be one of"):
        F.mse_loss(x, x, "average")


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_means_accumulate_in_f32(backend, dtype):
    """Graph.mean (and so the losses' "mean") of f16/bf16 sums and divides in f32 and
    rounds once, as PyTorch: 100,000 ones have the mean 1 (their f16 sum and count
    overflow to inf, and inf/inf was NaN); a mean of values whose sum passes 65,504 is
    finite and right to half precision; the losses' means likewise."""
    torch_half = torch.float16 if dtype == "f16" else torch.bfloat16
    rng = np.random.default_rng(3)
    n = 100_000
    cases = [np.ones(n, np.float32), rng.standard_normal(n).astype(np.float32) + 4]
    for values in cases:
        t = torch.from_numpy(values).to(torch_half)
        stored = dt.to_bf16_bits(t.float().numpy()) if dtype == "bf16" else t.numpy()
        g = Graph("mean")
        x = g.input("x", dtype, (n,))
        g.output("all", g.mean(x))
        g.output("rows", g.mean(x.reshape(4, n // 4), 1))
        g.output("mse", F.mse_loss(x, g.cast(g.cast(x, "f32") * 0.5, dtype)))
        got = hologram.compile(g.program(), backend=backend)(stored)
        got = [np.asarray(dt.from_bf16_bits(v) if dtype == "bf16" else v, np.float32)
               for v in got]
        half_x = t.float()
        wants = [half_x.mean(), half_x.reshape(4, n // 4).mean(1),
                 TF.mse_loss(half_x, (half_x * 0.5).to(torch_half).float())]
        rtol = 2.0 ** -10 if dtype == "f16" else 2.0 ** -7  # one rounding to the format
        for got_value, want in zip(got, wants):
            want = want.to(torch_half).float().numpy()
            np.testing.assert_allclose(got_value.reshape(want.shape), want, rtol=rtol)
