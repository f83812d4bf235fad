"""``torch.device('hologram')``: registration, the device module, the package API,
factories, copies, views, autograd, RNG, serialization, deep copies, pinned memory,
autocast, ``torch.accelerator``, the CPU fallback, paths that used to segfault, and the
``torch.backends`` entry point. Every result is compared with CPU torch."""

from __future__ import annotations

import copy
import gc
import importlib
import io
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import tomllib

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402  (registers the device)
from hologram.errors import DeviceError  # noqa: E402
from hologram_torch import memory  # noqa: E402
from hologram_torch.compat import UnsupportedError  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
DEV = torch.device("hologram", 0)

pytestmark = pytest.mark.filterwarnings("ignore::hologram_torch.FallbackWarning")


def close(device_tensor, cpu_tensor, **kw):
    assert device_tensor.device == DEV
    torch.testing.assert_close(device_tensor.cpu(), cpu_tensor, **kw)


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


# --- registration and the device module -------------------------------------------------

def test_registration():
    assert torch.device("hologram:0") == DEV
    assert torch.device("hologram").type == "hologram"
    assert torch._C._get_privateuse1_backend_name() == "hologram"
    x = torch.arange(4.0).hologram()
    assert type(x) is torch.Tensor
    assert x.is_hologram and not torch.arange(4.0).is_hologram
    assert x.device == DEV
    close(x, torch.arange(4.0))
    assert torch.nn.Linear(2, 2).hologram().weight.device == DEV


def test_device_module():
    h = torch.hologram
    assert h.is_available() and h.is_initialized()
    assert h.device_count() == 1
    assert h.current_device() == 0
    h.set_device(0)
    h.set_device("hologram:0")
    with pytest.raises(DeviceError, match="hologram:1 does not exist"):
        h.set_device(1)
    with h.device(0), h.device("hologram:0"):
        assert torch.ones(2, device="hologram").device == DEV
    with pytest.raises(DeviceError):
        h.device(1)
    with pytest.raises(DeviceError, match="expected a hologram device"):
        h.set_device("cpu")
    h.synchronize()
    h.synchronize(0)
    assert "Hologram" in h.get_device_name()


def test_device_module_seeds():
    torch.hologram.manual_seed(1234)
    a = torch.randn(6, device="hologram")
    torch.hologram.manual_seed_all(99)  # must not disturb the generator state
    b = torch.randn(6, device="hologram")
    torch.hologram.manual_seed(1234)
    assert torch.equal(torch.randn(6, device="hologram").cpu(), a.cpu())
    assert torch.equal(torch.randn(6, device="hologram").cpu(), b.cpu())
    assert torch.hologram.initial_seed() == 1234
    state = torch.hologram.get_rng_state()
    c = torch.rand(3, device="hologram")
    torch.hologram.set_rng_state(state)
    assert torch.equal(torch.rand(3, device="hologram").cpu(), c.cpu())


def test_memory_accounting():
    h = torch.hologram
    gc.collect()
    before = h.memory_allocated()
    t = torch.empty(1 << 18, device="hologram")  # 1 MiB
    during = h.memory_allocated()
    assert during - before >= t.nbytes
    assert h.memory_reserved() >= during
    assert h.max_memory_allocated() >= during
    stats = h.memory_stats()
    assert stats["allocated_bytes.all.current"] == during
    assert stats["reserved_bytes.all.current"] == h.memory_reserved()
    view = t[10:]  # a view keeps the block alive
    del t
    gc.collect()
    assert h.memory_allocated() == during
    del view
    gc.collect()
    assert h.memory_allocated() == before
    h.empty_cache()
    assert h.memory_reserved() <= during
    h.reset_peak_memory_stats()
    assert h.max_memory_allocated() == h.memory_allocated()


def test_freed_blocks_are_reused():
    h = torch.hologram
    h.empty_cache()
    gc.collect()
    before = h.memory_allocated()
    t = torch.empty(1 << 20, device="hologram")  # 4 MiB
    address = t.data_ptr()
    del t
    assert h.memory_allocated() == before  # the block is cached by the pool
    assert torch.empty(1 << 20, device="hologram").data_ptr() == address  # and reused
    h.empty_cache()


# --- the package API --------------------------------------------------------------------

