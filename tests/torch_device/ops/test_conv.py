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


EDGES = {  # name: (transposed, input shape, weight shape, bias, kwargs)
    "batch 1": (False, (1, 3, 6, 5), (4, 3, 3, 3), True, {"padding": 1}),
    "1x1 kernel": (False, (2, 5, 4, 4), (3, 5, 1, 1), True, {"stride": 2}),
    # (the weight's gradient: a product per sample, summed over the samples)
    "1x1 kernel at stride 1": (False, (3, 6, 8, 9), (4, 6, 1, 1), True, {}),
    "grouped 1x1 kernel at stride 1": (False, (2, 6, 8, 8), (4, 3, 1, 1), False,
                                       {"groups": 2}),
    "1d 1x1 kernel at stride 1": (False, (2, 3, 70), (5, 3, 1), True, {}),
    "kernel as large as the padded input": (False, (2, 3, 4, 5), (2, 3, 6, 7), True,
                                            {"padding": 1}),
    "1d kernel as large as the input": (False, (3, 2, 5), (4, 2, 5), True, {}),
    "empty batch": (False, (0, 3, 5, 5), (4, 3, 3, 3), True, {"padding": 1}),
    "depthwise": (False, (2, 6, 7, 7), (6, 1, 3, 3), True, {"padding": 1, "groups": 6}),
    "depthwise, two per channel": (False, (2, 3, 6, 6), (6, 1, 3, 3), False,
                                   {"stride": 2, "groups": 3}),
    "no bias, stride beyond the kernel": (False, (2, 3, 9, 9), (4, 3, 2, 2), False,
                                          {"stride": 3}),
    "3d depthwise": (False, (1, 4, 4, 5, 3), (4, 1, 2, 3, 1), True,
                     {"padding": (1, 0, 1), "groups": 4}),
    "padding beyond the dilated kernel": (False, (2, 3, 5, 4), (4, 3, 3, 2), True,
                                          {"padding": (3, 2)}),
    "transposed, stride 1, output_padding under the dilation": (
        True, (2, 3, 5, 5), (3, 4, 3, 3), True, {"dilation": 2, "output_padding": 1}),
    "transposed, batch 1": (True, (1, 3, 4, 4), (3, 2, 3, 3), True,
                            {"stride": 3, "dilation": 2, "output_padding": 1}),
    "transposed, 1x1 kernel": (True, (2, 4, 3, 5), (4, 3, 1, 1), True, {"stride": 2}),
    "transposed, empty batch": (True, (0, 3, 4, 4), (3, 2, 3, 3), True, {"stride": 2}),
    "transposed depthwise": (True, (2, 4, 5, 5), (4, 1, 3, 3), False,
                             {"padding": 1, "groups": 4}),
}


@pytest.mark.parametrize("name", EDGES)
def test_edge_cases_match_cpu(name):
    transposed, x_shape, w_shape, bias, kwargs = EDGES[name]
    torch.manual_seed(len(name))
    dims = len(x_shape) - 2
    if transposed:
        conv = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[dims - 1]
        channels = w_shape[1] * kwargs.get("groups", 1)
    else:
        conv = (F.conv1d, F.conv2d, F.conv3d)[dims - 1]
        channels = w_shape[0]
    b = torch.randn(channels) if bias else None
    hologram_torch.reset_fallback_stats()
    _check(lambda x, w, b: conv(x, w, b, **kwargs), torch.randn(x_shape), torch.randn(w_shape),
           b)
    assert hologram_torch.fallback_stats(lacking=False) == {}


@pytest.mark.parametrize("transposed", [False, True])
def test_non_contiguous_operands_match_cpu(transposed):
    torch.manual_seed(9)
    conv = F.conv_transpose2d if transposed else F.conv2d

    def fn(x, w, b):
        # x: every other column of a transposed image; w: a transposed kernel
        return conv(x.transpose(2, 3)[..., ::2], w.transpose(2, 3), b, stride=2, padding=1)

    _check(fn, torch.randn(2, 4, 10, 5), torch.randn(4, 4, 2, 3), torch.randn(4))


