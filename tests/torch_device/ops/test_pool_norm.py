"""Pooling, batch normalization, hardswish/hardsigmoid and tril/triu on the device against
PyTorch's CPU kernels: the edge cases OpInfo's samples leave out (NaN and infinities in
max pooling windows, ties, dilation with padding, ceil mode, integer dtypes, strided
inputs, empty batches, running statistics, mixed precision, in-place forms, torch's
errors), each checked to run natively (no CPU fallback)."""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import hologram_torch  # noqa: E402

DEVICE = "hologram"


def _device(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to(DEVICE).requires_grad_(x.requires_grad)
    return x


def _flat(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _flat(y)]
    return []


def check(fn, *inputs, atol=1e-5, rtol=1e-4, grad=True, allowed=()):
    """``fn`` on CPU tensors and on their device copies: equal values (NaN where torch has
    NaN; integer results exactly) and gradients w.r.t. the float inputs (``grad``: all,
    none, or a tuple of positions); no CPU fallback on the device but the ops in
    ``allowed``."""
    def differentiable(i, x):
        return x.dtype.is_floating_point and (i in grad if isinstance(grad, tuple) else grad)

    cpu_inputs = [x.detach().clone().requires_grad_(differentiable(i, x))
                  if isinstance(x, torch.Tensor) else x for i, x in enumerate(inputs)]
    dev_inputs = [_device(x) for x in cpu_inputs]
    expected = fn(*cpu_inputs)
    hologram_torch.reset_fallback_stats()
    actual = fn(*dev_inputs)
    for a, e in zip(_flat(actual), _flat(expected), strict=True):
        assert a.device.type == DEVICE
        torch.testing.assert_close(a.cpu(), e, atol=atol, rtol=rtol, equal_nan=True)
    leaves = [(c, d) for c, d in zip(cpu_inputs, dev_inputs)
              if isinstance(c, torch.Tensor) and c.requires_grad]
    outs = [(a, e) for a, e in zip(_flat(actual), _flat(expected)) if e.requires_grad]
    if leaves and outs:
        cotangents = [torch.randn_like(e) for _, e in outs]
        ge = torch.autograd.grad([e for _, e in outs], [c for c, _ in leaves], cotangents)
        ga = torch.autograd.grad([a for a, _ in outs], [d for _, d in leaves],
                                 [c.to(DEVICE) for c in cotangents])
        for a, e in zip(ga, ge):
            torch.testing.assert_close(a.cpu(), e, atol=atol, rtol=rtol, equal_nan=True)
    fallbacks = set(hologram_torch.fallback_stats(lacking=False)) - set(allowed)
    assert not fallbacks, f"ran on the CPU: {sorted(fallbacks)}"
    return actual


# --- max pooling --------------------------------------------------------------------------

def _with_indices(pool, **kwargs):
    return lambda x: pool(x, return_indices=True, **kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=1, padding=1, dilation=2),
    dict(kernel_size=(2, 3), stride=(2, 1), padding=(1, 0), ceil_mode=True),
    dict(kernel_size=3, stride=2, ceil_mode=True),
])
def test_max_pool2d_values_indices_gradients(kwargs):
    torch.manual_seed(0)
    check(_with_indices(F.max_pool2d, **kwargs), torch.randn(2, 3, 9, 8))
    check(_with_indices(F.max_pool2d, **kwargs), torch.randn(3, 7, 7))  # unbatched


def test_max_pool_1d_3d():
    torch.manual_seed(1)
    check(_with_indices(F.max_pool1d, kernel_size=3, stride=2, padding=1), torch.randn(2, 3, 11))
    check(_with_indices(F.max_pool3d, kernel_size=2, stride=(1, 2, 2), padding=1,
                        ceil_mode=True), torch.randn(2, 2, 4, 5, 5))
    check(_with_indices(F.max_pool3d, kernel_size=3, dilation=2), torch.randn(1, 2, 7, 6, 6))


