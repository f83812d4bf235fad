"""hologram_torch.functional and hologram_torch.nn: values against torch on CPU and
hologram tensors, gradients with gradcheck in float64, drop-in modules."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hologram  # noqa: E402
import hologram_torch as hg  # noqa: E402
from hologram_torch import functional as F  # noqa: E402

DEVICES = ("cpu", "hologram")
TF = torch.nn.functional

CASES = {
    "add": (F.add, torch.add, [(3, 4), (4,)]),
    "sub": (F.sub, torch.sub, [(3, 1), (4,)]),
    "mul": (F.mul, torch.mul, [(2, 3, 4), (3, 4)]),
    "relu": (F.relu, torch.relu, [(7,)]),
    "sigmoid": (F.sigmoid, torch.sigmoid, [(7,)]),
    "tanh": (F.tanh, torch.tanh, [(7,)]),
    "gelu": (F.gelu, TF.gelu, [(7,)]),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"),
                  lambda x: TF.gelu(x, approximate="tanh"), [(7,)]),
    "softmax": (lambda x: F.softmax(x, dim=1), lambda x: torch.softmax(x, 1), [(3, 5)]),
    "softmax_dim0": (lambda x: F.softmax(x, dim=0), lambda x: torch.softmax(x, 0), [(3, 5)]),
    "linear": (F.linear, TF.linear, [(2, 3, 4), (5, 4), (5,)]),
    "linear_no_bias": (F.linear, TF.linear, [(6, 4), (5, 4)]),
    "mse_mean": (F.mse_loss, TF.mse_loss, [(3, 4), (3, 4)]),
    "mse_sum": (lambda x, t: F.mse_loss(x, t, reduction="sum"),
                lambda x, t: TF.mse_loss(x, t, reduction="sum"), [(3, 4), (3, 4)]),
    "mse_none": (lambda x, t: F.mse_loss(x, t, reduction="none"),
                 lambda x, t: TF.mse_loss(x, t, reduction="none"), [(3, 4), (3, 4)]),
}


def _inputs(shapes, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=dtype).to(device).requires_grad_()
            for s in shapes]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_match_torch(name, device):
    ours, theirs, shapes = CASES[name]
    xs = _inputs(shapes, device, torch.float32)
    refs = _inputs(shapes, "cpu", torch.float32)
    y, r = ours(*xs), theirs(*refs)
    assert y.device.type == device
    torch.testing.assert_close(y.detach().cpu(), r.detach(), rtol=1e-5, atol=1e-6)
    g = torch.randn(r.shape)
    y.backward(g.to(device))
    r.backward(g)
    for x, ref in zip(xs, refs):
        torch.testing.assert_close(x.grad.cpu(), ref.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradcheck_float64(name, device):
    ours, _, shapes = CASES[name]
    assert torch.autograd.gradcheck(ours, tuple(_inputs(shapes, device, torch.float64)),
                                    eps=1e-6, atol=1e-5)


def test_functional_ops_accept_an_executor_first():
    ex = hg.Executor(backend="cpu")
    assert hg.Executor is hologram.Executor
    a, b = torch.randn(1000), torch.randn(1000)
    torch.testing.assert_close(hg.functional.add(ex, a, b), a + b)
    torch.testing.assert_close(hg.functional.relu(ex, a, inplace=False), a.relu())
    torch.testing.assert_close(hg.functional.softmax(ex, a.reshape(10, 100), dim=None),
                               torch.softmax(a.reshape(10, 100), 1))
    w, bias = torch.randn(3, 1000), torch.randn(3)
    torch.testing.assert_close(hg.functional.linear(ex, a[None], w, bias),
                               TF.linear(a[None], w, bias), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(hg.functional.mse_loss(ex, a, b, reduction="mean"),
                               TF.mse_loss(a, b))
    ex.close()
    with pytest.raises(hologram.HologramError, match="closed"):
        hg.functional.add(ex, a, b)


def test_cpu_tensors_are_computed_in_place():
    x = torch.randn(100)
    expected = x.relu()
    address = x.data_ptr()
    y = F.relu(x, inplace=True)
    assert y is x and x.data_ptr() == address
    torch.testing.assert_close(x, expected)


def test_inplace_relu_autograd_on_a_non_leaf():
    for device in DEVICES:
        x = torch.randn(10, device=device, requires_grad=True)
        y = x * 1.0
        F.relu(y, inplace=True).sum().backward()
        torch.testing.assert_close(x.grad.cpu(), (x.detach().cpu() > 0).float())


def test_errors_name_the_op_and_fix():
    with pytest.raises(hologram.HologramError, match=r"add: operands on different devices"):
        F.add(torch.ones(2), torch.ones(2, device="hologram"))
    with pytest.raises(hologram.HologramError, match=r"linear: input \[2, 3\]"):
        F.linear(torch.ones(2, 3), torch.ones(4, 5))
    with pytest.raises(hologram.HologramError, match="mse_loss: input"):
        F.mse_loss(torch.ones(2), torch.ones(3))
    with pytest.raises(ValueError, match="reduction"):
        F.mse_loss(torch.ones(2), torch.ones(2), reduction="avg")
    with pytest.raises(hologram.HologramError, match="complex"):
        F.add(torch.ones(2, dtype=torch.complex64), torch.ones(2, dtype=torch.complex64))
    with pytest.raises(hologram.HologramError, match="floating-point"):
        F.relu(torch.ones(2, dtype=torch.int64))


MODULES = [
    (lambda: hg.nn.Linear(6, 3), lambda: torch.nn.Linear(6, 3)),
    (lambda: hg.nn.Linear(6, 3, bias=False), lambda: torch.nn.Linear(6, 3, bias=False)),
    (hg.nn.ReLU, torch.nn.ReLU), (hg.nn.Sigmoid, torch.nn.Sigmoid),
    (hg.nn.Tanh, torch.nn.Tanh), (hg.nn.GELU, torch.nn.GELU),
    (lambda: hg.nn.GELU(approximate="tanh"), lambda: torch.nn.GELU(approximate="tanh")),
    (lambda: hg.nn.Softmax(dim=-1), lambda: torch.nn.Softmax(dim=-1)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index", range(len(MODULES)))
def test_modules_are_drop_in(index, device):
    make_ours, make_theirs = MODULES[index]
    ours, theirs = make_ours(), make_theirs()
    assert isinstance(ours, type(theirs))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    ours.to(device)
    x = torch.randn(4, 6)
    torch.testing.assert_close(ours(x.to(device)).cpu(), theirs(x), rtol=1e-5, atol=1e-6)


def test_simple_nn_example_trains_like_torch():
    class SimpleNN(torch.nn.Module):
        def __init__(self, lib):
            super().__init__()
            self.fc1, self.relu1 = lib.Linear(16, 8), lib.ReLU()
            self.fc2 = lib.Linear(8, 1)

        def forward(self, x):
            return self.fc2(self.relu1(self.fc1(x)))

    torch.manual_seed(0)
    ours = SimpleNN(hg.nn)
    theirs = SimpleNN(torch.nn)
    theirs.load_state_dict(ours.state_dict())
    opt_a = torch.optim.Adam(ours.parameters(), lr=1e-2)
    opt_b = torch.optim.Adam(theirs.parameters(), lr=1e-2)
    x, t = torch.randn(32, 16), torch.randn(32, 1)
    for _ in range(20):
        for model, opt, loss_fn in ((ours, opt_a, hg.nn.MSELoss()),
                                    (theirs, opt_b, torch.nn.MSELoss())):
            opt.zero_grad()
            loss = loss_fn(model(x), t)
            loss.backward()
            opt.step()
        torch.testing.assert_close(loss_fn(ours(x), t), torch.nn.MSELoss()(theirs(x), t),
                                   rtol=1e-4, atol=1e-6)
