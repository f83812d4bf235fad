"""Result layouts on the device: every kernel's fresh results have the strides PyTorch's
CPU kernels give (channels_last in, channels_last out; ``a.t() * 2`` transposed), and the
values are the CPU's. The reference is always the CPU run of the same call."""

from __future__ import annotations

import random
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import hologram_torch  # noqa: E402
from hologram_torch.aten import layout  # noqa: E402

aten = torch.ops.aten


def _permuted(shape, order, dtype=torch.float32, generator=None) -> torch.Tensor:
    """A dense CPU tensor of ``shape`` whose dimensions lie in memory in ``order``
    (outermost first)."""
    physical = torch.randn([shape[d] for d in order], dtype=dtype, generator=generator)
    return physical.permute([order.index(d) for d in range(len(shape))])


# --- the rule itself, against TensorIterator ---------------------------------------------

def _random_operand(rng: random.Random, shape) -> torch.Tensor:
    """A CPU operand broadcastable to ``shape``: fewer dimensions, size-1 dimensions,
    any order in memory, sometimes with gaps (a slice)."""
    rank = rng.randint(0, len(shape)) if rng.random() < 0.3 else len(shape)
    own = [1 if rng.random() < 0.25 else n for n in shape[len(shape) - rank:]]
    order = list(range(rank))
    rng.shuffle(order)
    if rng.random() < 0.2 and rank:  # not dense: every other element of a longer dim
        d = rng.randrange(rank)
        big = list(own)
        big[d] *= 2
        return _permuted(big, order).narrow(d, 0, own[d]) if own[d] else _permuted(own, order)
    return _permuted(own, order)


def test_elementwise_rule_is_tensor_iterators():
    rng = random.Random(0)
    for _ in range(600):
        shape = [rng.choice((1, 2, 3, 4, 5)) for _ in range(rng.randint(1, 5))]
        if rng.random() < 0.05:
            shape[rng.randrange(len(shape))] = 0
        operands = [_random_operand(rng, shape) for _ in range(rng.randint(1, 3))]
        operands[0] = operands[0].expand(shape) if rng.random() < 0.1 else operands[0]
        fn = (torch.neg, torch.add, torch.addcmul)[len(operands) - 1]
        if len(operands) == 1 and list(operands[0].shape) != shape:
            operands.append(torch.zeros(()))  # a 0-d operand
            fn = torch.add
        expected = fn(*operands) if len(operands) > 1 else fn(operands[0]).expand(shape)
        if list(expected.shape) != shape or expected.numel() == 0:
            continue
        got = layout.elementwise(shape, operands)
        assert got == expected.stride(), (shape, [(o.shape, o.stride()) for o in operands])


def test_cpu_scalars_do_not_decide():
    x = _permuted((2, 3, 4, 5), (0, 2, 3, 1))
    assert layout.elementwise(x.shape, (torch.tensor(2.0), x)) == (x * 2).stride()


# --- device results against the CPU -------------------------------------------------------

CHANNELS_LAST = ((2, 3, 4, 5), (0, 2, 3, 1))
CHANNELS_LAST_3D = ((2, 3, 2, 4, 3), (0, 2, 3, 4, 1))
TRANSPOSED = ((4, 6), (1, 0))
PERMUTED_3D = ((3, 4, 5), (2, 0, 1))
LAYOUTS = {"channels_last": CHANNELS_LAST, "channels_last_3d": CHANNELS_LAST_3D,
           "transposed": TRANSPOSED, "permuted_3d": PERMUTED_3D,
           "contiguous": ((2, 3, 4, 5), (0, 1, 2, 3))}

