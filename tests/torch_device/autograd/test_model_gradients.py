"""First-step gradients of composed models on the hologram device, against a float64
reference on the CPU.

Each op's gradient is checked alone elsewhere (OpInfo); here the ops compose the way
training composes them: convolutions through the CPU fallback feeding batch norm, max
pooling, residual additions in place, recurrent cells, attention. For every parameter the
device's float32 gradient must be within 4x of the error of PyTorch's own float32 CPU
run, both measured against float64 in norm. An error of the order of float32's rounding of
the model's typical gradient element counts as zero, so that a parameter whose true
gradient is 0 or tiny (the bias of a convolution followed by batch norm) is not judged on
the ratio of two rounding noises (docs/torch.md, "Gradient accuracy of whole models",
has the measured errors)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402 (registers the device)
from hologram_torch import native  # noqa: E402
from torch_device.models.test_models import Recurrent, SmallCNN, TokenModel  # noqa: E402

nn = torch.nn
F = torch.nn.functional

RATIO = 4.0
FLOOR = 1e-7  # per element, relative to the root mean square of all the model's gradients


class BasicBlock(nn.Module):
    """torchvision's ResNet basic block: the ReLU in place, the residual added in place."""

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """ResNet-18's stem and blocks, narrower and shallower."""

    def __init__(self, classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        self.blocks = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 8),
                                    BasicBlock(8, 16, 2), BasicBlock(16, 16))
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _cross_entropy(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _mlp():
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 1))
    x = torch.randn(64, 16)
    return model, x, x @ torch.randn(16, 1) + 0.1 * torch.randn(64, 1), F.mse_loss


def _cnn():
    return (SmallCNN(), torch.randn(8, 3, 12, 12), torch.randint(0, 5, (8,)),
            _cross_entropy)


def _resnet():
    return (ResNet(), torch.rand(4, 3, 32, 32), torch.randint(0, 5, (4,)),
            _cross_entropy)


def _recurrent():
    tokens = torch.randint(0, 16, (4, 7))
    return Recurrent(16), tokens, tokens.roll(1, 1), _cross_entropy


def _transformer():
    tokens = torch.randint(0, 16, (8, 12))
    return TokenModel(16, layers=1), tokens, (tokens + 1) % 16, _cross_entropy


MODELS = {"mlp": _mlp, "cnn": _cnn, "resnet": _resnet, "lstm_gru": _recurrent,
          "transformer": _transformer}


def _gradients(model, x, y, loss_fn, device, dtype):
    """Each parameter's gradient after one backward pass, as float64 on the CPU."""
    model = copy.deepcopy(model).to(device=device, dtype=dtype)

    def move(t):
        return t.to(device, dtype) if t.is_floating_point() else t.to(device)

    loss_fn(model(move(x)), move(y)).backward()
    return {name: p.grad.detach().cpu().double() for name, p in model.named_parameters()}


@pytest.mark.parametrize("name", MODELS)
def test_first_step_gradients_as_accurate_as_cpu(name):
    torch.manual_seed(0)
    model, x, y, loss_fn = MODELS[name]()
    reference = _gradients(model, x, y, loss_fn, "cpu", torch.float64)
    cpu = _gradients(model, x, y, loss_fn, "cpu", torch.float32)
    device = _gradients(model, x, y, loss_fn, "hologram", torch.float32)
    flat = torch.cat([g.flatten() for g in reference.values()])
    floor = FLOOR * flat.square().mean().sqrt().item()
    for param, ref in reference.items():
        got, expected = (device[param] - ref).norm(), (cpu[param] - ref).norm()
        bound = RATIO * expected + floor * ref.numel() ** 0.5
        assert got <= bound, (
            f"{name}.{param}: device error {got / ref.norm():.2e} (relative) against the "
            f"CPU's float32 {expected / ref.norm():.2e}; |grad| {ref.norm():.2e}")


# --- double backward: recurrent cells and products -----------------------------------------

@pytest.mark.parametrize("module", ["lstm", "gru"])
def test_recurrent_double_backward(module):
    """gradgradcheck of a recurrent layer in float64 (as PyTorch's test_modules runs it, on
    smaller samples): thousands of small products and cells, whose first-order backward
    (the fused cell's backward, one program) and double backward (PyTorch's
    differentiable cell backward, composed of device ops) must both be right."""
    torch.manual_seed(0)
    cls = nn.LSTM if module == "lstm" else nn.GRU
    model = cls(2, 3).double().to("hologram")
    names = [name for name, _ in model.named_parameters()]
    x = torch.randn(2, 2, dtype=torch.float64, device="hologram", requires_grad=True)

    def outputs(x, *params):
        out, _ = torch.func.functional_call(model, dict(zip(names, params)), (x,))
        return out

    assert torch.autograd.gradgradcheck(outputs, (x, *model.parameters()))


def test_products_are_served_without_python():
    """A product's signature seen once is served by the native front kernel (the LSTM's
    double backward runs ~25,000 of them); the result is the CPU's, in the operands'
    dtype, for transposed operands too. (Recorded execution, HOLOGRAM_LAZY=1, records
    every call in Python instead: the front kernels are for eager launches.)"""
    if not native.fast_active():
        pytest.skip("the native front kernels are not built here")
    with hologram_torch.set_lazy(False):
        _served_without_python()


def _served_without_python():
    a, b = torch.randn(3, 5, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    for x, y in ((a, b), (b.t(), a.t()), (a.half(), b.half())):
        device = (x.to("hologram"), y.to("hologram"))
        torch.mm(*device)
        before = native.fast_stats()["hits"]
        got = torch.mm(*device)
        served = native.fast_stats()["hits"] == before + 1
        assert served == (x.dtype is torch.float64), "only BLAS dtypes are filed"
        assert got.dtype == x.dtype
        torch.testing.assert_close(got.cpu(), torch.mm(x, y))
