"""torch.autocast('hologram') against torch.autocast('cpu'), op by op and on a training
run; GradScaler('hologram') and its two device ops against the CPU's."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402
from hologram_torch import autocast  # noqa: E402

LOW = (torch.bfloat16, torch.float16)


def test_every_cpu_autocast_op_has_a_device_kernel():
    ops = autocast.cpu_autocast_ops()
    assert sorted(autocast.CPU_POLICY_OPS) == ops  # the listed ops are the installed torch's
    missing = [n for n in ops
               if not torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastPrivateUse1")]
    assert not missing
    # Ops on no list keep the fallthrough (they run at their inputs' precision).
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::add.Tensor",
                                                              "AutocastPrivateUse1")


def _cases():
    from torch.testing._internal.autocast_test_lists import AutocastCPUTestLists

    lists = AutocastCPUTestLists(torch.device("cpu"))
    for attr in ("torch_16", "nn_16", "torch_fp32", "nn_fp32", "torch_need_autocast_promote"):
        module = torch._C._nn if attr.startswith("nn") else torch
        for entry in getattr(lists, attr):
            kwargs = entry[2] if len(entry) > 2 and isinstance(entry[2], dict) else {}
            yield pytest.param(getattr(module, entry[0]), entry[1], kwargs,
                               id=f"{attr}-{entry[0]}")


def _device(value):
    return autocast._map(lambda t: t.to("hologram"), value)


def _dtypes(value):
    if isinstance(value, torch.Tensor):
        return value.dtype
    return [_dtypes(v) for v in value]


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize(("fn", "args", "kwargs"), list(_cases()))
def test_policy_matches_cpu_op_by_op(fn, args, kwargs, dtype):
    """PyTorch's own autocast test lists: the device's results have the CPU's dtypes and
    values (computed at those precisions)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU fallbacks of convolutions and some losses
        try:
            with torch.autocast("cpu", dtype=dtype):
                want = fn(*args, **kwargs)
        except RuntimeError as error:  # (cat of bfloat16 in a float16 region)
            with pytest.raises(RuntimeError, match=str(error)), torch.autocast(
                    "hologram", dtype=dtype):
                fn(*_device(args), **kwargs)
            return
        with torch.autocast("hologram", dtype=dtype):
            got = fn(*_device(args), **kwargs)
    assert _dtypes(got) == _dtypes(want)
    want = want if isinstance(want, torch.Tensor) else want[0]
    got = got if isinstance(got, torch.Tensor) else got[0]
    tol = 0.05 if want.dtype in LOW else 2e-3  # summation orders differ
    try:
        torch.testing.assert_close(got.cpu().float(), want.float(), rtol=tol, atol=tol)
    except AssertionError:
        # PyTorch's CPU adds some half-precision products in half precision on CPUs
        # without AVX512-FP16 (float16 conv_transpose3d on an AMD EPYC: 0.35 off): the
        # device's result must then be the float64 computation's, rounded to its dtype,
        # on the operands autocast gives the op (rounded to the half type: from the
        # unrounded ones, one element in ~10^6 of a float16 conv_transpose3d was 0.063 off).
        rounded = want.dtype is dtype
        exact = fn(*autocast._map(lambda t: (t.to(dtype) if rounded else t).double()
                                  if t.is_floating_point() else t, args), **kwargs)
        exact = (exact if isinstance(exact, torch.Tensor) else exact[0]).to(want.dtype)
        torch.testing.assert_close(got.cpu().float(), exact.float(), rtol=tol, atol=tol)


def test_elementwise_ops_keep_their_dtype_and_gradients_flow_in_float32():
    lin = torch.nn.Linear(8, 4).to("hologram")
    x = torch.randn(5, 8, device="hologram")
    with torch.autocast("hologram", dtype=torch.bfloat16):
        y = lin(x)
        z = torch.relu(y) * 2
        loss = torch.nn.functional.mse_loss(z, torch.zeros_like(z, dtype=torch.bfloat16))
    assert (y.dtype, z.dtype, loss.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32)
    loss.backward()
    assert lin.weight.grad.dtype is torch.float32
    with torch.autocast("hologram", dtype=torch.bfloat16, enabled=False):
        assert lin(x).dtype is torch.float32
    with torch.autocast("hologram", dtype=torch.bfloat16):
        assert torch.mm(x.double(), x.double().T).dtype is torch.float64  # never cast


