"""hologram_torch.functional and hologram_torch.nn: values against torch on CPU and
hologram tensors, gradients with gradcheck in float64, drop-in modules."""

from __future__ import annotations

import warnings

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


def _behaviour(module, inputs, grads: bool):
    """What ``module(*inputs)`` does: (result or exception type, warnings, gradients)."""
    inputs = [x.detach().clone().requires_grad_(grads and x.dtype.is_floating_point)
              for x in inputs]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", hg.FallbackWarning)
        try:
            result = module(*inputs)
        except Exception as exc:  # compared with torch's exception type
            return type(exc), [], []
    messages = sorted(str(w.message) for w in caught)
    gradients = []
    if grads and result.requires_grad:
        result.sum().backward()
        gradients = [x.grad for x in inputs if x.requires_grad]
    return result, messages, gradients


def _seeded(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-5, 6, shape, generator=g).to(dtype)


f32, f64, i64 = torch.float32, torch.float64, torch.int64
# (module name, constructor kwargs, [(shape, dtype) per input]): shapes, dtypes,
# broadcasting and reductions torch.nn handles (or rejects) in its own way.
AUDIT = [
    ("Linear", {"in_features": 4, "out_features": 3}, [((2, 4), f32)]),
    ("Linear", {"in_features": 4, "out_features": 3}, [((4,), f32)]),
    ("Linear", {"in_features": 4, "out_features": 3}, [((2, 5, 4), f32)]),
    ("Linear", {"in_features": 4, "out_features": 3}, [((0, 4), f32)]),
    ("Linear", {"in_features": 4, "out_features": 3}, [((2, 4), f64)]),
    ("Linear", {"in_features": 4, "out_features": 3}, [((2, 4), i64)]),
    ("Linear", {"in_features": 4, "out_features": 3}, [((2, 5), f32)]),
    ("Linear", {"in_features": 4, "out_features": 3}, [((), f32)]),
    ("ReLU", {}, [((3, 4), f32)]), ("ReLU", {}, [((3, 4), i64)]),
    ("ReLU", {}, [((), f32)]), ("ReLU", {}, [((3,), torch.bool)]),
    ("Sigmoid", {}, [((3, 4), i64)]), ("Sigmoid", {}, [((3, 4), torch.bool)]),
    ("Sigmoid", {}, [((0, 2), f32)]), ("Sigmoid", {}, [((5,), torch.float16)]),
    ("Tanh", {}, [((3,), i64)]), ("Tanh", {}, [((3,), f64)]), ("Tanh", {}, [((), f32)]),
    ("GELU", {}, [((3,), i64)]), ("GELU", {"approximate": "tanh"}, [((3, 2), f32)]),
    ("GELU", {"approximate": "bad"}, [((3,), f32)]),
    ("Softmax", {"dim": 1}, [((3, 4), f32)]), ("Softmax", {"dim": None}, [((2, 3, 4), f32)]),
    ("Softmax", {"dim": None}, [((3, 4), f32)]), ("Softmax", {"dim": 2}, [((3, 4), f32)]),
    ("Softmax", {"dim": 0}, [((), f32)]), ("Softmax", {"dim": -1}, [((3,), i64)]),
    ("MSELoss", {}, [((4, 3), f32), ((3,), f32)]),
    ("MSELoss", {}, [((4, 3), f32), ((4, 3), f64)]),
    ("MSELoss", {}, [((4, 3), f32), ((4, 3), i64)]),
    ("MSELoss", {"reduction": "sum"}, [((4, 1), f32), ((1, 3), f32)]),
    ("MSELoss", {"reduction": "none"}, [((2, 3), f32), ((2, 3), f32)]),
    ("MSELoss", {}, [((0,), f32), ((0,), f32)]),
    ("MSELoss", {}, [((4, 3), f32), ((2, 3), f32)]),
    ("MSELoss", {"reduction": "avg"}, [((3,), f32), ((3,), f32)]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index", range(len(AUDIT)))
def test_modules_behave_as_torch_nn(index, device):
    name, kwargs, specs = AUDIT[index]
    try:
        theirs = getattr(torch.nn, name)(**kwargs)
    except Exception as exc:  # torch rejects the arguments: so must the drop-in
        with pytest.raises(type(exc)):
            getattr(hg.nn, name)(**kwargs)
        return
    ours = getattr(hg.nn, name)(**kwargs)
    ours.load_state_dict(theirs.state_dict())
    ours.to(device)
    inputs = [_seeded(shape, dtype, seed) for seed, (shape, dtype) in enumerate(specs)]
    grads = all(x.dtype.is_floating_point for x in inputs)
    expected, warned, gradients = _behaviour(theirs, inputs, grads)
    actual, our_warnings, our_gradients = _behaviour(
        ours, [x.to(device) for x in inputs], grads)
    if isinstance(expected, type):
        assert actual is expected, f"torch raises {expected.__name__}, got {actual}"
        return
    assert isinstance(actual, torch.Tensor) and actual.device.type == device
    assert our_warnings == warned
    # float32: a little looser than assert_close's default; other dtypes: its defaults
    tol = {"rtol": 1e-5, "atol": 1e-6} if expected.dtype is f32 else {}
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, **tol)
    for a, e in zip(our_gradients, gradients, strict=True):
        torch.testing.assert_close(a.cpu(), e, **tol)
    if grads and isinstance(theirs, torch.nn.Linear):
        torch.testing.assert_close(ours.weight.grad.cpu(), theirs.weight.grad, rtol=1e-5,
                                   atol=1e-5)