def test_max_pool_nan_wins_and_last_nan_is_the_index():
    x = torch.tensor([[[[1.0, math.nan, 5.0, math.nan],
                        [math.nan, 2.0, -math.inf, 7.0],
                        [-math.inf, -math.inf, 0.0, -0.0],
                        [-math.inf, -math.inf, 3.0, 3.0]]]])
    _, index = check(_with_indices(F.max_pool2d, kernel_size=2), x, grad=False)
    assert index.cpu().tolist() == [[[[4, 3], [8, 14]]]]  # the last NaN; the first maximum
    check(_with_indices(F.max_pool2d, kernel_size=3, stride=1, padding=1), x, grad=False)
    check(_with_indices(F.max_pool2d, kernel_size=2), x.expand(2, 3, 4, 4) * 1, grad=False)


def test_max_pool_padding_is_never_the_index():
    x = torch.full((1, 1, 3, 3), -math.inf)  # every window's maximum is -inf
    check(_with_indices(F.max_pool2d, kernel_size=3, stride=2, padding=1), x)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8,
                                   torch.uint8, torch.float16, torch.bfloat16])
def test_max_pool_dtypes(dtype):
    torch.manual_seed(2)
    x = torch.randint(-100 if dtype.is_signed else 0, 100, (2, 3, 7, 6)).to(dtype)
    x[0, 0, :2, :2] = torch.iinfo(dtype).min if not dtype.is_floating_point else -math.inf
    check(_with_indices(F.max_pool2d, kernel_size=3, stride=2, padding=1), x, grad=False)


def test_max_pool_strided_input_and_empty_batch():
    torch.manual_seed(3)
    x = torch.randn(2, 6, 8, 3).permute(0, 3, 1, 2)  # channels last
    check(_with_indices(F.max_pool2d, kernel_size=2), x)
    check(_with_indices(F.max_pool2d, kernel_size=2), torch.randn(4, 3, 8, 8)[:, :, ::2, 1:])
    check(_with_indices(F.max_pool2d, kernel_size=2), torch.randn(0, 3, 8, 8))
    check(_with_indices(F.max_pool3d, kernel_size=2), torch.randn(0, 3, 4, 4, 4))


# --- average pooling ----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=(3, 2), stride=1, padding=(1, 1), divisor_override=5),
])
def test_avg_pool(kwargs):
    torch.manual_seed(4)
    check(lambda x: F.avg_pool2d(x, **kwargs), torch.randn(2, 3, 9, 8))
    extra = {"kernel_size": 2, "stride": 1, "padding": 0}
    kw3 = {k: v if not isinstance(v, tuple) else v + (extra[k],) for k, v in kwargs.items()}
    check(lambda x: F.avg_pool3d(x, **kw3), torch.randn(2, 2, 5, 6, 4))
    kw1 = {k: v if not isinstance(v, tuple) else v[0] for k, v in kwargs.items()
           if k != "divisor_override"}
    check(lambda x: F.avg_pool1d(x, **kw1), torch.randn(2, 3, 9))


def test_avg_pool_int64_truncates_as_torch():
    x = torch.arange(-40, 41).reshape(1, 1, 9, 9)
    check(lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), x, grad=False)
    check(lambda x: F.avg_pool2d(x, 2, divisor_override=3), x, grad=False)


def test_avg_pool_special_values_and_half():
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, 1, 1], x[0, 1, 4, 4] = math.nan, math.inf
    check(lambda x: F.avg_pool2d(x, 3, 2, 1), x)
    check(lambda x: F.avg_pool2d(x, 3, 2, 1), torch.randn(2, 3, 8, 8).half(), atol=1e-3,
          rtol=1e-3, grad=False)


# --- adaptive average pooling -------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, (4, 3)])
def test_adaptive_avg_pool(size):
    torch.manual_seed(5)
    check(lambda x: F.adaptive_avg_pool2d(x, size), torch.randn(2, 3, 7, 10))
    check(lambda x: F.adaptive_avg_pool2d(x, size), torch.randn(3, 8, 6).transpose(1, 2))
    n = size if isinstance(size, int) else size[0]
    check(lambda x: F.adaptive_avg_pool1d(x, n), torch.randn(2, 3, 11))
    check(lambda x: F.adaptive_avg_pool3d(x, n), torch.randn(1, 2, 5, 6, 7))


def test_adaptive_avg_pool_bfloat16_and_empty_batch():
    check(lambda x: F.adaptive_avg_pool2d(x, 3), torch.randn(2, 3, 7, 10).bfloat16(),
          atol=1e-2, rtol=1.6e-2, grad=False)
    check(lambda x: F.adaptive_avg_pool2d(x, 3), torch.randn(0, 3, 7, 10))