def test_package_api():
    assert hologram_torch.is_available()
    backends = hologram_torch.list_available_backends()
    assert "interp" in backends and "cpu" in backends
    original = hologram_torch.get_backend()
    assert original in backends
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    if not memory.host_memory():  # tensors live in GPU memory: no switch to host memory
        with pytest.raises(DeviceError, match="choose the backend before the first"):
            hologram_torch.set_backend("cpu")
        return
    try:
        for name in ("interp", "cpu"):
            hologram_torch.set_backend(name)
            assert hologram_torch.get_backend() == name
            close(a.to("hologram") + b.to("hologram"), a + b)
            close(a.to("hologram").to(torch.float64), a.double())
            close(torch.full((2, 3), 1.5, device="hologram"), torch.full((2, 3), 1.5))
        with pytest.raises(DeviceError, match=r"unknown backend 'nope'.*available here"):
            hologram_torch.set_backend("nope")
    finally:
        hologram_torch.set_backend(original)
    assert hologram_torch.get_backend() == original


# --- factories, transfers, printing -----------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda d: torch.zeros(2, 3, device=d),
    lambda d: torch.ones(2, 3, dtype=torch.int64, device=d),
    lambda d: torch.full((3,), 2.5, device=d),
    lambda d: torch.arange(0, 10, 3, device=d),
    lambda d: torch.arange(0.0, 1.0, 0.25, device=d),
    lambda d: torch.eye(3, 4, device=d),
    lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
    lambda d: torch.tensor([1.5, -2.0], dtype=torch.float64, device=d),
    lambda d: torch.zeros_like(torch.ones(2, 2), device=d),
    lambda d: torch.linspace(0, 1, 5, device=d),
], ids=["zeros", "ones-int64", "full", "arange-int", "arange-float", "eye", "tensor",
        "tensor-f64", "zeros_like", "linspace"])
def test_factories(make):
    ref = make("cpu")
    x = make("hologram")
    assert x.dtype == ref.dtype and x.shape == ref.shape
    close(x, ref)


def test_empty_and_random_factories():
    x = torch.empty(3, 4, device="hologram")
    assert x.shape == (3, 4) and x.device == DEV and x.is_contiguous()
    assert torch.empty(0, device="hologram").numel() == 0
    for fn in (torch.randn, torch.rand):
        torch.manual_seed(7)
        d = fn(4, 5, device="hologram")
        torch.manual_seed(7)
        close(d, fn(4, 5))
    r = torch.rand(1000, device="hologram").cpu()
    assert r.min() >= 0 and r.max() < 1


def test_transfers_and_printing():
    ref = torch.tensor([[1.0, -2.5], [3.25, 4.0]])
    x = ref.to("hologram")
    assert x.device == DEV and x.dtype == torch.float32
    y = x.cpu()
    assert y.device.type == "cpu" and torch.equal(y, ref)
    ref[0, 0] = 100  # transfers copy: the device tensor is independent
    assert x.cpu()[0, 0] == 1.0
    close(x.to(torch.float64), y.double())
    assert x.to("hologram") is x
    assert "device='hologram:0'" in repr(x)
    assert repr(x) == repr(y)[:-1] + ", device='hologram:0')"
    assert str(torch.arange(3, device="hologram")) == "tensor([0, 1, 2], device='hologram:0')"
    with pytest.raises(TypeError, match="can't convert hologram:0 device type tensor"):
        x.numpy()
    assert x.tolist() == y.tolist() and x[1, 0].item() == 3.25


def test_views_share_memory_with_base():
    ref = torch.arange(24.0).reshape(4, 6)
    x = ref.to("hologram")
    for make in (lambda t: t[1:, ::2], lambda t: t.t(), lambda t: t[:, 2],
                 lambda t: t.view(6, 4)[2:], lambda t: t.unsqueeze(0).expand(2, 4, 6)[1],
                 lambda t: t.reshape(-1)[3:9], lambda t: t.narrow(1, 1, 3)):
        v, rv = make(x), make(ref)
        assert v.shape == rv.shape and v.stride() == rv.stride()
        assert v.storage_offset() == rv.storage_offset()
        assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        close(v, rv)
    # in-place ops through views land in the base
    x[1:, ::2].mul_(10)
    ref[1:, ::2].mul_(10)
    x[:, 1].fill_(-1)
    ref[:, 1].fill_(-1)
    x.t()[0].add_(0.5)
    ref.t()[0].add_(0.5)
    x[2].zero_()
    ref[2].zero_()
    x[0, 3:5] = torch.tensor([7.0, 8.0])
    ref[0, 3:5] = torch.tensor([7.0, 8.0])
    close(x, ref)
    assert x[1:]._base is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int64, torch.int8, torch.bool, torch.complex64])
