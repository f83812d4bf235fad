"""Derived gradients of front-end graphs (hologram.frontend.grad) against torch.autograd,
and hologram_torch.custom_op: values, gradcheck, opcheck, torch.compile, the device."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import Tensor  # noqa: E402

import hologram  # noqa: E402
import hologram_torch  # noqa: E402
from hologram.errors import GradientError, HologramError  # noqa: E402
from hologram.frontend import functional as hf  # noqa: E402
from hologram.frontend.grad import Tape, gradients  # noqa: E402

TF = torch.nn.functional


# --- hologram.frontend.grad: every rule against torch.autograd -------------------------

def _swap(t):
    order = list(range(t.ndim))
    order[-2:] = order[:-3:-1]
    return t.permute(*order)


#: name -> (operand shapes, the front-end function, the torch function)
RULES = {
    "bias_gelu": ([(4, 8), (8,)], lambda g, x, b: hf.gelu(x + b),
                  lambda x, b: TF.gelu(x + b)),
    "gelu_tanh": ([(9,)], lambda g, x: hf.gelu(x, "tanh"),
                  lambda x: TF.gelu(x, approximate="tanh")),
    "unary": ([(16,)], lambda g, x: (
        g.unary("tanh", x) + g.unary("sigmoid", x) + g.unary("sin", x) * g.unary("cos", x)
        + g.unary("log1p", abs(x)) + g.unary("erf", x) + g.unary("expm1", x)
        + g.unary("sqrt", abs(x)) + g.unary("rsqrt", abs(x)) + g.unary("exp2", x)
        + g.unary("log2", abs(x)) + g.unary("log", abs(x)) + g.unary("exp", -x)
        + g.unary("floor", x) + g.unary("sign", x)),
        lambda x: (x.tanh() + x.sigmoid() + x.sin() * x.cos() + x.abs().log1p() + torch.erf(x)
                   + torch.expm1(x) + x.abs().sqrt() + x.abs().rsqrt() + torch.exp2(x)
                   + x.abs().log2() + x.abs().log() + torch.exp(-x) + x.floor() + x.sign())),
    "arith": ([(3, 4), (4,)], lambda g, a, b: (a * b - b / (a * a + 1.0)) / 3.0 - (2.0 - a),
              lambda a, b: (a * b - b / (a * a + 1)) / 3 - (2 - a)),
    "pow": ([(8,), (8,)], lambda g, a, b: g.binary("pow", abs(a) + 0.5, b) +
            g.binary("pow", a, 3.0) + g.binary("pow", 2.0, b),
            lambda a, b: (a.abs() + 0.5) ** b + a ** 3 + 2.0 ** b),
    "fmod": ([(8,), (8,)], lambda g, a, b: g.binary("mod", a * 4.0, abs(b) + 0.5),
             lambda a, b: torch.fmod(a * 4, b.abs() + 0.5)),
    "extrema": ([(4, 8), (8,)], lambda g, a, b: g.maximum(a, b) + g.minimum(a, 0.1) +
                g.minimum(b, a) + g.maximum(0.2, a),
                lambda a, b: torch.maximum(a, b) + a.clamp(max=0.1) + torch.minimum(b, a)
                + a.clamp(min=0.2)),
    "where_fma": ([(8,), (8,)], lambda g, a, b: g.where(g.binary("gt", a, 0.0), g.fma(a, b, a),
                                                         b),
                  lambda a, b: torch.where(a > 0, a * b + a, b)),
    "cast": ([(8,)], lambda g, x: g.cast(g.cast(x * 3.0, "f32"), "f64"),
             lambda x: (x * 3).float().double()),
    "rms_norm": ([(4, 8), (8,)], lambda g, x, w: x * g.unary(
        "rsqrt", g.mean(x * x, -1, keepdim=True) + 1e-6) * w,
        lambda x, w: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w),
    "reductions": ([(3, 4, 5)], lambda g, x: g.sum(x, (0, 2)) * g.max(x, 1).reshape(3, 1, 5)[
        :, 0, :].reshape(15)[2:6].reshape(4) + g.reduce("min", x),
        lambda x: x.sum((0, 2)) * x.amax(1).reshape(15)[2:6] + x.amin()),
    "softmax": ([(3, 5)], lambda g, x: hf.log_softmax(x, 0) * hf.softmax(x, 1),
                lambda x: torch.log_softmax(x, 0) * torch.softmax(x, 1)),
    "matmuls": ([(2, 5, 8), (2, 6, 8), (8,), (5, 8)],
                lambda g, q, k, v, m: g.sum(hf.softmax((q @ _swap(k)) * 0.3, -1)) * g.sum(m @ v)
                + g.sum(v @ m.T) + (v @ v),
                lambda q, k, v, m: torch.softmax(q @ k.transpose(1, 2) * 0.3, -1).sum()
                * (m @ v).sum() + (v @ m.T).sum() + v @ v),
    "broadcast_matmul": ([(3, 1, 4, 5), (2, 5, 6)], lambda g, a, b: a @ b,
                         lambda a, b: a @ b),
    "views": ([(6, 8)], lambda g, x: g.unary("exp", x[1:5:2, ::3]) * x[0, ::3]
              + g.sum(x[::-1, 2] * x.T.reshape(4, 12)[1:3, ::5].reshape(6)),
              lambda x: torch.exp(x[1:5:2, ::3]) * x[0, ::3]
              + (x.flip(0)[:, 2] * x.T.reshape(4, 12)[1:3, ::5].reshape(6)).sum()),
    "broadcast_to": ([(1, 4)], lambda g, x: x.broadcast_to((3, 4)) * x.T.broadcast_to((4, 4))
                     .T.reshape(16)[:12].reshape(3, 4),
                     lambda x: x.expand(3, 4) * x.T.expand(4, 4).T.reshape(16)[:12]
                     .reshape(3, 4)),
    "gather_scatter": ([(5, 4), (3, 4)], lambda g, x, v: g.gather(
        x, ((g.arange(3) + 1).reshape(3, 1), 1), (3, 4)) * 3.0 + g.scatter(
        x, (g.arange(3).reshape(3, 1) * 2 - 5, 1), v, (3, 4), "add")[1:4],  # negative
        lambda x, v: x[1:4] * 3 + x.index_add(0, torch.tensor([0, 2, 4]), v)[1:4]),
    "scatter_replace": ([(5, 4), (2, 4)], lambda g, x, v: g.scatter(
        x, (g.arange(2).reshape(2, 1) * 2, 1), v, (2, 4)) * 2.0,
        lambda x, v: x.index_copy(0, torch.tensor([0, 2]), v) * 2),
}


def _run_rule(shapes, fn, tfn, seed=0):
    g = Tape("rule")
    xs = [g.input(f"x{i}", "f64", s) for i, s in enumerate(shapes)]
    y = fn(g, *xs)
    dy = g.input("dy", "f64", y.shape)
    g.output("y", y)
    for i, d in enumerate(gradients([y], [dy], xs)):
        g.output(f"d{i}", d)
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in shapes]
    dya = rng.standard_normal(y.shape)
    got = hologram.compile(g.program(), "cpu")(*arrays, dya)
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    want = tfn(*ts)
    want.backward(torch.tensor(dya))
    np.testing.assert_allclose(got[0], want.detach().numpy(), rtol=1e-10, atol=1e-12)
    for d, t in zip(got[1:], ts):
        np.testing.assert_allclose(d, t.grad.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", sorted(RULES))
def test_rule_matches_torch(name):
    _run_rule(*RULES[name])


def test_ties_and_special_points_follow_torch():
    """max/min of two tensors split ties in halves; amax splits among the maxima; abs has
    gradient 0 at 0; pow at a zero base and a zero exponent; relu (max with 0) passes at
    0 as clamp does."""
    x = np.array([1.0, 2.0, 2.0, 0.0, -1.0])
    y = np.array([1.0, 0.0, 2.0, 3.0, -1.0])
    g = Tape("ties")
    a, b = g.input("a", "f64", (5,)), g.input("b", "f64", (5,))
    out = (g.maximum(a, b) + g.minimum(a, b) * 2.0 + abs(a) * 3.0
           + g.binary("pow", a, 2.0) + g.binary("pow", a, b) * 0.5
           + g.max(a, 0) + g.maximum(a, 0.0) * 5.0)
    dy = g.input("dy", "f64", (5,))
    da, db = gradients([out], [dy], [a, b])
    g.output("da", da)
    g.output("db", db)
    got_a, got_b = hologram.compile(g.program(), "cpu")(x, y, np.ones(5))
    ta, tb = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
    (torch.maximum(ta, tb) + torch.minimum(ta, tb) * 2 + ta.abs() * 3 + ta ** 2.0
     + ta ** tb * 0.5 + ta.amax(0) + ta.clamp(min=0) * 5).sum().backward()
    np.testing.assert_allclose(got_a, ta.grad.numpy())
    np.testing.assert_allclose(got_b, tb.grad.numpy())


def test_gradient_errors():
    g = Tape("errors")
    x = g.input("x", "f64", (3, 4))
    with pytest.raises(GradientError, match=r"'prod' reduction .* f64 \[3, 4\]"):
        gradients([g.reduce("prod", x, 1)], [g.input("d", "f64", (3,))], [x])
    y = g.scatter(x, (g.arange(2).reshape(2, 1), 1), 2.0, (2, 4), "mul")
    with pytest.raises(GradientError, match="scatter of mode 'mul'"):
        gradients([y], [g.input("e", "f64", (3, 4))], [x])
    with pytest.raises(HologramError, match="gradient of output 0 is f64 \\[4\\]"):
        gradients([x], [g.input("f", "f64", (4,))], [x])
    # Integer values and values that do not depend on x carry no gradient.
    i = g.input("i", "i64", (3, 4))
    z = g.input("z", "f64", (3, 4))
    assert gradients([z * 2.0], [g.input("h", "f64", (3, 4))], [x, i]) == [None, None]


# --- hologram_torch.custom_op ------------------------------------------------------------

@hologram_torch.custom_op("hgtest::bias_gelu")
def bias_gelu(x: Tensor, bias: Tensor) -> Tensor:
    return hf.gelu(x + bias)


@hologram_torch.custom_op("hgtest::rms_norm")
def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    g = x.graph
    return x * g.unary("rsqrt", g.mean(x * x, -1, keepdim=True) + eps) * weight


@hologram_torch.custom_op("hgtest::scores")
def scores(q: Tensor, k: Tensor, scale: float) -> Tensor:
    return hf.softmax((q @ _swap(k)) * scale, -1)


@hologram_torch.custom_op("hgtest::mixed")
def mixed(x: Tensor, y: Tensor | None, xs: list[Tensor], scale: float = 2.0,
          dims: list[int] | None = None, *, shift: bool = False) -> tuple[Tensor, Tensor]:
    s = x * scale
    for t in xs:
        s = s + t
    if y is not None:
        s = s * y
    if shift:
        s = s + 1.0
    return s, x.graph.sum(s, tuple(dims or [1]))


@hologram_torch.custom_op("hgtest::scale_", mutates_args=("x",))
def scale_(x: Tensor, s: float) -> None:
    return x * s


def _square_backward(x, dy):
    return dy * x * 4.0  # deliberately not 2x: the test sees that this one ran


@hologram_torch.custom_op("hgtest::square", backward=_square_backward)
def square(x: Tensor) -> Tensor:
    return x * x


@hologram.jit
def _fused_relu(a, b, c):
    return hologram.ops.relu(a * b + c)


fused_relu = hologram_torch.custom_op("hgtest::fused_relu", _fused_relu,
                                      schema="(Tensor a, Tensor b, Tensor c) -> Tensor")

OPS = {  # name -> (op, operand shapes, constants, the unfused torch function)
    "bias_gelu": (bias_gelu, [(4, 8), (8,)], (), lambda x, b: TF.gelu(x + b)),
    "rms_norm": (rms_norm, [(4, 8), (8,)], (1e-5,),
                 lambda x, w, eps: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w),
    "scores": (scores, [(2, 3, 4), (2, 5, 4)], (0.5,),
               lambda q, k, s: torch.softmax(q @ k.transpose(-1, -2) * s, -1)),
    "fused_relu": (fused_relu, [(6,), (6,), (6,)], (), lambda a, b, c: torch.relu(a * b + c)),
}
DEVICES = ("cpu", "hologram")


def _args(shapes, device, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=dtype).to(device).requires_grad_()
            for s in shapes]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(OPS))
def test_values_and_gradcheck(name, device):
    op, shapes, constants, reference = OPS[name]
    args = _args(shapes, device)
    got = op(*args, *constants)
    assert got.device.type == device and got.dtype is torch.float64
    torch.testing.assert_close(got, reference(*args, *constants))
    assert torch.autograd.gradcheck(lambda *a: op(*a, *constants), args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(OPS))
def test_opcheck(name, device):
    op, shapes, constants, _ = OPS[name]
    tests = ["test_schema", "test_faketensor", "test_aot_dispatch_dynamic"]
    if device == "cpu":  # PyTorch's autograd registration check runs on CPU/CUDA only
        tests.append("test_autograd_registration")
    result = torch.library.opcheck(op, (*_args(shapes, device, torch.float32), *constants),
                                   test_utils=tests)
    assert set(result.values()) == {"SUCCESS"}, result


def test_schema_is_inferred_with_every_kind_of_argument():
    assert str(mixed._opoverload._schema) == (
        "hgtest::mixed(Tensor x, Tensor? y, Tensor[] xs, float scale=2., SymInt[]? dims=None, "
        "*, bool shift=False) -> (Tensor, Tensor)")
    x, y, a, b = _args([(3, 4), (4,), (3, 4), (3, 4)], "cpu")

    def reference(x, y, xs, scale=2.0, dims=None, shift=False):
        s = (x * scale + sum(xs)) * (1 if y is None else y) + (1.0 if shift else 0.0)
        return s, s.sum(tuple(dims or [1]))

    for call in [(x, y, [a, b], 3.0), (x, None, [a]), (x, y, [], 1.5, [0, 1])]:
        for shift in (False, True):
            got, want = mixed(*call, shift=shift), reference(*call, shift=shift)
            torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(lambda *t: mixed(t[0], t[1], list(t[2:]), 3.0)[1].sum()
                                    + mixed(t[0], None, [t[2]])[0].sum(), (x, y, a, b))
    result = torch.library.opcheck(mixed, (x, y, [a, b]), {"scale": 1.5, "shift": True})
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("device", DEVICES)
def test_mutating_op(device):
    x = torch.arange(4.0, device=device)
    assert scale_(x, 3.0) is None
    torch.testing.assert_close(x.cpu(), torch.arange(4.0) * 3)
    result = torch.library.opcheck(scale_, (torch.randn(3, device=device), 2.0),
                                   test_utils=("test_schema", "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}, result


def test_user_backward_overrides_the_derived_one():
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    square(x).sum().backward()
    torch.testing.assert_close(x.grad, 4 * x.detach())


def test_derived_backward_is_one_fused_program():
    x, b = _args([(64, 32), (32,)], "cpu", torch.float32)
    y = bias_gelu(x, b)
    gy = torch.randn_like(y)
    dx, db = torch.ops.hgtest.bias_gelu_backward(x, b, [gy], [True, True])
    xr, br = x.detach().requires_grad_(), b.detach().requires_grad_()
    TF.gelu(xr + br).backward(gy)
    torch.testing.assert_close(dx, xr.grad)
    torch.testing.assert_close(db, br.grad)
    only_b = torch.ops.hgtest.bias_gelu_backward(x, b, [gy], [False, True])
    assert len(only_b) == 1
    torch.testing.assert_close(only_b[0], br.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_keeps_custom_ops_in_the_region(device):
    """One partition forward and one backward: the ops and their neighbours lowered, no op
    eager, no fallback; values and gradients as eager."""
    def model(x, w, b, norm):
        return rms_norm(bias_gelu(x @ w, b), norm).sum()

    args = _args([(8, 16), (16, 32), (32,), (32,)], device, torch.float32)
    want = model(*args)
    want.backward()
    grads = [a.grad.clone() for a in args]
    for a in args:
        a.grad = None
    torch._dynamo.reset()
    hologram_torch.reset_compile_stats()
    got = torch.compile(model, backend="hologram")(*args)
    got.backward()
    torch.testing.assert_close(got, want)
    for a, g in zip(args, grads):
        torch.testing.assert_close(a.grad, g)
    stats = hologram_torch.compile_stats()
    assert stats["partitions"] == 2 and stats["ops_eager"] == 0, stats
    assert stats["eager_fallbacks"] == 0 and stats["graph_fallbacks"] == 0, stats


def test_no_graph_break_under_aot_autograd():
    """fullgraph=True raises on a graph break; aot_eager traces forward and backward
    through the fake implementations, as Inductor does (Inductor itself: ~15 s here)."""
    def model(x, b):
        return (bias_gelu(x * 2, b) + 1).sum()

    x, b = _args([(4, 8), (8,)], "cpu", torch.float32)
    want = model(x, b)
    want.backward()
    gx = x.grad.clone()
    x.grad = None
    torch._dynamo.reset()
    got = torch.compile(model, backend="aot_eager", fullgraph=True)(x, b)
    got.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x.grad, gx)


def test_lazy_device_records_the_op():
    x, b = _args([(4, 8), (8,)], "hologram", torch.float32)
    want = TF.gelu(x + b).detach().cpu()
    with hologram_torch.set_lazy(True):
        for _ in range(3):  # recorded, then run as a region
            got = bias_gelu(x, b) * 1.0
    torch.testing.assert_close(got.cpu(), want)


def test_expanded_and_strided_inputs():
    base = torch.randn(8, dtype=torch.float64, requires_grad=True)
    x = base.expand(4, 8)  # elements read twice: gradients summed by autograd
    w = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda base, w: rms_norm(base.expand(4, 8), w.T), (base, w))
    torch.testing.assert_close(bias_gelu(x, w.T[0]), TF.gelu(x + w.T[0]))


def test_bad_input_errors():
    x = torch.randn(4, 8)
    with pytest.raises(ShapeErrorOrRuntime, match=r"\[4, 8\] and \[1, 7\] do not broadcast"):
        bias_gelu(x, torch.randn(7))
    with pytest.raises(RuntimeError, match=r"dtype torch\.complex64"):
        bias_gelu(x.to(torch.complex64), torch.randn(8, dtype=torch.complex64))
    with pytest.raises(HologramError, match="cannot be mixed"):
        bias_gelu(x.to("hologram"), torch.randn(8))

    @hologram_torch.custom_op("hgtest::wrong_count")
    def wrong_count(x: Tensor) -> tuple[Tensor, Tensor]:
        return x * 2.0

    with pytest.raises(HologramError, match=r"hgtest::wrong_count: the function returned "
                                            r"\(Tensor\); .* needs 2 graph tensors"):
        wrong_count(x)

    @hologram_torch.custom_op("hgtest::no_rule")
    def no_rule(x: Tensor) -> Tensor:
        return x.graph.reduce("prod", x, 1)

    y = no_rule(x.requires_grad_())
    torch.testing.assert_close(y, x.detach().prod(1))
    with pytest.raises(GradientError, match="'prod' reduction"):
        y.sum().backward()


ShapeErrorOrRuntime = (hologram.ShapeError, RuntimeError)


def test_half_dtypes_forward_and_backward():
    for dtype in (torch.float16, torch.bfloat16):
        x, b = _args([(4, 8), (8,)], "cpu", dtype)
        y = bias_gelu(x, b)
        assert y.dtype is dtype
        y.float().sum().backward()
        xr, br = (t.detach().float().requires_grad_() for t in (x, b))
        TF.gelu(xr + br).sum().backward()
        tol = 2e-2 if dtype is torch.bfloat16 else 2e-3
        assert math.isclose(0, (x.grad.float() - xr.grad).abs().max().item(), abs_tol=tol * 4)
