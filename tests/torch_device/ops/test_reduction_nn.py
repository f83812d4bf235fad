"""Direct tests of the reduction and nn kernel families (hologram_torch/aten/reduction.py
and nn.py) against CPU torch: values and dtypes on random inputs and edge cases (NaN,
±inf, -0.0, empty and 0-d tensors, non-contiguous views, every supported dtype), errors,
gradients, and that each kernel actually ran on the device (no CPU fallback)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import hologram_torch  # noqa: E402

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float64: (1e-10, 1e-10),
             torch.float16: (1e-3, 2e-3), torch.bfloat16: (1e-2, 2e-2)}


# --- helpers ------------------------------------------------------------------------------

def _make(shape, dtype, seed=0, low=-3, high=3):
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * (high - low) + low).to(dtype)
    low = 0 if dtype is torch.uint8 else low
    return torch.randint(low, high + 1, shape, generator=g, dtype=dtype)


def _dev(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to("hologram").requires_grad_(x.requires_grad)
    if isinstance(x, (list, tuple)):
        return type(x)(_dev(y) for y in x)
    return x


def _flat(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _flat(y)]
    return []


def _close(actual, expected):
    assert actual.device.type == "hologram"
    assert actual.dtype == expected.dtype
    atol, rtol = TOLERANCE.get(expected.dtype, (0, 0))
    torch.testing.assert_close(actual.cpu(), expected, atol=atol, rtol=rtol, equal_nan=True)


def same(fn, *args, native=(), grad=False):
    """fn(*args) on the device matches the CPU (values, dtypes, and with ``grad`` the
    gradients of the inputs at those positions, True: the first); the aten overloads
    ``native`` ran on the device."""
    grad = (0,) if grad is True else grad or ()
    args = [a.clone().requires_grad_() if i in grad else a for i, a in enumerate(args)]
    expected = fn(*args)
    device = _dev(args)
    hologram_torch.reset_fallback_stats()
    actual = fn(*device)
    for a, e in zip(_flat(actual), _flat(expected), strict=True):
        _close(a, e)
    if grad:
        outs = [(a, e) for a, e in zip(_flat(actual), _flat(expected)) if e.requires_grad]
        leaves = [(d, a) for d, a in zip(_flat(device), _flat(args)) if a.requires_grad]
        cot = [torch.randn(e.shape, dtype=e.dtype, generator=torch.Generator().manual_seed(1))
               for _, e in outs]
        ge = torch.autograd.grad([e for _, e in outs], [a for _, a in leaves], cot,
                                 allow_unused=True)
        ga = torch.autograd.grad([a for a, _ in outs], [d for d, _ in leaves],
                                 [c.to("hologram") for c in cot], allow_unused=True)
        for a, e in zip(ga, ge):
            assert (a is None) == (e is None)
            if e is not None:
                _close(a, e)
    ran_on_cpu = set(hologram_torch.fallback_stats(lacking=False))
    for name in native:
        assert f"aten.{name}" not in ran_on_cpu, f"{name} fell back to the CPU"
    return actual


def same_error(fn, *args):
    """fn raises on the device exactly what it raises on the CPU."""
    with pytest.raises(Exception) as cpu:
        fn(*args)
    with pytest.raises(type(cpu.value)) as dev:
        fn(*_dev(args))
    assert str(dev.value).split("\n")[0] == str(cpu.value).split("\n")[0]


SPECIAL = torch.tensor([[1.0, math.nan, -0.0, 0.0], [math.inf, -math.inf, 2.0, -2.0],
                        [-0.0, 0.0, 0.0, -0.0], [3.0, 3.0, -1.0, 3.0]])


# --- sum / mean ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS + INTS + (torch.bool,))
@pytest.mark.parametrize("dim, keepdim", [(None, False), (0, False), (-1, True), ((0, 2), False),
                                          ((-1, 0), True), ((), False)])
def test_sum(dtype, dim, keepdim):
    x = _make((3, 4, 5), dtype)
    if dim is None:
        same(lambda a: a.sum(), x, native=["sum.default"])
    else:
        same(lambda a: a.sum(dim, keepdim=keepdim), x, native=["sum.dim_IntList"])


@pytest.mark.parametrize("dtype", FLOATS)
def test_sum_mean_views_and_specials(dtype):
    x = _make((6, 5), dtype)
    same(lambda a: a.T.sum(1), x, native=["sum.dim_IntList"])
    same(lambda a: a[::2, 1:].mean(0, keepdim=True), x, native=["mean.dim"])
    same(lambda a: a.expand(3, 6, 5).sum((0, 1)), x)
    same(lambda a: a.sum(1), SPECIAL.to(dtype))
    same(lambda a: a.mean(-1), SPECIAL.to(dtype))


def test_sum_mean_edge_cases():
    same(lambda a: a.sum(), torch.tensor(2.5))  # 0-d
    same(lambda a: a.sum(0), torch.tensor(2.5))
    same(lambda a: a.sum(-1, keepdim=True), torch.tensor(7))
    same(lambda a: a.sum(0), torch.empty(0, 3))  # empty: 0
    same(lambda a: a.sum(), torch.empty(0, dtype=torch.int32))
    same(lambda a: a.mean(0), torch.empty(0, 3))  # empty mean: NaN
    same(lambda a: a.sum(1), torch.empty(0, 3))
    same(lambda a: a.sum(dtype=torch.float64), _make((4, 3), torch.float32))
    same(lambda a: a.sum(0, dtype=torch.float16), _make((4, 3), torch.float32))
    same(lambda a: a.sum(1, dtype=torch.int32), _make((4, 3), torch.int64))
    same(lambda a: a.mean(dtype=torch.float64), _make((4, 3), torch.int64))
    same(lambda a: a.sum(), torch.ones(100, dtype=torch.uint8))  # promoted: no wrap at 256
    same(lambda a: a.sum(), torch.tensor([2**62, 2**62, 2**62]))  # int64 wraps like torch


def _with_out(op, shape, out_dtype, **kwargs):
    """op(a, ..., out=a new tensor of ``shape``/``out_dtype`` on a's device); returns out."""
    def fn(a):
        out = torch.empty(shape, dtype=out_dtype, device=a.device)
        result = op(a, **kwargs, out=out)
        assert result is out
        return out
    return fn


def test_sum_mean_out():
    x = _make((3, 4, 5), torch.float32)
    same(_with_out(torch.sum, (3, 5), torch.float32, dim=1), x, native=["sum.IntList_out"])
    same(_with_out(torch.sum, (3, 1, 1), torch.float64, dim=(1, 2), keepdim=True), x)
    same(_with_out(torch.sum, (4,), torch.int64, dim=(0, 2)), _make((3, 4, 5), torch.int32))
    same(_with_out(torch.mean, (5,), torch.float32, dim=(0, 1)), x, native=["mean.out"])
    same(_with_out(torch.mean, (0,), torch.float32, dim=-1), x[:0, 0])
    same(_with_out(torch.sum, (0,), torch.float32, dim=0), x[:, 0])  # resized, no warning
    # logsumexp writes its sum through sum.IntList_out
    same(lambda a: torch.logsumexp(a, 1), x, native=["sum.IntList_out", "amax.default"])
    same_error(_with_out(torch.mean, (4,), torch.float32, dim=0), _make((3, 4), torch.int64))
    same_error(_with_out(torch.sum, (4,), torch.float32, dim=0, dtype=torch.float64), x[0])


def test_sum_mean_errors():
    same_error(lambda a: a.sum(2), _make((3, 4), torch.float32))
    same_error(lambda a: a.sum((0, 0)), _make((3, 4), torch.float32))
    same_error(lambda a: a.mean(), _make((3, 4), torch.int64))
    same_error(lambda a: a.mean(0), _make((3,), torch.bool))


# --- extremes -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS + INTS + (torch.bool,))
def test_amax_amin_max_min(dtype):
    x = _make((4, 3, 5), dtype, seed=3, low=-2, high=2)  # small range: many ties
    same(lambda a: a.amax((0, 2)), x, native=["amax.default"])
    same(lambda a: a.amin(-1, keepdim=True), x, native=["amin.default"])
    same(lambda a: a.amax(), x)
    same(lambda a: a.max(), x, native=["max.default"])
    same(lambda a: a.min(), x, native=["min.default"])
    same(lambda a: a.max(1), x, native=["max.dim"])
    same(lambda a: a.transpose(0, 2).min(-1, keepdim=True), x, native=["min.dim"])


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_argmax_argmin(dtype):
    x = _make((4, 3, 5), dtype, seed=4, low=-2, high=2)
    same(lambda a: a.argmax(), x, native=["argmax.default"])
    same(lambda a: a.argmin(), x, native=["argmin.default"])
    same(lambda a: a.argmax(1), x)
    same(lambda a: a[:, ::2].argmin(-1, keepdim=True), x)
    same(lambda a: a.argmax(keepdim=True), x)
    same(lambda a: a.argmax(0), torch.tensor(5, dtype=dtype))


def test_extremes_specials():
    """NaN propagates (its first index wins); ties give the first index; -0.0 == 0.0."""
    for dtype in FLOATS:
        x = SPECIAL.to(dtype)
        for fn in (lambda a: a.amax(1), lambda a: a.amin(0), lambda a: a.max(1),
                   lambda a: a.min(0), lambda a: a.argmax(1), lambda a: a.argmin(1),
                   lambda a: a.argmax(0), lambda a: a.max(), lambda a: a.argmin()):
            same(fn, x)
    zeros = torch.tensor([-0.0, 0.0, -0.0, 0.0])
    same(lambda a: a.argmax(), zeros)
    same(lambda a: a.argmin(), zeros.flip(0))
    same(lambda a: a.max(0).indices, zeros)


def test_extremes_edge_cases():
    same(lambda a: a.max(0), torch.tensor(2.0))
    same(lambda a: a.amax(), torch.tensor(-1))
    same(lambda a: a.amax(0), torch.empty(3, 0))  # nothing to reduce over... but no rows
    same(lambda a: a.max(1), torch.empty(0, 4))
    same_error(lambda a: a.amax(0), torch.empty(0, 3))
    same_error(lambda a: a.max(), torch.empty(0))
    same_error(lambda a: a.max(0), torch.empty(0, 3))
    same_error(lambda a: a.argmax(), torch.empty(0))
    same_error(lambda a: a.argmax(), torch.tensor([True, False]))
    same_error(lambda a: a.max(3), torch.ones(2, 2))


# --- variance and norms -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("correction", [0, 1, 2.5])
def test_var_std(dtype, correction):
    x = _make((5, 4, 3), dtype)
    same(lambda a: torch.var(a, 1, correction=correction), x, native=["var.correction"])
    same(lambda a: torch.std(a, (0, 2), correction=correction, keepdim=True), x,
         native=["std.correction"])
    same(lambda a: torch.var_mean(a.transpose(0, 1), -1, correction=correction), x,
         native=["var_mean.correction"])
    same(lambda a: torch.std_mean(a, correction=correction), x, native=["std_mean.correction"])


def test_var_edge_cases():
    same(lambda a: a.var(0), torch.ones(1, 3))  # n - correction = 0: NaN
    same(lambda a: torch.var(a, 0, correction=3), torch.ones(2, 3))  # negative: inf/NaN
    same(lambda a: a.std(), torch.tensor(2.0))
    same(lambda a: a.var(0), torch.empty(0, 2))
    same(lambda a: a.var(1), SPECIAL)
    same_error(lambda a: a.var(), torch.ones(3, dtype=torch.int64))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("ord", [2, 1, 0, 3, 0.5, -1, math.inf, -math.inf])
def test_vector_norm(dtype, ord):
    x = _make((4, 5), dtype)
    x[0, 0] = 0
    same(lambda a: torch.linalg.vector_norm(a, ord), x, native=["linalg_vector_norm.default"])
    same(lambda a: torch.linalg.vector_norm(a.T, ord, dim=0, keepdim=True), x)
    same(lambda a: torch.linalg.vector_norm(a, ord, dim=(0, 1)), x)


def test_vector_norm_edge_cases():
    same(lambda a: torch.linalg.vector_norm(a), torch.empty(0, 3))
    same(lambda a: torch.linalg.vector_norm(a, dtype=torch.float64), _make((3,), torch.float32))
    same(lambda a: torch.linalg.vector_norm(a, 2, dim=1), SPECIAL)
    same(lambda a: torch.linalg.vector_norm(a, math.inf, dim=0), SPECIAL)
    same(lambda a: torch.norm(a, 2, dim=1), _make((3, 4), torch.float32))
    same_error(lambda a: torch.linalg.vector_norm(a, math.inf), torch.empty(0))
    same_error(lambda a: torch.linalg.vector_norm(a), torch.ones(3, dtype=torch.int64))


def test_reduction_gradients():
    x = _make((4, 5), torch.float64)
    for fn in (lambda a: a.sum(1), lambda a: a.mean(), lambda a: a.amax(0),
               lambda a: torch.var(a, 1), lambda a: a.std(), lambda a: torch.var_mean(a, 0),
               lambda a: torch.linalg.vector_norm(a, 2, 1), lambda a: a.max(1).values):
        same(fn, x, grad=True)


# --- softmax ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax(dtype):
    x = _make((3, 4, 5), dtype)
    for dim in (0, 1, -1):
        same(lambda a, dim=dim: F.softmax(a, dim), x, native=["_softmax.default"])
        same(lambda a, dim=dim: F.log_softmax(a, dim), x, native=["_log_softmax.default"])
    same(lambda a: F.softmax(a.transpose(0, 2), 1), x)
    same(lambda a: F.log_softmax(a[:, ::2], -1), x)
    same(lambda a: F.softmax(a, 1), SPECIAL.to(dtype))
    same(lambda a: F.log_softmax(a, 0), SPECIAL.to(dtype))
    same(lambda a: F.softmax(a, 0), torch.tensor(3.0, dtype=dtype))
    same(lambda a: F.log_softmax(a, -1), torch.empty(2, 0, dtype=dtype))
    same(lambda a: F.softmax(a, 1), torch.full((2, 3), -math.inf, dtype=dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_safe_softmax_zeroes_rows_of_only_minus_infinity(dtype):
    """Attention's softmax (``_safe_softmax``): one device program whose fully masked
    rows are zeros, not NaN; a NaN row stays NaN; ``dtype=`` converts first."""
    safe = torch.ops.aten._safe_softmax
    inf = math.inf
    rows = torch.tensor([[-inf, -inf, -inf], [1.0, 2.0, -inf], [math.nan, -inf, -inf],
                         [0.0, -0.0, 1e-40]], dtype=dtype)
    for x in (rows, _make((3, 4, 5), dtype), torch.tensor(-inf, dtype=dtype),
              torch.empty(2, 0, 3, dtype=dtype), _make((6, 4), dtype).t()):
        for dim in range(-max(x.dim(), 1), max(x.dim(), 1)):
            same(lambda a, dim=dim: safe(a, dim), x, native=["_safe_softmax.default"])
    same(lambda a: safe(a, 1, torch.float64), rows)
    same(lambda a: safe(a, 1), rows.double(), grad=True)


def test_softmax_gradients():
    x = _make((3, 4), torch.float64)
    same(lambda a: F.softmax(a, 1), x, grad=True, native=["_softmax_backward_data.default"])
    same(lambda a: F.log_softmax(a, 0), x, grad=True,
         native=["_log_softmax_backward_data.default"])
    same(lambda a: F.softmax(a, 0), torch.tensor(1.5), grad=True)


def test_softmax_half_to_float():
    x = _make((3, 4), torch.float16)
    out = torch.ops.aten._softmax(_dev(x), 1, True)
    _close(out, torch.softmax(x.float(), 1))


# --- losses -------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_pointwise_losses(reduction):
    x, t = _make((4, 5), torch.float64), _make((4, 5), torch.float64, seed=1)
    same(lambda a, b: F.mse_loss(a, b, reduction=reduction), x, t, grad=True,
         native=["mse_loss.default", "mse_loss_backward.default"])
    for beta in (1.0, 0.5, 0.0):
        same(lambda a, b, beta=beta: F.smooth_l1_loss(a, b, reduction=reduction, beta=beta),
             x, t,
             grad=True, native=["smooth_l1_loss.default"])
    for delta in (1.0, 2.5):
        same(lambda a, b, delta=delta: F.huber_loss(a, b, reduction=reduction, delta=delta),
             x, t,
             grad=True, native=["huber_loss.default", "huber_loss_backward.default"])
    same(lambda a, b: F.l1_loss(a, b, reduction=reduction), x, t, grad=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_pointwise_losses_dtypes(dtype):
    x, t = _make((4, 4), dtype), _make((4, 4), dtype, seed=1)
    same(lambda a, b: F.mse_loss(a.T, b), x, t)
    same(lambda a, b: F.smooth_l1_loss(a, b, reduction="none"), x, t)
    same(lambda a, b: F.huber_loss(a, b, reduction="sum"), x, t)
    same(lambda a, b: F.mse_loss(a, b), torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype))
    same(lambda a, b: F.mse_loss(a, b, reduction="none"), SPECIAL.to(dtype), x)


def _targets(n, classes, seed=0, ignore=None):
    t = torch.randint(0, classes, n, generator=torch.Generator().manual_seed(seed))
    if ignore is not None:
        t.view(-1)[::3] = ignore
    return t


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_nll(reduction):
    x, w = _make((6, 5), torch.float64), torch.rand(5, dtype=torch.float64)
    t = _targets((6,), 5)
    native = ["_log_softmax.default", "nll_loss_forward.default", "nll_loss_backward.default"]
    same(lambda a, b: F.cross_entropy(a, b, reduction=reduction), x, t, grad=True,
         native=native)
    same(lambda a, b, c: F.cross_entropy(a, b, weight=c, reduction=reduction), x, t, w,
         grad=True, native=native)
    ti = _targets((6,), 5, ignore=-100)
    same(lambda a, b, c: F.cross_entropy(a, b, weight=c, reduction=reduction), x, ti, w,
         grad=True)
    same(lambda a, b: F.nll_loss(a, b, ignore_index=2, reduction=reduction), x, t, grad=True)
    # K-dimensional: [N, C, d1, d2] (nll_loss2d) and [N, C, d] (reshaped by torch)
    x4 = _make((2, 5, 3, 2), torch.float64)
    same(lambda a, b, c: F.cross_entropy(a, b, weight=c, reduction=reduction), x4,
         _targets((2, 3, 2), 5, ignore=-100), w, grad=True,
         native=["nll_loss2d_forward.default", "nll_loss2d_backward.default"])
    same(lambda a, b: F.nll_loss(a, b, reduction=reduction), _make((2, 5, 3), torch.float64),
         _targets((2, 3), 5), grad=True)
    # one sample: input [C], target []
    same(lambda a, b: F.nll_loss(a, b, reduction=reduction), x[0], t[0], grad=True)


def test_cross_entropy_edge_cases():
    x = _make((4, 3), torch.float32)
    all_ignored = torch.full((4,), -100)
    same(lambda a, b: F.cross_entropy(a, b), x, all_ignored, grad=True)  # 0/0: NaN
    same(lambda a, b: F.cross_entropy(a, b), SPECIAL, torch.tensor([0, 2, 3, 1]))
    for dtype in FLOATS:
        same(lambda a, b: F.cross_entropy(a, b, reduction="none"), x.to(dtype),
             torch.tensor([0, 2, 1, 1]))
    same(lambda a, b: F.cross_entropy(a, b, label_smoothing=0.1), x, torch.tensor([0, 2, 1, 1]))
    same_error(lambda a, b: F.cross_entropy(a, b), x, torch.tensor([0, 3, 1, 1]))
    same_error(lambda a, b: F.nll_loss(a, b), x, torch.tensor([0, -1, 1, 1]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(reduction):
    p = torch.rand(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    p[0, :2] = torch.tensor([0.0, 1.0])  # log(0): clamped at -100
    t = torch.rand(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    w = torch.rand(5, dtype=torch.float64)
    same(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction), p, t,
         native=["binary_cross_entropy.default"])
    same(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction), p[1:], t[1:],
         grad=True, native=["binary_cross_entropy_backward.default"])
    same(lambda a, b, c: F.binary_cross_entropy(a, b, weight=c.expand(4, 5),
                                                reduction=reduction), p, t, w)
    x = _make((4, 5), torch.float64, low=-30, high=30)
    same(lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction), x, t,
         grad=True, native=["binary_cross_entropy_with_logits.default"])
    same(lambda a, b, c, d: F.binary_cross_entropy_with_logits(
        a, b, weight=c, pos_weight=d, reduction=reduction), x, t, w, w + 0.5, grad=True)


def test_binary_cross_entropy_dtypes_and_errors():
    for dtype in FLOATS:
        p, t = torch.rand(3, 4).to(dtype), torch.rand(3, 4).to(dtype)
        same(lambda a, b: F.binary_cross_entropy(a, b), p, t)
        same(lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction="none"), p * 8, t)
    same_error(lambda a, b: F.binary_cross_entropy(a, b), torch.tensor([0.5, 1.5]),
               torch.tensor([0.0, 1.0]))
    same_error(lambda a, b: F.binary_cross_entropy(a, b), torch.tensor([0.5, math.nan]),
               torch.tensor([0.0, 1.0]))


# --- layer norm ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm(dtype):
    x = _make((3, 4, 5), dtype)
    w, b = _make((4, 5), dtype, seed=1), _make((4, 5), dtype, seed=2)
    same(lambda a: F.layer_norm(a, (5,)), x, native=["native_layer_norm.default"])
    same(lambda a, c, d: F.layer_norm(a, (4, 5), c, d), x, w, b)
    same(lambda a, c: F.layer_norm(a.transpose(0, 1), (3, 5), c.reshape(5, 4).T[:3]), x, w)
    same(lambda a: torch.native_layer_norm(a, (5,), None, None, 1e-5), x)


def test_layer_norm_gradients():
    x = _make((3, 4, 5), torch.float64)
    w, b = _make((5,), torch.float64, seed=1), _make((5,), torch.float64, seed=2)
    native = ["native_layer_norm.default", "native_layer_norm_backward.default"]
    same(lambda a, c, d: F.layer_norm(a, (5,), c, d), x, w, b, grad=(0, 1, 2), native=native)
    same(lambda a, c: F.layer_norm(a, (5,), c), x, w, grad=(0, 1), native=native)
    same(lambda a, c, d: F.layer_norm(a.transpose(0, 1), (5,), c, d), x, w, b, grad=(1, 2))
    same(lambda a: F.layer_norm(a, (4, 5)), x, grad=True, native=native)
    same(lambda a, c, d: F.layer_norm(a, (1,), c, d), torch.tensor([0.3], dtype=torch.float64),
         w[:1], b[:1], grad=(0, 1, 2))
    same(lambda a: F.layer_norm(a, (5,)), torch.empty(0, 5), grad=True)
    same(lambda a: F.layer_norm(a, (4,)), SPECIAL)


# --- embedding ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS + (torch.int64,))
def test_embedding(dtype):
    w = _make((10, 3), dtype)
    idx = torch.tensor([[0, 9, 3], [3, 3, 1]])
    same(lambda a, i: F.embedding(i, a), w, idx, native=["embedding.default"])
    same(lambda a, i: F.embedding(i, a.T.contiguous().T), w, idx.to(torch.int32))
    same(lambda a, i: F.embedding(i, a), w, torch.tensor(4))
    same(lambda a, i: F.embedding(i, a), w, torch.empty(0, dtype=torch.int64))


def test_embedding_specials_and_errors():
    w = SPECIAL.T.contiguous()  # rows with NaN, inf and -0.0
    same(lambda a, i: F.embedding(i, a), w, torch.tensor([1, 2, 0, 3]))
    same_error(lambda a, i: F.embedding(i, a), w, torch.tensor([0, 4]))
    same_error(lambda a, i: F.embedding(i, a), w, torch.tensor([-1]))


@pytest.mark.parametrize("padding_idx", [None, 3, -1])
@pytest.mark.parametrize("scale", [False, True])
def test_embedding_gradients(padding_idx, scale):
    w = _make((6, 4), torch.float64)
    idx = torch.tensor([[0, 3, 3], [5, 3, 1]])
    same(lambda a, i: F.embedding(i, a, padding_idx=padding_idx, scale_grad_by_freq=scale),
         w, idx, grad=True, native=["embedding.default", "embedding_dense_backward.default"])


# --- dropout ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
def test_dropout_reproduces_cpu(dtype):
    """torch.manual_seed gives the CPU's mask: the draw is torch's CPU generator."""
    x = _make((8, 7), dtype)
    for p in (0.2, 0.5, 0.9):
        torch.manual_seed(7)
        expected = F.dropout(x, p)
        torch.manual_seed(7)
        hologram_torch.reset_fallback_stats()
        actual = F.dropout(_dev(x), p)
        _close(actual, expected)
        assert "aten.native_dropout.default" not in hologram_torch.fallback_stats(lacking=False)


def test_dropout_modes_and_gradients():
    x = _make((5, 6), torch.float64)
    same(lambda a: F.dropout(a, 0.3, training=False), x)
    same(lambda a: F.dropout(a, 0.0), x)
    torch.manual_seed(3)
    xe = x.clone().requires_grad_()
    ye = F.dropout(xe, 0.4)
    ye.backward(torch.ones_like(ye))
    torch.manual_seed(3)
    xa = _dev(x).requires_grad_()
    ya = F.dropout(xa, 0.4)
    hologram_torch.reset_fallback_stats()
    ya.backward(torch.ones_like(ya))
    _close(ya.detach(), ye.detach())
    _close(xa.grad, xe.grad)
    ran = hologram_torch.fallback_stats(lacking=False)
    assert "aten.native_dropout_backward.default" not in ran
    out, mask = torch.native_dropout(_dev(x), 0.5, False)  # eval: identity, all kept
    _close(out, x)
    assert mask.dtype is torch.bool and bool(mask.cpu().all())
    out, mask = torch.native_dropout(_dev(torch.empty(0, 3)), 0.5, True)
    assert out.shape == (0, 3) and mask.dtype is torch.bool


def test_whole_sums_and_means_keep_signatures_apart():
    # x.sum() / x.mean() remember their kernel under x's dtype, shape and strides; the
    # later calls take it and must still match the CPU (values of each call, not the first).
    from hologram_torch.aten import runner

    for dtype in (torch.float32, torch.float64, torch.int64, torch.bool, torch.float16):
        for seed in range(3):
            x = (torch.randn(6, 5, generator=torch.Generator().manual_seed(seed)) * 4).to(dtype)
            d = x.to("hologram")
            for view, ref in ((d, x), (d.t(), x.t()), (d[1:, ::2], x[1:, ::2])):
                torch.testing.assert_close(view.sum().cpu(), ref.sum())
                if dtype.is_floating_point:
                    torch.testing.assert_close(view.mean().cpu(), ref.mean())
    assert (torch.ops.aten.sum.dim_IntList, torch.bool, torch.Size([5, 6]), (1, 5)) \
        in runner.shortcuts


def test_tensors_of_more_than_64_dimensions_reduce_as_on_the_cpu():
    """A dim of a tensor of more than 64 dimensions is refused with torch's error (its
    dims are a 64-bit mask); whole reductions run (on the CPU kernel: no program takes
    so many dimensions) or raise as the CPU does."""
    c = torch.randn([1] * 65)
    x = c.to("hologram")
    for op in (torch.sum, torch.mean, torch.nansum, torch.std, torch.var, torch.logsumexp,
               torch.norm, torch.argmin, torch.amax):
        for dim in (64, -1, 0):
            with pytest.raises(RuntimeError, match="only tensors with up to 64 dims"):
                op(x, dim=dim)
    for op in (torch.sum, torch.mean, torch.std, torch.var, torch.norm, torch.amax,
               torch.argmin, lambda t: t * 2):
        try:
            want = op(c)
        except RuntimeError as e:
            with pytest.raises(RuntimeError, match=str(e)):
                op(x)
            continue
        got = op(x).cpu()  # (assert_close reduces over dims: flattened)
        assert got.shape == want.shape
        torch.testing.assert_close(got.reshape(-1), want.reshape(-1), equal_nan=True)


def test_mode_into_out_tensors():
    c = torch.randint(0, 3, (4, 5)).float()
    values = torch.empty(0, device="hologram")
    indices = torch.empty(0, dtype=torch.long, device="hologram")
    torch.mode(c.to("hologram"), 1, out=(values, indices))
    want = torch.mode(c, 1)
    assert torch.equal(values.cpu(), want.values) and torch.equal(indices.cpu(), want.indices)