def test_zero_fills_are_memsets_and_keep_every_other_value(dtype):
    """Contiguous zero fills up to MEMSET_BYTES clear memory without a program; the rest
    (views, larger tensors, -0.0 and other values) run the fill program: each as the CPU
    does."""
    import hologram
    from hologram_torch.aten import tensor as aten_tensor

    base = torch.testing.make_tensor((6, 50), dtype=dtype, device="cpu")
    x = base.to("hologram")
    compiled = hologram.cache_info()["misses"]
    x[1].zero_()  # contiguous: a memset (on host memory; a kernel on GPU memory)
    x[2:4].fill_(False if dtype is torch.bool else 0)
    assert hologram.cache_info()["misses"] == compiled or not memory.host_memory()
    x[:, 7].zero_()  # a strided view: the fill program
    ref = base.clone()
    ref[1].zero_()
    ref[2:4].fill_(False if dtype is torch.bool else 0)
    ref[:, 7].zero_()
    torch.testing.assert_close(x.cpu(), ref, rtol=0, atol=0)
    if dtype.is_floating_point or dtype.is_complex:
        x[4].fill_(-0.0)  # not all-zero bits: the program keeps the sign
        assert torch.signbit(x[4].cpu().real if dtype.is_complex else x[4].cpu()).all()
    big = torch.ones(aten_tensor.MEMSET_BYTES // 2 + 1, dtype=torch.int16, device="hologram")
    big.zero_()  # one byte past MEMSET_BYTES: the fill program, split over the workers
    assert not big.cpu().any()


# --- autograd and modules ---------------------------------------------------------------

def test_mlp_forward_backward_matches_cpu():
    cpu = mlp()
    dev = copy.deepcopy(cpu).to("hologram")
    assert all(p.device == DEV for p in dev.parameters())
    torch.manual_seed(1)
    x, target = torch.randn(7, 5), torch.randn(7, 3)
    loss = torch.nn.functional.mse_loss(cpu(x), target)
    loss.backward()
    dloss = torch.nn.functional.mse_loss(dev(x.to("hologram")), target.to("hologram"))
    dloss.backward()
    close(dloss, loss, rtol=1e-5, atol=1e-6)
    for p, dp in zip(cpu.parameters(), dev.parameters()):
        assert dp.grad.device == DEV
        close(dp.grad, p.grad, rtol=1e-5, atol=1e-6)


def test_manual_seed_reproducible_and_equal_to_cpu():
    torch.manual_seed(2024)
    a = torch.randn(3, 4, device="hologram")
    torch.manual_seed(2024)
    b = torch.randn(3, 4, device="hologram")
    torch.manual_seed(2024)
    c = torch.randn(3, 4)
    assert torch.equal(a.cpu(), b.cpu())
    assert torch.equal(a.cpu(), c)
    assert not torch.equal(torch.randn(3, 4, device="hologram").cpu(), c)


# --- serialization ----------------------------------------------------------------------

def _save_load(obj, path, **kw):
    torch.save(obj, path)
    return torch.load(path, **kw)


def test_save_load_tensors(tmp_path):
    ref = torch.randn(4, 5)
    x = ref.to("hologram")
    y = _save_load(x, tmp_path / "t.pt")
    assert y.device == DEV and torch.equal(y.cpu(), ref)
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    # views of one storage stay one storage
    a, b = _save_load([x, x[1:, 2:]], tmp_path / "views.pt")
    assert b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    b.fill_(0)
    assert a.cpu()[1:, 2:].abs().sum() == 0 and a.cpu()[0].equal(ref[0])
    # hologram checkpoint onto the CPU
    z = torch.load(tmp_path / "t.pt", map_location="cpu")
    assert z.device.type == "cpu" and torch.equal(z, ref)
    # CPU checkpoint onto the device, all the ways map_location can say so
    torch.save(ref, tmp_path / "cpu.pt")
    for where in ("hologram", "hologram:0", DEV, {"cpu": "hologram"},
                  lambda storage, location: storage.hologram()
                  if hasattr(storage, "hologram") else None):
        w = torch.load(tmp_path / "cpu.pt", map_location=where)
        if callable(where) and not isinstance(where, torch.device):
            assert w.device.type == "cpu"  # the callable declined: torch's default applies
        else:
            assert w.device == DEV
        assert torch.equal(w.cpu(), ref)
    with pytest.raises(DeviceError, match="hologram:1 does not exist"):
        torch.load(tmp_path / "cpu.pt", map_location="hologram:1")


def test_save_load_state_dict_and_module(tmp_path):
    model = mlp(3).to("hologram")
    x = torch.randn(2, 5)
    expected = model(x.to("hologram")).cpu()
    sd = _save_load(model.state_dict(), tmp_path / "sd.pt")
    assert all(v.device == DEV for v in sd.values())
    fresh = mlp(4).to("hologram")
    fresh.load_state_dict(sd)
    close(fresh(x.to("hologram")), expected)
    on_cpu = mlp(5)
    on_cpu.load_state_dict(torch.load(tmp_path / "sd.pt", map_location="cpu"))
    torch.testing.assert_close(on_cpu(x), expected)
    whole = _save_load(model, tmp_path / "m.pt", weights_only=False)
    assert next(whole.parameters()).device == DEV
    close(whole(x.to("hologram")), expected)
    whole_cpu = torch.load(tmp_path / "m.pt", map_location="cpu", weights_only=False)
    torch.testing.assert_close(whole_cpu(x), expected)
    # a CPU module checkpoint loaded straight onto the device
    torch.save(mlp(3), tmp_path / "cpu_m.pt")
    moved = torch.load(tmp_path / "cpu_m.pt", map_location="hologram", weights_only=False)
    close(moved(x.to("hologram")), expected)


def test_save_load_in_memory_and_pickle():
    ref = torch.arange(10, dtype=torch.int32)
    buf = io.BytesIO()
    torch.save({"a": ref.to("hologram"), "n": 3}, buf)
    buf.seek(0)
    out = torch.load(buf)
    assert out["n"] == 3 and out["a"].device == DEV and torch.equal(out["a"].cpu(), ref)
    p = pickle.loads(pickle.dumps(ref.to("hologram")))
    assert p.device == DEV and torch.equal(p.cpu(), ref)


# --- deep copies and storages -----------------------------------------------------------

def test_deepcopy_tensor_parameter_module():
    ref = torch.randn(3, 4)
    x = ref.to("hologram")
    y = copy.deepcopy(x)
    assert y.device == DEV and torch.equal(y.cpu(), ref)
    y.fill_(0)
    assert torch.equal(x.cpu(), ref)
    v1, v2 = copy.deepcopy([x, x[1:]])  # the memo keeps views of one storage together
    assert v2.untyped_storage().data_ptr() == v1.untyped_storage().data_ptr()
    assert v2.storage_offset() == 4

    w = ref.to("hologram").requires_grad_()
    w.grad = torch.ones(3, 4, device="hologram")
    w2 = copy.deepcopy(w)  # a leaf tensor's deep copy carries its gradient
    assert w2.requires_grad and w2.grad.device == DEV
    assert torch.equal(w2.detach().cpu(), ref) and torch.equal(w2.grad.cpu(), torch.ones(3, 4))

    p = torch.nn.Parameter(ref.to("hologram"))
    p.grad = torch.ones(3, 4, device="hologram")
    q = copy.deepcopy(p)
    assert isinstance(q, torch.nn.Parameter) and q.requires_grad and q.device == DEV
    assert torch.equal(q.detach().cpu(), ref)
    assert q.grad is copy.deepcopy(torch.nn.Parameter(ref)).grad is None  # as on the CPU

    model = mlp().to("hologram")
    twin = copy.deepcopy(model)
    x = torch.randn(2, 5, device="hologram")
    close(twin(x), model(x).cpu())
    with torch.no_grad():
        twin[0].weight.add_(1)
    assert not torch.equal(twin[0].weight.cpu(), model[0].weight.cpu())
    assert copy.copy(x).device == DEV


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_storages():
    x = torch.arange(6.0, device="hologram")
    st = x.untyped_storage()
    for clone in (st.clone(), copy.copy(st), x.storage().clone().untyped()):
        assert clone.device == DEV and clone.nbytes() == 24
        assert clone.data_ptr() != st.data_ptr()
        assert torch.equal(torch.empty(0, device="hologram").set_(clone).view(torch.float32)
                           .cpu(), torch.arange(6.0))
    s = torch.UntypedStorage(16, device="hologram")
    assert s.device == DEV and s.nbytes() == 16
    s.fill_(3)
    assert s.tolist() == [3] * 16
    assert torch.UntypedStorage([1, 2, 255], device="hologram").tolist() == [1, 2, 255]
    assert torch.UntypedStorage(device="hologram").nbytes() == 0
    assert st.new().device == DEV and st.new().nbytes() == 0
    t = torch.TypedStorage(4, dtype=torch.float64, device="hologram")
    assert t.device == DEV and t.size() == 4
    assert torch.UntypedStorage(5).device.type == "cpu"  # CPU storages untouched
    assert torch.ones(2).untyped_storage().clone().device.type == "cpu"
    with pytest.raises(DeviceError, match="hologram:1 does not exist"):
        torch.UntypedStorage(4, device="hologram:1")
    with pytest.raises(UnsupportedError, match="cannot be resized in place"):
        st.resize_(100)
    with pytest.raises(UnsupportedError, match="shared memory"):
        x.share_memory_()
    assert torch.ones(2).share_memory_().is_shared()  # CPU sharing untouched


def test_generator_is_a_clear_error():
    with pytest.raises(NotImplementedError, match="getNewGenerator"):
        torch.Generator(device="hologram")
    g = torch.Generator().manual_seed(5)  # CPU generators drive random device ops
    a = torch.randn(4, device="hologram", generator=g)
    assert torch.equal(a.cpu(), torch.randn(4, generator=torch.Generator().manual_seed(5)))


# --- pinned memory, autocast, torch.accelerator -----------------------------------------

def test_pin_memory_and_dataloader():
    from torch.utils.data import DataLoader, TensorDataset

    src = torch.arange(6.0)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        pinned = src.pin_memory()
    assert pinned.device.type == "cpu" and torch.equal(pinned, src)
    assert pinned.data_ptr() != src.data_ptr()
    data = TensorDataset(torch.arange(20.0).reshape(10, 2), torch.arange(10))
    for workers in (0, 1):
        loader = DataLoader(data, batch_size=4, pin_memory=True, num_workers=workers)
        batches = list(loader)
        assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        assert torch.equal(torch.cat([b[0] for b in batches]), data.tensors[0])
        moved = [b[0].to("hologram", non_blocking=True) for b in batches]
        close(torch.cat(moved), data.tensors[0])
    back = torch.ones(3, device="hologram").to("cpu", non_blocking=True)
    assert back.device.type == "cpu" and torch.equal(back, torch.ones(3))


def test_autocast_follows_the_cpu_policy():
    """Products in the region's dtype (float16 by default), other ops at their inputs'
    precision, as torch.autocast('cpu') (the policy itself:
    tests/torch_device/device/test_autocast.py)."""
    cpu = mlp()
    dev = copy.deepcopy(cpu).to("hologram")
    x = torch.randn(4, 5)
    for kwargs in ({}, {"dtype": torch.bfloat16}, {"dtype": torch.float16}):
        with torch.autocast("hologram", **kwargs):
            y = dev(x.to("hologram"))
            z = torch.ones(2, device="hologram") * 3
        with torch.autocast("cpu", dtype=kwargs.get("dtype", torch.float16)):
            want = cpu(x)
        assert y.dtype == want.dtype == kwargs.get("dtype", torch.float16)
        close(y, want, rtol=2e-2, atol=2e-2)
        close(z, torch.full((2,), 3.0))
    y.float().sum().backward()


def test_accelerator():
    acc = torch.accelerator
    assert acc.current_accelerator() == torch.device("hologram")
    assert acc.is_available() and acc.device_count() == 1
    assert acc.current_device_index() == 0
    acc.synchronize()
    acc.synchronize(0)
    acc.synchronize("hologram:0")
    t = torch.empty(1 << 16, device="hologram")
    assert acc.memory_allocated() == torch.hologram.memory_allocated() >= t.nbytes
    assert acc.memory_reserved() == torch.hologram.memory_reserved()
    assert acc.max_memory_allocated() >= acc.memory_allocated()
    assert acc.memory_stats()["allocated_bytes.all.current"] == acc.memory_allocated()
    acc.reset_peak_memory_stats()
    acc.empty_cache()
    with pytest.raises(DeviceError):
        acc.synchronize(1)


def test_compat_install_is_idempotent():
    from hologram_torch import compat

    new, pin = torch.UntypedStorage.__new__, torch.Tensor.pin_memory
    compat.install()
    compat.install()
    assert torch.UntypedStorage.__new__ is new and torch.Tensor.pin_memory is pin
    x = torch.arange(3.0, device="hologram")
    assert torch.equal(copy.deepcopy(x).cpu(), torch.arange(3.0))


# --- the CPU fallback -------------------------------------------------------------------

def _fallback_op():
    """A cumulative op with no native kernel (cumsum, or cumprod if cumsum gained one)."""
    from hologram_torch.aten import NATIVE

    for name in ("cumsum", "cumprod", "logcumsumexp"):
        if not any(n.startswith(f"{name}.") or n.startswith(f"{name}_.") for n in NATIVE):
            return name
    pytest.fail("every candidate op has a native kernel: pick another fallback op")


def test_fallback_result_warning_and_stats():
    name = _fallback_op()
    fn = getattr(torch, name)
    ref = torch.randn(3, 5)
    x = ref.to("hologram")
    hologram_torch.reset_fallback_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = fn(x, 1)
        y2 = fn(x, 0)
    close(y, fn(ref, 1), rtol=1e-5, atol=1e-5)
    close(y2, fn(ref, 0), rtol=1e-5, atol=1e-5)
    ours = [w for w in caught if issubclass(w.category, hologram_torch.FallbackWarning)
            and name in str(w.message)]
    assert len(ours) == 1  # once per op, not per call
    stats = hologram_torch.fallback_stats(lacking=False)
    assert sum(n for op, n in stats.items() if op.startswith(f"aten.{name}")) == 2


def test_fallback_in_place_and_out():
    name = _fallback_op()
    ref = torch.rand(4, 3) + 0.5
    x = ref.to("hologram")
    # in place through a view: the base sees it
    getattr(x[1:], f"{name}_")(0)
    getattr(ref[1:], f"{name}_")(0)
    close(x, ref, rtol=1e-5, atol=1e-5)
    # out= of the right size, and out= that must be resized
    fn = getattr(torch, name)
    for start in ((4, 3), (0,)):
        out = torch.empty(start, device="hologram")
        result = fn(x, 1, out=out)
        assert result is out and out.shape == (4, 3)
        close(out, fn(ref, 1), rtol=1e-5, atol=1e-5)
    # out= that is a view into a larger tensor
    big = torch.zeros(5, 3, device="hologram")
    fn(x[0], 0, out=big[2])
    expected = torch.zeros(5, 3)
    expected[2] = fn(ref[0], 0)
    close(big, expected, rtol=1e-5, atol=1e-5)


# --- paths that used to crash the process -----------------------------------------------

RISKY = {
    "UntypedStorage": ("s = torch.UntypedStorage(8, device='hologram'); "
                       "print(s.device, s.nbytes())", "hologram:0 8"),
    "TypedStorage": ("print(torch.TypedStorage(2, dtype=torch.float32, device='hologram')"
                     ".size())", "2"),
    "storage.clone": ("x = torch.ones(3, device='hologram'); "
                      "print(x.untyped_storage().clone().nbytes())", "12"),
    "typed_storage.clone": ("x = torch.ones(3, device='hologram'); "
                            "print(x.storage().clone().size())", "3"),
    "storage.new": ("print(torch.ones(1, device='hologram').untyped_storage().new()"
                    ".nbytes())", "0"),
    "copy.copy(storage)": ("import copy; print(copy.copy(torch.ones(2, device='hologram')"
                           ".untyped_storage()).nbytes())", "8"),
    "deepcopy": ("import copy; print(copy.deepcopy(torch.ones(3, device='hologram'))"
                 ".sum().item())", "3.0"),
    "deepcopy(module)": ("import copy; m = torch.nn.Linear(2, 2).to('hologram'); "
                         "print(copy.deepcopy(m).weight.device)", "hologram:0"),
    "share_memory_": ("x = torch.ones(3, device='hologram')\ntry: x.share_memory_()\n"
                      "except RuntimeError as e: print(type(e).__name__)",
                      "UnsupportedError"),
    "storage.resize_": ("x = torch.ones(3, device='hologram')\n"
                        "try: x.untyped_storage().resize_(100)\n"
                        "except RuntimeError as e: print(type(e).__name__)",
                        "UnsupportedError"),
    "Generator": ("try: torch.Generator(device='hologram')\n"
                  "except NotImplementedError as e: print('NotImplementedError')",
                  "NotImplementedError"),
    "pin_memory": ("print(torch.ones(3).pin_memory().sum().item())", "3.0"),
    # pinned host memory comes from the native hooks; without them torch raises
    "empty(pin_memory=True)": ("try: print(torch.empty(3, pin_memory=True).is_pinned())\n"
                               "except NotImplementedError:\n"
                               "    print(not hologram_torch.native.active())", "True"),
    "DataLoader(pin_memory=True)": (
        "from torch.utils.data import DataLoader\n"
        "print(len(list(DataLoader(torch.arange(8.0), batch_size=2, pin_memory=True))))",
        "4"),
    "non_blocking d2h": ("print(torch.ones(2, device='hologram').to('cpu', "
                         "non_blocking=True).sum().item())", "2.0"),
    "autocast": ("with torch.autocast('hologram'):\n"
                 "    print((torch.ones(2, device='hologram') + 1).sum().item())", "4.0"),
    "accelerator.synchronize": ("torch.accelerator.synchronize(); print('ok')", "ok"),
    "accelerator.memory_allocated": (
        "print(torch.accelerator.memory_allocated() >= 0)", "True"),
    "torch.save/load": ("import io; b = io.BytesIO(); "
                        "torch.save(torch.ones(3, device='hologram'), b); b.seek(0); "
                        "print(torch.load(b).device)", "hologram:0"),
    "pickle": ("import pickle; print(pickle.loads(pickle.dumps(torch.ones(3, "
               "device='hologram'))).device)", "hologram:0"),
    "torch.load(map_location=hologram)": (
        "import io; b = io.BytesIO(); torch.save(torch.ones(3), b); b.seek(0); "
        "print(torch.load(b, map_location='hologram').device)", "hologram:0"),
}


#: Each snippet runs in a namespace of its own, after a marker line naming it; a crash
#: leaves the marker of the snippet that caused it last.
_RISKY_RUNNER = """
import sys, torch, hologram_torch
for name, code in SNIPPETS:
    print("@@", name, flush=True)
    exec(code, {"torch": torch, "hologram_torch": hologram_torch})
    sys.stdout.flush()
"""


def _run_risky(snippets):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    code = f"SNIPPETS = {snippets!r}\n" + _RISKY_RUNNER
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code],
                          capture_output=True, text=True, env=env, timeout=300)
    printed: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in proc.stdout.splitlines():
        if line.startswith("@@ "):
            lines = printed[line[3:]] = []
        else:
            lines.append(line)
    return proc, printed