UNARY = {
    "add": lambda x: x + x, "mul_number": lambda x: x * 2,
    "sub_0d": lambda x: x - x[(0,) * x.dim()],
    "div": lambda x: x / (x.abs() + 1), "relu": torch.relu, "exp": torch.exp,
    "round": torch.round, "clip": lambda x: x.clip(-0.5, 0.5), "neg": torch.neg,
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "gelu": F.gelu, "silu": F.silu,
    "leaky_relu": F.leaky_relu, "hardtanh": F.hardtanh, "pow": lambda x: x ** 2,
    "where": lambda x: torch.where(x > 0, x, 0.0), "eq": lambda x: x == 0,
    "lerp": lambda x: torch.lerp(x, -x, 0.25), "addcmul": lambda x: torch.addcmul(x, x, x),
    "maximum": lambda x: torch.maximum(x, -x), "to_half": lambda x: x.half(),
    "to_int": lambda x: (x * 10).int(), "clone": torch.clone,
    "clone_contiguous": lambda x: x.clone(memory_format=torch.contiguous_format),
    "contiguous": lambda x: x.contiguous(), "masked_fill": lambda x: x.masked_fill(x > 0, 1.0),
    "softmax": lambda x: x.softmax(-1), "log_softmax": lambda x: F.log_softmax(x, 0),
    "sum_keepdim": lambda x: x.sum(-1, keepdim=True), "mean": lambda x: x.mean(0),
    "cat": lambda x: torch.cat([x, x], -1), "broadcast_row": lambda x: x + x[..., :1],
    "sigmoid_backward": lambda x: aten.sigmoid_backward(x, x.sigmoid()),
    "threshold_backward": lambda x: aten.threshold_backward(x, x, 0.0),
}
IMAGES = {  # 4-d (N, C, H, W) inputs
    "max_pool2d": lambda x: F.max_pool2d(x, 2), "avg_pool2d": lambda x: F.avg_pool2d(x, 2),
    "adaptive_avg_pool2d": lambda x: F.adaptive_avg_pool2d(x, 1),
    "batch_norm": lambda x: F.batch_norm(x, None, None, training=True),
    "batch_norm_eval": lambda x: F.batch_norm(x, torch.zeros(3, device=x.device),
                                              torch.ones(3, device=x.device)),
    "interpolate_nearest": lambda x: F.interpolate(x, scale_factor=2),
    "interpolate_bilinear": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "conv2d": lambda x: F.conv2d(x, torch.ones(4, 3, 3, 3, device=x.device)),
    "layer_norm": lambda x: F.layer_norm(x, (5,)),
}


