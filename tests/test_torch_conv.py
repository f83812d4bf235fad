"""Convolutions on the hologram device against the CPU, forward and backward: 1-3d, strides,
padding (numbers, 'same'/'valid', every padding mode), dilation, groups, transposed; and
the other ops whose default kernel raises for a PrivateUse1 device."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402

F = torch.nn.functional
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _check(fn, *inputs, dtype=torch.float32):
    """``fn`` on the device against the CPU: values and the gradient of every input."""
    inputs = [t.to(dtype).requires_grad_() if t is not None else None for t in inputs]
    ref = fn(*inputs)
    device_inputs = [t.detach().to("hologram").requires_grad_() if t is not None else None
                     for t in inputs]
    got = fn(*device_inputs)
    assert got.device.type == "hologram"
    torch.testing.assert_close(got.cpu(), ref, **TOL)
    weight = torch.randn_like(ref)
    (ref * weight).sum().backward()
    (got * weight.to("hologram")).sum().backward()
    for d, c in zip(device_inputs, inputs):
        if c is not None:
            torch.testing.assert_close(d.grad.cpu(), c.grad, **TOL)


CASES = [  # (dims, in channels, out channels, kwargs)
    (1, 3, 4, {}),
    (1, 4, 6, {"stride": 2, "padding": 1, "dilation": 2, "groups": 2}),
    (2, 3, 4, {"padding": 1}),
    (2, 4, 8, {"stride": (2, 1), "padding": (0, 2), "dilation": (1, 2), "groups": 4}),
    (2, 3, 5, {"padding": "same", "dilation": 2}),
    (2, 3, 5, {"padding": "valid"}),
    (3, 2, 4, {"stride": 2, "padding": 1}),
    (3, 4, 4, {"groups": 2, "dilation": (1, 2, 1)}),
]


@pytest.mark.parametrize("dims, cin, cout, kwargs", CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_matches_cpu(dims, cin, cout, kwargs, bias):
    torch.manual_seed(dims + cin + cout)
    conv = (F.conv1d, F.conv2d, F.conv3d)[dims - 1]
    size = (9, 7, 6)[:dims]
    x = torch.randn(2, cin, *size)
    w = torch.randn(cout, cin // kwargs.get("groups", 1), *(3,) * dims)
    b = torch.randn(cout) if bias else None
    _check(lambda x, w, b: conv(x, w, b, **kwargs), x, w, b)


TRANSPOSED = [
    (1, 3, 4, {"stride": 2, "output_padding": 1}),
    (2, 4, 6, {"stride": 2, "padding": 1, "groups": 2, "dilation": 2}),
    (2, 3, 2, {"stride": (1, 2), "output_padding": (0, 1)}),
    (3, 2, 3, {"stride": 2, "padding": 1}),
]


@pytest.mark.parametrize("dims, cin, cout, kwargs", TRANSPOSED)
def test_conv_transpose_matches_cpu(dims, cin, cout, kwargs):
    torch.manual_seed(dims * cin)
    conv = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[dims - 1]
    x = torch.randn(2, cin, *(5, 4, 3)[:dims])
    w = torch.randn(cin, cout // kwargs.get("groups", 1), *(3,) * dims)
    _check(lambda x, w, b: conv(x, w, b, **kwargs), x, w, torch.randn(cout))


@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
def test_padding_modes_match_cpu(mode):
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(3, 4, 3, padding=2, padding_mode=mode)

    def forward(x, w, b):
        return torch.func.functional_call(conv, {"weight": w, "bias": b}, (x,))

    _check(forward, torch.randn(2, 3, 8, 8), conv.weight.detach(), conv.bias.detach())


def test_float64_and_channels_last_match_cpu():
    torch.manual_seed(2)
    x = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    _check(lambda x, w: F.conv2d(x, w, padding=1), x, torch.randn(4, 3, 3, 3),
           dtype=torch.float64)
    _check(lambda x, w: F.conv2d(x, w, padding=1), x, torch.randn(4, 3, 3, 3))


def test_convolutions_are_counted_as_fallbacks():
    hologram_torch.reset_fallback_stats()
    x = torch.randn(1, 2, 5, 5, device="hologram", requires_grad=True)
    w = torch.randn(3, 2, 3, 3, device="hologram", requires_grad=True)
    F.conv2d(x, w, stride=2, padding=1).sum().backward()
    F.conv_transpose2d(x, w.transpose(0, 1)).sum().backward()
    assert hologram_torch.fallback_stats() == {
        "aten.convolution_overrideable.default": 2,
        "aten.convolution_backward_overrideable.default": 2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_match_cpu_exactly(dtype):
    torch.manual_seed(7)
    x = torch.randn(2, 2, 6, 6).to(dtype)
    w = torch.randn(3, 2, 3, 3).to(dtype)
    hologram_torch.reset_fallback_stats()
    with pytest.warns(hologram_torch.FallbackWarning, match="convolution_overrideable"):
        got = F.conv2d(x.to("hologram"), w.to("hologram"), padding=1)
    torch.testing.assert_close(got.cpu(), F.conv2d(x, w, padding=1), rtol=0, atol=0)
    assert hologram_torch.fallback_stats() == {"aten.convolution_overrideable.default": 1}


def test_complex_convolutions_match_cpu():
    # PyTorch computes a complex convolution as three real ones.
    torch.manual_seed(8)
    x = torch.randn(1, 2, 5, 5, dtype=torch.complex64)
    w = torch.randn(3, 2, 3, 3, dtype=torch.complex64)
    torch.testing.assert_close(F.conv2d(x.to("hologram"), w.to("hologram")).cpu(),
                               F.conv2d(x, w), **TOL)


def test_double_backward_matches_cpu():
    torch.manual_seed(3)
    results = []
    for device in ("cpu", "hologram"):
        x = torch.randn(1, 2, 5, 5, generator=torch.Generator().manual_seed(4)).to(device)
        w = torch.randn(3, 2, 3, 3, generator=torch.Generator().manual_seed(5)).to(device)
        x.requires_grad_()
        w.requires_grad_()
        (gx,) = torch.autograd.grad(F.conv2d(x, w).square().sum(), x, create_graph=True)
        (gw,) = torch.autograd.grad(gx.square().sum(), w)
        results.append((gx.detach().cpu(), gw.cpu()))
    for got, ref in zip(results[1], results[0]):
        torch.testing.assert_close(got, ref, **TOL)


def test_torch_errors_are_torch_errors():
    x = torch.randn(1, 3, 5, 5)
    w = torch.randn(4, 2, 3, 3)  # 2 input channels for a 3-channel input
    with pytest.raises(RuntimeError) as cpu_error:
        F.conv2d(x, w)
    with pytest.raises(RuntimeError) as device_error:
        F.conv2d(x.to("hologram"), w.to("hologram"))
    assert str(device_error.value) == str(cpu_error.value)


def test_attention_runs_and_its_overrideable_kernel_raises_as_on_cpu():
    # PyTorch picks the fused-attention "overrideable" op only where a C++ dispatch stub
    # chooses it for the device; the Python device gets the math path (native ops).
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 2, 5, 4) for _ in range(3))
    _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)
    op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable
    with pytest.raises(NotImplementedError) as cpu_error:
        op(q, k, v)
    with pytest.raises(NotImplementedError) as device_error:
        op(q.to("hologram"), k.to("hologram"), v.to("hologram"))
    assert str(device_error.value) == str(cpu_error.value)