@pytest.fixture(scope="module")
def risky_run():
    """All the snippets in one fresh process (importing torch costs seconds a process)."""
    return _run_risky([(name, code) for name, (code, _) in RISKY.items()])


@pytest.mark.parametrize("name", list(RISKY))
def test_risky_path_does_not_crash(risky_run, name):
    code, expected = RISKY[name]
    proc, printed = risky_run
    # The shared process stopped in this snippet or before it: a process of its own. (A
    # snippet followed by another's marker ran to its end.)
    if proc.returncode != 0 and (name not in printed or name == list(printed)[-1]):
        proc, printed = _run_risky([(name, code)])
        assert proc.returncode == 0, (
            f"{name}: exit status {proc.returncode} (negative: killed by signal "
            f"{-proc.returncode})\n{proc.stderr[-3000:]}")
    assert printed[name][-1:] == [expected], printed[name]


# --- the torch.backends entry point -----------------------------------------------------

def test_entry_point_declared_and_callable():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    target = project["entry-points"]["torch.backends"]["hologram"]
    assert target == "hologram_torch.autoload:load"
    module, _, attr = target.partition(":")
    fn = getattr(importlib.import_module(module), attr)
    assert callable(fn)
    fn()  # torch calls it with no arguments; the import already registered the device
    from importlib.metadata import entry_points

    installed = [e for e in entry_points(group="torch.backends") if e.name == "hologram"]
    for entry in installed:  # only when the package is pip-installed
        assert entry.value == target and entry.load() is fn