def _both(fn, x: torch.Tensor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fallbacks (conv, interpolate) warn once
        return fn(x), fn(x.to("hologram"))


def _check(expected: torch.Tensor, got: torch.Tensor) -> None:
    assert got.device.type == "hologram"
    assert got.shape == expected.shape
    assert got.stride() == expected.stride(), (got.stride(), expected.stride())
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("kind", sorted(LAYOUTS))
def test_results_have_the_cpus_strides(name, kind):
    shape, order = LAYOUTS[kind]
    x = _permuted(shape, order, generator=torch.Generator().manual_seed(1))
    expected, got = _both(UNARY[name], x)
    _check(expected, got)


@pytest.mark.parametrize("name", sorted(IMAGES))
@pytest.mark.parametrize("kind", ["channels_last", "contiguous"])
def test_image_results_have_the_cpus_strides(name, kind):
    shape, order = LAYOUTS[kind]
    x = _permuted(shape, order, generator=torch.Generator().manual_seed(2))
    expected, got = _both(IMAGES[name], x)
    _check(expected, got)


@pytest.mark.parametrize("fmt", [torch.channels_last, torch.channels_last_3d])
def test_empty_results_are_laid_out_as_the_cpus(fmt):
    """An empty tensor is contiguous in every format: TensorIterator then takes the
    contiguous layout when the operands share a shape and orders by strides when they do
    not, which the meta kernels do not (the empty batch norm of PyTorch's module tests is
    ``x.clone() * weight[0] + bias[0]``)."""
    shape = (0, 3, 4, 5) if fmt is torch.channels_last else (0, 3, 2, 4, 5)
    x = torch.randn(shape).to(memory_format=fmt)
    w = torch.tensor(2.0)
    norm = torch.nn.BatchNorm2d(3) if x.dim() == 4 else torch.nn.BatchNorm3d(3)
    cases = (lambda x, w: x * w, lambda x, w: x + x, lambda x, w: torch.relu(x) - w,
             lambda x, w: x.sigmoid() * x)
    for training in (True, False):
        norm.train(training)
        expected, got = norm(x), norm.to("hologram")(x.to("hologram"))
        _check(expected, got)
        norm.cpu()
    for fn in cases:
        _check(fn(x, w), fn(x.to("hologram"), w.to("hologram")))


def test_mixed_layouts_follow_the_first_operand_that_tells():
    a = _permuted((3, 4, 5), (2, 0, 1))
    b = _permuted((3, 4, 5), (1, 2, 0))
    for x, y in ((a, b), (b, a), (a, torch.randn(5)), (torch.randn(4, 1), b)):
        expected = x * y
        got = x.to("hologram") * y.to("hologram")
        _check(expected, got)


def test_repeated_calls_keep_the_layout():
    """The second and later calls take the remembered kernel (and the native front
    kernel, where it is built): the same strides as the first."""
    x = _permuted(*CHANNELS_LAST).to("hologram")
    t = torch.randn(4, 6).t().to("hologram")
    for _ in range(4):
        assert (x + x).stride() == (60, 1, 15, 3)
        assert x.relu().stride() == (60, 1, 15, 3)
        assert (x * 3).stride() == (60, 1, 15, 3)
        assert (t * 2).stride() == (1, 6)
        assert (t + t).stride() == (1, 6)


def test_dropout_draws_as_the_cpu_in_any_layout():
    x = _permuted(*CHANNELS_LAST)
    torch.manual_seed(5)
    expected = F.dropout(x, 0.5)
    torch.manual_seed(5)
    got = F.dropout(x.to("hologram"), 0.5)
    _check(expected, got)


def test_training_step_keeps_channels_last_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                                torch.nn.ReLU(), torch.nn.MaxPool2d(2))
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    device_model = __import__("copy").deepcopy(model).to("hologram")
    model = model.to(memory_format=torch.channels_last)
    device_model = device_model.to(memory_format=torch.channels_last)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model(x.requires_grad_())
        xd = x.detach().to("hologram").requires_grad_()
        got = device_model(xd)
        expected.sum().backward()
        got.sum().backward()
    assert got.stride() == expected.stride()
    assert xd.grad.stride() == x.grad.stride()
    torch.testing.assert_close(xd.grad.cpu(), x.grad, atol=1e-4, rtol=1e-4)


# --- resize_ --------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [torch.channels_last, torch.contiguous_format])
def test_resize_takes_the_memory_format(fmt):
    for device in ("cpu", "hologram"):
        a = torch.zeros(24, device=device)
        a.resize_(2, 3, 4, 5, memory_format=fmt)
        b = torch.zeros(2, 3, 4, 5, device=device).to(memory_format=torch.channels_last)
        b.resize_(2, 3, 4, 5, memory_format=fmt)
        if device == "cpu":
            expected = (a.stride(), b.stride())
        else:
            assert (a.stride(), b.stride()) == expected


def test_resize_to_its_own_size_keeps_the_strides():
    for make in (lambda d: torch.zeros(3, 4, device=d).t(),
                 lambda d: torch.zeros(2, 3, 4, 5, device=d).to(memory_format=torch.channels_last)):
        cpu, dev = make("cpu"), make("hologram")
        cpu.resize_(cpu.shape)
        dev.resize_(dev.shape)
        assert dev.stride() == cpu.stride()
    with pytest.raises(RuntimeError, match="Unsupported memory format"):
        torch.zeros(3, device="hologram").resize_(4, memory_format=torch.preserve_format)


def test_fallback_results_keep_the_cpus_layout():
    x = _permuted(*CHANNELS_LAST)
    weight = torch.randn(4, 3, 3, 3)
    expected = F.conv2d(x, weight)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = F.conv2d(x.to("hologram"), weight.to("hologram"))
    assert expected.is_contiguous(memory_format=torch.channels_last)
    _check(expected, got)