# --- pooling errors: torch's own ----------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda x: F.max_pool2d(x, 3, padding=2),            # padding over half the kernel
    lambda x: F.max_pool2d(x, 0),                        # empty kernel
    lambda x: F.avg_pool2d(x, 9),                        # output of size 0
    lambda x: F.avg_pool2d(x, 2, divisor_override=0),
    lambda x: F.max_pool2d(x.bool(), 2),                 # no bool kernel
])
def test_pool_errors_are_torchs(call):
    x = torch.randn(1, 1, 4, 4)
    with pytest.raises(RuntimeError) as expected:
        call(x)
    with warnings.catch_warnings(), pytest.raises(type(expected.value)) as actual:
        warnings.simplefilter("ignore", hologram_torch.FallbackWarning)
        call(x.to(DEVICE))
    assert str(actual.value).split("\n")[0] == str(expected.value).split("\n")[0]


# --- batch normalization ------------------------------------------------------------------

def _batch_norm(training, stats, affine, shape=(4, 3, 5, 5), dtype=torch.float32,
                param_dtype=None, momentum=0.1, atol=1e-5, rtol=1e-4):
    torch.manual_seed(6)
    c, pd = shape[1], param_dtype or dtype
    x = torch.randn(*shape).to(dtype) * 3 + 1
    weight = torch.randn(c, dtype=pd) if affine else None
    bias = torch.randn(c, dtype=pd) if affine else None
    mean = torch.randn(c, dtype=pd) if stats else None
    var = torch.rand(c, dtype=pd) + 0.5 if stats else None
    dev_mean, dev_var = _device(mean), _device(var)
    check(lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training, momentum, 1e-5),
          x, weight, bias, mean, var, atol=atol, rtol=rtol, grad=(0, 1, 2))
    # the running statistics move on the device as on the CPU
    F.batch_norm(x, mean, var, weight, bias, training, momentum)
    F.batch_norm(x.to(DEVICE), dev_mean, dev_var, _device(weight), _device(bias), training,
                 momentum)
    if stats:
        torch.testing.assert_close(dev_mean.cpu(), mean, atol=atol, rtol=rtol)
        torch.testing.assert_close(dev_var.cpu(), var, atol=atol, rtol=rtol)


@pytest.mark.parametrize("training, stats", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm(training, stats, affine):
    _batch_norm(training, stats, affine)


@pytest.mark.parametrize("shape", [(6, 4), (2, 3, 7), (2, 3, 2, 3, 4)])
def test_batch_norm_ranks(shape):
    _batch_norm(True, True, True, shape)
    _batch_norm(False, True, True, shape)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("param_dtype", [None, torch.float32])
def test_batch_norm_half_and_mixed_precision(dtype, param_dtype):
    _batch_norm(True, True, True, dtype=dtype, param_dtype=param_dtype, atol=2e-2, rtol=2e-2)
    _batch_norm(False, True, True, dtype=dtype, param_dtype=param_dtype, atol=2e-2, rtol=2e-2)


def test_batch_norm_direct_ops_and_special_values():
    torch.manual_seed(7)
    x = torch.randn(3, 2, 4)
    x[0, 0, 0] = math.nan
    x[1, 1, :] = math.inf
    w, b, m, v = torch.randn(2), torch.randn(2), torch.zeros(2), torch.ones(2)
    check(lambda x, w, b, m, v: torch.native_batch_norm(x, w, b, m, v, True, 0.3, 1e-3),
          x, w, b, m, v, grad=False)
    for training in (True, False):
        check(lambda x, w, b, m, v, t=training: torch.ops.aten._native_batch_norm_legit_functional(
            x, w, b, m, v, t, 0.2, 1e-5), torch.randn(3, 2, 4), w, b, m, v,
            grad=(0, 1, 2))
    check(lambda x: torch.ops.aten._native_batch_norm_legit.no_stats(
        x, None, None, True, 0.1, 1e-5), torch.randn(3, 2, 4))
    # One value per channel: the unbiased running variance is NaN, as torch's. (The output
    # is the rounding residue of x * invstd - mean * invstd: not compared.)
    x, m, v = torch.randn(1, 2), torch.zeros(2), torch.ones(2)
    dm, dv = m.to(DEVICE), v.to(DEVICE)
    torch.native_batch_norm(x, None, None, m, v, True, 0.1, 1e-5)
    torch.native_batch_norm(x.to(DEVICE), None, None, dm, dv, True, 0.1, 1e-5)
    torch.testing.assert_close((dm.cpu(), dv.cpu()), (m, v), equal_nan=True)
    assert v.isnan().all()


def test_batch_norm_strided_input():
    x = torch.randn(2, 5, 6, 3).permute(0, 3, 1, 2)  # channels last
    check(lambda x, m, v: F.batch_norm(x, m, v, None, None, True), x, torch.zeros(3),
          torch.ones(3), grad=(0,))


def test_batch_norm_empty_input_raises_torchs_error():
    x = torch.randn(0, 3, 4)
    with pytest.raises(RuntimeError) as expected:
        torch.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5)
    with warnings.catch_warnings(), pytest.raises(RuntimeError) as actual:
        warnings.simplefilter("ignore", hologram_torch.FallbackWarning)
        torch.native_batch_norm(x.to(DEVICE), None, None, None, None, True, 0.1, 1e-5)
    assert str(actual.value) == str(expected.value)