@pytest.mark.parametrize("first", ["torch", "hologram_torch"])
@pytest.mark.parametrize("autoload", ["1", "0"])
def test_import_torch_autoloads_the_device(tmp_path, autoload, first):
    """What `pip install` of the package makes torch do: a distribution declaring the
    entry point (here a bare .dist-info on the path) is loaded by `import torch`, unless
    TORCH_DEVICE_BACKEND_AUTOLOAD is anything but "1"."""
    info = tmp_path / "hologram_autoload_check-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hologram-autoload-check\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(
        "[torch.backends]\nhologram = hologram_torch.autoload:load\n")
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload,
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    # Importing hologram_torch first runs torch's autoload while the package is half
    # initialized: the entry point must still resolve (it once failed torch's import).
    code = (f"import sys, {first}, torch\n"
            "print(torch._C._get_privateuse1_backend_name(), 'hologram_torch' in sys.modules)\n"
            "if 'hologram_torch' in sys.modules:\n"
            "    print(torch.ones(2, device='hologram').device)\n")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.split()
    if autoload == "1" or first == "hologram_torch":
        assert lines == ["hologram", "True", "hologram:0"]
    else:
        assert lines == ["privateuseone", "False"]


@pytest.mark.parametrize("make", [
    lambda x: torch.quantize_per_tensor(x, 0.1, 0, torch.quint8),
    lambda x: torch.quantize_per_channel(x, torch.ones(4), torch.zeros(4, dtype=torch.long), 0,
                                         torch.qint8),
    lambda x: torch.quantize_per_tensor(x.cpu(), 0.1, 0, torch.quint8).to("hologram"),
    lambda x: torch._empty_affine_quantized([2], scale=0.1, zero_point=0, dtype=torch.quint8,
                                            device="hologram"),
])
def test_quantized_tensors_are_refused_clearly(make):
    """The device has no quantizer: making a quantized device tensor raises the documented
    NotImplementedError (it once failed an internal assert of PyTorch's)."""
    x = torch.randn(4, 4, device="hologram")
    with (pytest.raises(NotImplementedError, match="quantized tensors are not supported"),
          warnings.catch_warnings()):
        warnings.simplefilter("ignore")
        make(x)