def test_fallback_out_arguments_are_laid_out_as_the_cpus():
    """A CPU kernel run through the fallback restrides its out= (a channels_last pad); a
    given out= keeps its layout where the CPU kernel keeps it; a size-1 dimension's stride
    is the CPU's too (argwhere)."""
    x = _permuted(*CHANNELS_LAST)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _check(F.pad(x, (-1, 1, -1, 1), mode="replicate"),
               F.pad(x.to("hologram"), (-1, 1, -1, 1), mode="replicate"))
        r = torch.randn(4, 4)
        for make in (lambda d: torch.empty(4, 4, device=d).t(), lambda d: torch.empty(0, device=d)):
            expected, got = make("cpu"), make("hologram")
            torch.cumsum(r.t(), 0, out=expected)
            torch.cumsum(r.t().to("hologram"), 0, out=got)
            _check(expected, got)
        v = torch.tensor([1.0, 0.0, 2.0, 3.0])
        _check(torch.argwhere(v), torch.argwhere(v.to("hologram")))


def _opinfo_layout_cases():
    from torch_device.ops.test_opinfo import _opinfo_names

    return _opinfo_names()


def _permute_sample_tensor(x):
    """A dense copy of ``x`` in another layout: channels_last for 4-d, reversed otherwise."""
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.layout is not torch.strided:
        return x
    if x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    order = list(range(x.dim()))[::-1]
    return x.permute(order).contiguous().permute(order)


@pytest.mark.parametrize("name", _opinfo_layout_cases())
def test_opinfo_results_have_the_cpus_strides(name):
    """PyTorch's OpInfo samples of every native entry, with permuted (channels_last,
    reversed) inputs: the device's results have the CPU's strides and values."""
    from torch.testing._internal.common_methods_invocations import op_db

    from torch_device.ops.test_opinfo import _key

    compared = 0
    for op in (o for o in op_db if _key(o) == name):
        dtype = next((d for d in (torch.float32, torch.int64, torch.bool)
                      if d in op.supported_dtypes("cpu")), None)
        if dtype is None:
            continue
        for i, sample in enumerate(op.sample_inputs("cpu", dtype)):
            if i == 3:
                break
            sample = sample.transform(_permute_sample_tensor)
            try:
                expected = op(sample.input, *sample.args, **sample.kwargs)
            except Exception:  # the CPU rejects it: OpInfo's own tests cover the error
                continue
            on_device = sample.transform(
                lambda t: t.to("hologram") if isinstance(t, torch.Tensor) else t)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = op(on_device.input, *on_device.args, **on_device.kwargs)
            pairs = (zip(expected, got) if isinstance(expected, (tuple, list))
                     else [(expected, got)])
            for e, g in pairs:
                if isinstance(e, torch.Tensor):
                    assert g.shape == e.shape, (i, g.shape, e.shape)
                    if e.numel() > 1:  # (a stride of size 1 or 0 is meaningless)
                        assert g.stride() == e.stride(), (i, g.stride(), e.stride())
                    compared += 1
    assert compared, f"{name}: no sample compared"


def test_channel_shuffle_is_the_cpus_without_the_cpu():
    hologram_torch.reset_fallback_stats()
    for x in (torch.randn(2, 6, 3, 4), torch.randn(2, 6, 3, 4).to(
            memory_format=torch.channels_last), torch.randn(3, 12, 5), torch.randn(0, 6, 2, 2),
              torch.randn(2, 6, 3, 4).transpose(2, 3), torch.arange(24).reshape(1, 6, 4)):
        for groups in (1, 2, 3, 6):
            _check(F.channel_shuffle(x, groups), F.channel_shuffle(x.to("hologram"), groups))
    assert hologram_torch.fallback_stats(lacking=False) == {}
    for shape, groups in (((6, 4), 2), ((2, 6, 4), 0), ((2, 6, 4), 4)):
        with pytest.raises(RuntimeError) as expected:
            F.channel_shuffle(torch.randn(shape), groups)
        with pytest.raises(RuntimeError) as got:
            F.channel_shuffle(torch.randn(shape, device="hologram"), groups)
        assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("kind", ["channels_last", "contiguous", "permuted_3d"])