class _CountCasts(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts ``aten._to_copy`` (every dtype cast) below autocast."""

    def __init__(self):
        super().__init__()
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.casts += func is torch.ops.aten._to_copy.default
        return func(*args, **(kwargs or {}))


def _weight_used_twice(device: str, cache_enabled: bool = True):
    """(casts, outputs, the weight's gradient) of a region using a weight twice, a
    non-leaf copy of it and a weight that needs no gradient."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(8, 8, generator=gen).to(device).requires_grad_()
    frozen, x = torch.randn(8, 8, generator=gen).to(device), torch.randn(5, 8, generator=gen)
    x = x.to(device)
    with _CountCasts() as counted:
        with torch.autocast(device, dtype=torch.bfloat16, cache_enabled=cache_enabled):
            y = torch.mm(x, w) + torch.mm(torch.relu(x), w)
            z = torch.mm(x, w * 1) + torch.mm(x, frozen) + torch.mm(x, frozen)
        (y.float().sum() + z.float().sum()).backward()
    return counted.casts, (y, z), w.grad


@pytest.mark.parametrize("cache_enabled", (True, False))
def test_a_weight_is_cast_once_per_region_as_on_the_cpu(cache_enabled):
    casts, outputs, grad = _weight_used_twice("hologram", cache_enabled)
    cpu_casts, cpu_outputs, cpu_grad = _weight_used_twice("cpu", cache_enabled)
    assert casts == cpu_casts
    for got, want in zip(outputs, cpu_outputs):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(grad.cpu(), cpu_grad, rtol=1e-2, atol=1e-2)


def test_kept_copies_last_until_the_outermost_region_exits():
    w = torch.randn(4, 4, device="hologram", requires_grad=True)
    x = torch.randn(2, 4, device="hologram")
    with torch.autocast("hologram", dtype=torch.bfloat16):
        with torch.autocast("hologram", dtype=torch.bfloat16):
            torch.mm(x, w)
        assert len(autocast._kept.casts) == 1  # an inner region's exit keeps them
        with _CountCasts() as counted:
            torch.mm(x, w)
        assert counted.casts == 1  # x only
        with torch.no_grad():
            w.mul_(2)  # written in place: cast again, unlike PyTorch
        torch.testing.assert_close(torch.mm(x, w).float().cpu(),
                                   (x.bfloat16() @ w.bfloat16()).float().cpu())
    assert not getattr(autocast._kept, "casts", None)


def _train(device: str, steps: int = 6):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 10)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=gen).to(device)
    target = torch.randint(0, 4, (64,), generator=gen).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), target)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return losses, scaler.get_scale()


def test_training_under_autocast_matches_the_cpu():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        device, scale = _train("hologram")
    cpu, cpu_scale = _train("cpu")
    assert device[-1] < device[0]
    assert scale == cpu_scale
    # bfloat16 products: a few units in the last place of bf16 (2^-8) apart, per step.
    torch.testing.assert_close(torch.tensor(device), torch.tensor(cpu), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
def test_unscale_checks_every_gradient(dtype):
    gen = torch.Generator().manual_seed(0)
    for poison in (None, float("inf"), float("-inf"), float("nan")):
        grads = [torch.randn(n, generator=gen).to(dtype) for n in (5, 0, 33)]
        if poison is not None:
            grads[2][17] = poison
        for found in (0.0, 1.0):
            cpu = [g.clone() for g in grads]
            cpu_found, inv = torch.tensor([found]), torch.tensor([0.25])
            torch._amp_foreach_non_finite_check_and_unscale_(cpu, cpu_found, inv)
            dev = [g.to("hologram") for g in grads]
            dev_found = torch.tensor([found], device="hologram")
            torch._amp_foreach_non_finite_check_and_unscale_(dev, dev_found,
                                                             inv.to("hologram"))
            assert dev_found.item() == cpu_found.item()
            for d, c in zip(dev, cpu):
                torch.testing.assert_close(d.cpu(), c, equal_nan=True)
    assert "aten._amp_foreach_non_finite_check_and_unscale_.default" not in (
        hologram_torch.fallback_stats())


def test_update_scale_matches_the_cpu():
    cases = [(1024.0, 0, 0.0), (1024.0, 1, 0.0), (1024.0, 1, 1.0), (3e38, 1, 0.0),
             (1.0, 0, 0.0)]
    for scale, tracker, found in cases:
        results = []
        for device in ("cpu", "hologram"):
            s = torch.tensor([scale], device=device)
            t = torch.tensor([tracker], dtype=torch.int32, device=device)
            out = torch._amp_update_scale_(s, t, torch.tensor([found], device=device),
                                           2.0, 0.5, 2)
            assert out is s
            results.append((s.item(), t.item()))
        assert results[0] == results[1], (scale, tracker, found, results)
    assert "aten._amp_update_scale_.default" not in hologram_torch.fallback_stats()


def _transformer_losses(device: str, steps: int = 5) -> list[float]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    layer = layer.to(device)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device)
    x = torch.randn(4, 10, 32, generator=torch.Generator().manual_seed(1)).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = layer(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return losses


def test_transformer_trains_like_the_cpu_under_autocast():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        device = _transformer_losses("hologram")
    torch.testing.assert_close(torch.tensor(device), torch.tensor(_transformer_losses("cpu")),
                               rtol=1e-3, atol=1e-3)