def test_complex_half_warns_as_the_cpu():
    """New ComplexHalf memory warns that support is experimental, as PyTorch's allocator
    does: once, or at every allocation under torch.set_warn_always(True)."""
    previous = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        for make in (lambda: torch.empty(3, dtype=torch.chalf, device="hologram"),
                     lambda: torch.empty_strided((2, 2), (1, 2), dtype=torch.chalf,
                                                 device="hologram")):
            with pytest.warns(UserWarning, match="ComplexHalf support is experimental"):
                make()
    finally:
        torch.set_warn_always(previous)


def test_lazy_modules_move_to_another_dtype_before_their_first_forward():
    """Module.to(dtype) copies an UninitializedParameter, whose shape a Python kernel
    must not read (it raises); the first forward then initializes it on the device."""
    torch.manual_seed(0)
    cpu = torch.nn.LazyConv2d(4, 3).to(torch.float64)
    torch.manual_seed(0)
    dev = torch.nn.LazyConv2d(4, 3).to("hologram").to(torch.float64)
    assert isinstance(dev.weight, torch.nn.parameter.UninitializedParameter)
    assert dev.weight.dtype == torch.float64 and dev.weight.device.type == "hologram"
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64)
    torch.manual_seed(1)
    expected = cpu(x)
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = dev(x.to("hologram"))
    assert dev.weight.shape == (4, 2, 3, 3)
    torch.testing.assert_close(got.cpu(), expected)