def test_a_recorded_training_step_matches_eager():
    def step():
        torch.manual_seed(10)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(6, 6, 3, stride=2, groups=3), torch.nn.ReLU(),
            torch.nn.ConvTranspose2d(6, 2, 2, stride=2)).to("hologram")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(2, 3, 9, 9).to("hologram")
        for _ in range(3):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
        return [p.detach().cpu() for p in model.parameters()]

    hologram_torch.reset_fallback_stats()
    with hologram_torch.set_lazy(False):
        want = step()
    with hologram_torch.set_lazy(True):
        got = step()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert hologram_torch.fallback_stats(lacking=False) == {}


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


def test_convolutions_run_on_the_device_and_the_rest_falls_back():
    hologram_torch.reset_fallback_stats()
    x = torch.randn(1, 2, 5, 5, device="hologram", requires_grad=True)
    w = torch.randn(3, 2, 3, 3, device="hologram", requires_grad=True)
    F.conv2d(x, w, stride=2, padding=1).sum().backward()
    F.conv_transpose2d(x, w.transpose(0, 1)).sum().backward()
    assert hologram_torch.fallback_stats(lacking=False) == {}
    # integer convolutions are left to the CPU's kernel (complex ones are three real
    # convolutions above these ops, so they run on the device)
    xi, wi = torch.randint(-3, 4, (1, 2, 5, 5)), torch.randint(-3, 4, (3, 2, 3, 3))
    got = F.conv2d(xi.to("hologram"), wi.to("hologram"), padding=1)
    assert torch.equal(got.cpu(), F.conv2d(xi, wi, padding=1))
    assert hologram_torch.fallback_stats() == {"aten.convolution_overrideable.default": 1}


LAYOUTS = {  # name: (dims, dtype, transposed, channels_last (input, weight), kwargs)
    "2d, channels_last input": (2, torch.float32, False, (True, False), {"padding": 1}),
    "2d, channels_last weight": (2, torch.float64, False, (False, True), {"stride": 2}),
    "2d transposed": (2, torch.float32, True, (True, False), {"stride": 2}),
    "3d, channels_last input": (3, torch.float32, False, (True, False), {"groups": 2}),
    "3d float64 (slow path: contiguous)": (3, torch.float64, False, (True, True), {}),
    "3d transposed, output_padding at the stride (slow path: contiguous)": (
        3, torch.float32, True, (True, False), {"dilation": 2, "output_padding": 1}),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_results_and_gradients_have_the_cpus_layout(name):
    dims, dtype, transposed, (x_last, w_last), kwargs = LAYOUTS[name]
    fmt = torch.channels_last if dims == 2 else torch.channels_last_3d
    torch.manual_seed(11)
    x = torch.randn(2, 4, *(5,) * dims, dtype=dtype)
    w = torch.randn(4, 4 // kwargs.get("groups", 1) if not transposed else 3, *(3,) * dims,
                    dtype=dtype)
    x = x.to(memory_format=fmt) if x_last else x
    w = w.to(memory_format=fmt) if w_last else w
    conv = getattr(F, f"conv{'_transpose' if transposed else ''}{dims}d")
    results = []
    for device in ("cpu", "hologram"):
        xd = x.detach().to(device).requires_grad_()
        wd = w.detach().to(device).requires_grad_()
        y = conv(xd, wd, **kwargs)
        y.backward(torch.ones_like(y))
        results.append([t.stride() for t in (y, xd.grad, wd.grad)])
    assert results[1] == results[0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_match_cpu_exactly(dtype):
    torch.manual_seed(7)
    x = torch.randn(2, 2, 6, 6).to(dtype)
    w = torch.randn(3, 2, 3, 3).to(dtype)
    hologram_torch.reset_fallback_stats()
    # computed in float32 and rounded once, as the CPU's kernel does
    got = F.conv2d(x.to("hologram"), w.to("hologram"), padding=1)
    torch.testing.assert_close(got.cpu(), F.conv2d(x, w, padding=1), rtol=0, atol=0)
    assert hologram_torch.fallback_stats(lacking=False) == {}


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