# --- hardswish, hardsigmoid ---------------------------------------------------------------

_SPECIAL = torch.tensor([-math.inf, -4.0, -3.0, -2.5, -0.0, 0.0, 1.0, 3.0, 3.5, math.inf,
                         math.nan])


@pytest.mark.parametrize("fn", [F.hardswish, F.hardsigmoid])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16,
                                   torch.bfloat16])
def test_hard_activations(fn, dtype):
    torch.manual_seed(8)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype in (torch.float32, torch.float64) \
        else dict(atol=1e-2, rtol=1e-2)
    for x in (_SPECIAL, torch.randn(5, 7) * 4, torch.randn(7, 5).t()):
        check(fn, x.to(dtype), grad=dtype in (torch.float32, torch.float64), **tol)
    x = (torch.randn(6) * 4).to(dtype)
    d = x.to(DEVICE)
    hologram_torch.reset_fallback_stats()
    assert fn(d, inplace=True) is d
    torch.testing.assert_close(d.cpu(), fn(x), **tol)
    assert not hologram_torch.fallback_stats(lacking=False)


# --- tril, triu ---------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [torch.tril, torch.triu])
@pytest.mark.parametrize("diagonal", [0, 1, -2, 7, -9])
def test_tril_triu(fn, diagonal):
    torch.manual_seed(9)
    x = torch.randn(2, 4, 6)
    x[0, 3, 0] = math.nan
    check(lambda x: fn(x, diagonal), x)
    check(lambda x: fn(x, diagonal), torch.randn(6, 4).t())
    for dtype in (torch.int64, torch.uint8, torch.bool, torch.float16):
        check(lambda x: fn(x, diagonal), torch.randint(0, 3, (3, 5)).to(dtype))
    check(lambda x: fn(x, diagonal), torch.randn(0, 3))
    y = torch.randn(5, 5)
    d = y.to(DEVICE)
    hologram_torch.reset_fallback_stats()
    getattr(d, fn.__name__ + "_")(diagonal)
    torch.testing.assert_close(d.cpu(), fn(y, diagonal))
    assert not hologram_torch.fallback_stats(lacking=False)


def test_large_overlapping_backward_runs_torchs_kernel():
    """Past the native formulations' work limit PyTorch's CPU kernel computes these (see
    ``hologram_torch.aten.pool.WORK_LIMIT``); the results are the same."""
    torch.manual_seed(10)
    x = torch.randn(4, 16, 48, 48)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hologram_torch.FallbackWarning)
        check(lambda x: F.max_pool2d(x, 3, 2, 1), x,
              allowed={"aten.max_pool2d_with_indices_backward.default"})
        check(lambda x: F.adaptive_avg_pool2d(x, 5), x,
              allowed={"aten._adaptive_avg_pool2d.default"})
    assert hologram_torch.fallback_stats() == {"aten._adaptive_avg_pool2d.default": 1}