def test_pixel_shuffles_are_laid_out_as_the_cpus(kind):
    shape, order = {"channels_last": ((2, 9, 2, 4), (0, 2, 3, 1)),
                    "contiguous": ((2, 3, 9, 2, 4), (0, 1, 2, 3, 4)),
                    "permuted_3d": ((9, 2, 4), (2, 0, 1))}[kind]
    x = _permuted(shape, order)
    xd = x.to("hologram").requires_grad_()
    x.requires_grad_()
    for fn in (lambda t: F.pixel_shuffle(t, 3), lambda t: F.pixel_unshuffle(t, 2)):
        expected, got = fn(x), fn(xd)
        _check(expected.detach(), got.detach())
        expected.square().sum().backward()
        got.square().sum().backward()
        _check(x.grad, xd.grad)
        x.grad = xd.grad = None
    for bad in (lambda d: F.pixel_shuffle(torch.ones(2, 8, 2, 2, device=d), 3),
                lambda d: F.pixel_shuffle(torch.ones(2, 2, device=d), 3),
                lambda d: F.pixel_unshuffle(torch.ones(1, 1, 5, 4, device=d), 2),
                lambda d: F.pixel_unshuffle(torch.ones(1, 1, 4, 4, device=d), 0)):
        with pytest.raises(RuntimeError) as cpu:
            bad("cpu")
        with pytest.raises(RuntimeError, match=__import__("re").escape(str(cpu.value))):
            bad("hologram")


@pytest.mark.parametrize("shape, fmt", [((2, 4, 3, 5), torch.channels_last),
                                        ((2, 4, 3, 5, 2), torch.channels_last_3d),
                                        ((2, 4, 3, 5), torch.contiguous_format),
                                        ((3, 6, 7), torch.contiguous_format)])
def test_group_norm_takes_every_layout_as_the_cpu(shape, fmt):
    """Group norm of a channels_last input (PyTorch's composite kernel views it, which
    failed on the device): the CPU's values, layout and gradients."""
    x = torch.randn(shape).to(memory_format=fmt)
    weight, bias = torch.randn(shape[1]), torch.randn(shape[1])
    xd = x.to("hologram").requires_grad_()
    x.requires_grad_()
    expected = F.group_norm(x, 2, weight, bias)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = F.group_norm(xd, 2, weight.to("hologram"), bias.to("hologram"))
        expected.square().sum().backward()
        got.square().sum().backward()
    _check(expected.detach(), got.detach())
    assert xd.grad.stride() == x.grad.stride()
    torch.testing.assert_close(xd.grad.cpu(), x.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("make", [lambda d: torch.zeros(0, 3, 4, 5, device=d).to(
                                      memory_format=torch.channels_last),
                                  lambda d: torch.zeros(2, 1, 4, 5, device=d).to(
                                      memory_format=torch.channels_last),
                                  lambda d: torch.zeros(3, 1, device=d).t(),
                                  lambda d: torch.zeros(4, 3, device=d)[:, ::2]])
def test_clone_is_laid_out_as_empty_like(make):
    """clone keeps a dense tensor's own strides (an empty or size-1 dimension's too, which
    TensorIterator's rule would recompute) and orders a strided one as TensorIterator."""
    expected = make("cpu").clone()
    for _ in range(2):  # the second call is served by the front kernel
        assert make("hologram").clone().stride() == expected.stride()


@pytest.mark.parametrize("kind", ["channels_last", "transposed", "permuted_3d"])
def test_resized_out_arguments_are_laid_out_like_the_inputs(kind):
    """An out= tensor of another shape is resized and laid out as TensorIterator lays out
    its own outputs (PyTorch's test_strides_propagation); one of the right shape keeps its
    strides."""
    x = _permuted(*LAYOUTS[kind])
    for op in (lambda a, out: torch.add(a, a, out=out), lambda a, out: torch.exp(a, out=out),
               lambda a, out: torch.clamp(a, 0, 1, out=out),
               lambda a, out: torch.where(a > 0, a, -a, out=out),
               lambda a, out: torch.mul(a, 2, out=out)):
        expected, got = torch.empty(0), torch.empty(0, device="hologram")
        op(x, expected)
        op(x.to("hologram"), got)
        _check(expected, got)
        kept = torch.empty(x.shape, device="hologram")
        op(x.to("hologram"), kept)
        assert kept.is_contiguous()
