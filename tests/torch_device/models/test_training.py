"""Training on ``torch.device('hologram')`` matches the CPU: SGD with momentum, Adam and
AdamW (per-tensor and ``foreach`` implementations) on a small MLP, optimizer state round
trips, ``zero_grad`` and gradient clipping.

Kernels without a native implementation run through the CPU fallback, which is exact;
native kernels may order float32 reductions differently from the CPU, hence a relative
tolerance rather than equality: after 20 steps the largest difference measured is 2e-7
of the tensor's largest value (``RTOL`` leaves a margin of 50). Elementwise, Adam's
updates (about ``lr * sign(grad)``) amplify float32 rounding in near-zero gradients:
the worst element measured differs by 1.7e-5 relative to itself."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402, F401  (registers the device)

DEV = torch.device("hologram", 0)
STEPS = 20
RTOL = 1e-5

pytestmark = pytest.mark.filterwarnings("ignore::hologram_torch.FallbackWarning",
                                        "ignore:An output with one or more elements")

OPTIMIZERS = {
    "sgd-momentum": lambda params, foreach: torch.optim.SGD(
        params, lr=0.05, momentum=0.9, weight_decay=1e-3, foreach=foreach),
    "sgd-nesterov": lambda params, foreach: torch.optim.SGD(
        params, lr=0.05, momentum=0.9, nesterov=True, foreach=foreach),
    "adam": lambda params, foreach: torch.optim.Adam(params, lr=1e-2, foreach=foreach),
    "adam-amsgrad": lambda params, foreach: torch.optim.Adam(
        params, lr=1e-2, amsgrad=True, weight_decay=1e-2, foreach=foreach),
    "adamw": lambda params, foreach: torch.optim.AdamW(
        params, lr=1e-2, weight_decay=0.1, foreach=foreach),
}


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 2))


def data(device="cpu"):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 6, generator=g), torch.randn(32, 2, generator=g)
    return x.to(device), y.to(device)


def train(model, opt, x, y, steps=STEPS):
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    return torch.stack(losses)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest difference relative to the largest reference value (elementwise relative
    error is meaningless for entries that cross zero during training)."""
    got = got.detach().cpu().double()
    want = want.detach().double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def assert_match(model, ref_model, losses=None, ref_losses=None):
    errors = [relative_error(p, r) for p, r in zip(model.parameters(), ref_model.parameters())]
    if losses is not None:
        errors.append(relative_error(losses, ref_losses))
    assert max(errors) <= RTOL, f"relative errors {errors}"
    return max(errors)


@pytest.mark.parametrize("foreach", [False, True], ids=["for-loop", "foreach"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_matches_cpu(name, foreach):
    ref = mlp()
    model = copy.deepcopy(ref).to("hologram")
    ref_opt = OPTIMIZERS[name](ref.parameters(), foreach)
    opt = OPTIMIZERS[name](model.parameters(), foreach)
    x, y = data()
    ref_losses = train(ref, ref_opt, x, y)
    losses = train(model, opt, x.to("hologram"), y.to("hologram"))
    assert ref_losses[-1] < ref_losses[0]  # it trains at all
    assert all(p.device == DEV and p.grad.device == DEV for p in model.parameters())
    for state in opt.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                assert value.device == DEV
    assert_match(model, ref, losses, ref_losses)


def test_zero_grad():
    model = mlp().to("hologram")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data("hologram")
    torch.nn.functional.mse_loss(model(x), y).backward()
    assert all(p.grad.abs().sum().item() > 0 for p in model.parameters())
    opt.zero_grad(set_to_none=False)
    for p in model.parameters():
        assert p.grad.device == DEV and torch.equal(p.grad.cpu(), torch.zeros(p.shape))
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    # gradients accumulate across backward calls, as on the CPU
    ref = mlp()
    for m, (xx, yy) in ((model, (x, y)), (ref, data())):
        for _ in range(2):
            torch.nn.functional.mse_loss(m(xx), yy).backward()
    for p, r in zip(model.parameters(), ref.parameters()):
        assert relative_error(p.grad, r.grad) <= RTOL


@pytest.mark.parametrize("name", ["sgd-momentum", "adam", "adamw"])
def test_optimizer_state_dict_round_trip(name, tmp_path):
    """Train 10 steps, save model and optimizer, load both into fresh objects, train 10
    more: the result equals 20 uninterrupted steps on the CPU."""
    x, y = data()
    ref = mlp()
    ref_losses = train(ref, OPTIMIZERS[name](ref.parameters(), False), x, y)

    model = copy.deepcopy(mlp()).to("hologram")
    opt = OPTIMIZERS[name](model.parameters(), False)
    first = train(model, opt, x.to("hologram"), y.to("hologram"), STEPS // 2)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "ck.pt")
    del model, opt

    checkpoint = torch.load(tmp_path / "ck.pt")
    state = checkpoint["opt"]["state"]
    assert state and all(v.device == DEV for s in state.values() for k, v in s.items()
                         if isinstance(v, torch.Tensor) and k != "step")
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2)).to("hologram")
    model.load_state_dict(checkpoint["model"])
    opt = OPTIMIZERS[name](model.parameters(), False)
    opt.load_state_dict(checkpoint["opt"])
    second = train(model, opt, x.to("hologram"), y.to("hologram"), STEPS - STEPS // 2)
    assert_match(model, ref, torch.cat([first, second]), ref_losses)

    # a device checkpoint resumes on the CPU too
    cpu_checkpoint = torch.load(tmp_path / "ck.pt", map_location="cpu")
    cpu_model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 2))
    cpu_model.load_state_dict(cpu_checkpoint["model"])
    cpu_opt = OPTIMIZERS[name](cpu_model.parameters(), False)
    cpu_opt.load_state_dict(cpu_checkpoint["opt"])
    train(cpu_model, cpu_opt, x, y, STEPS - STEPS // 2)
    assert_match(cpu_model, ref)


@pytest.mark.parametrize("foreach", [False, True], ids=["for-loop", "foreach"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm(norm_type, foreach):
    ref = mlp()
    model = copy.deepcopy(ref).to("hologram")
    x, y = data()
    for m, (xx, yy) in ((ref, (x, y)), (model, (x.to("hologram"), y.to("hologram")))):
        (100 * torch.nn.functional.mse_loss(m(xx), yy)).backward()
    max_norm = 0.5
    ref_total = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm,
                                               norm_type=norm_type, foreach=foreach)
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm,
                                           norm_type=norm_type, foreach=foreach)
    assert total.device == DEV
    assert ref_total > max_norm  # clipping actually happened
    assert relative_error(total, ref_total) <= RTOL
    for p, r in zip(model.parameters(), ref.parameters()):
        assert relative_error(p.grad, r.grad) <= RTOL
    clipped = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()],
                                            norm_type=norm_type)
    assert clipped.item() == pytest.approx(max_norm, rel=1e-4)
