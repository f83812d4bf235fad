"""The torch device on GPU memory: ``HOLOGRAM_TORCH_BACKEND=cuda``, emulated, and
``HOLOGRAM_TORCH_BACKEND=webgpu`` on Mesa's lavapipe.

On a GPU backend a device tensor's storage is a block of device memory whose data pointer
the host never dereferences (hologram_torch/memory.py): copies go through the backend,
host computations (the CPU fallback, errors that read values, printing) work on copies
that are written back, and numbers reach the kernels through device memory. Without a
GPU, ``HOLOGRAM_CUDA_EMULATE=1`` runs the same kernels in Triton's interpreter on host
memory behind device-style handles (hologram/backends/cuda/emulated.py): a host access
through a data pointer faults, as on a GPU, instead of silently working. webgpu runs its
WGSL kernels for real on lavapipe, a Vulkan driver on the CPU (correctness only), on
buffers whose data pointers are made-up handles (hologram/backends/webgpu/memory.py);
ops on dtypes it lacks (f64, i64 division) run through the CPU fallback.

The backend is chosen before the first device tensor, so the checks run in one fresh
process per backend and mode; each compares with PyTorch on the CPU. (The same checks
ran on an H200 for cuda: docs/cuda.md.)
"""

from __future__ import annotations

import os

import pytest
from util import device_checks, run_fresh

pytest.importorskip("torch")

REQUIRE_WEBGPU = os.environ.get("HOLOGRAM_REQUIRE_WEBGPU", "") not in ("", "0")

#: Each check is a snippet that sets ``ok`` (True, or a string saying what differs).
CHECKS = {
    "the GPU is probed at first use, not on import": """
ok = memory._device["resolve"] is not None and memory._device["allocator"] is None
""",
    "memory is GPU-style": """
x = torch.ones(3, device=D)
handle = x.data_ptr() >> 55 & 1 == 1 if BACKEND == "cuda" else x.data_ptr() >> 32 > 0
ok = hologram_torch.get_backend() == BACKEND and not memory.host_memory() and handle
""",
    "views at any offset, every dtype": """
ok = True
for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
              torch.int16, torch.int8, torch.uint8, torch.bool):
    c = torch.testing.make_tensor((7, 5), dtype=dtype, device="cpu", low=-9, high=9)
    d = c.to(D)
    for rows, cols in ((slice(1, None), slice(None)), (slice(None), slice(3, None)),
                       (slice(2, 5), slice(1, 4))):
        got, want = d[rows, cols], c[rows, cols]
        n, m = want.shape  # another view of that shape, at the storage's other end
        e, ec = d.clone(), c.clone()
        e[rows, cols] = d[-n:, -m:]
        ec[rows, cols] = c[-n:, -m:]
        same = (torch.equal((got == got).cpu(), want == want)
                and torch.equal(torch.where(got != got, got, got).cpu(), want)
                and torch.equal(got.t().contiguous().cpu(), want.t().contiguous())
                and torch.equal(e.cpu(), ec))
        ok = ok and same or f"{dtype} {rows} {cols}"
""",
    "uploads of a broadcast scalar and of autograd's zero tensors": """
# A one-element tensor is contiguous whatever its strides: (0, 0) where it was expanded.
one = torch.tensor(2.5).expand(1, 1)
zero = torch._efficientzerotensor((2, 3))  # what sgn's backward gives a real input
x = torch.randn(5, requires_grad=True)
d = x.detach().to(D).requires_grad_()
(g,) = torch.autograd.grad(torch.sgn(d), d, torch.ones(5, device=D))
ok = (torch.equal(one.to(D).cpu(), one) and torch.equal(zero.to(D).cpu(), torch.zeros(2, 3))
      and torch.equal(g.cpu(), torch.zeros(5)))
""",
    "in place through aliases": """
x = torch.randn(6, 5)
d = x.to(D)
for t in (x, d):
    t.add_(t)
    t[2:, 1:].mul_(t[2:, 1:])
    t.t().add_(t.t(), alpha=2.0)
    t.clamp_(-1, 1)
ok = torch.equal(d.cpu(), x)
""",
    "copies both ways, every dtype and layout": """
ok = True
for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
              torch.int8, torch.uint8, torch.bool, torch.complex64):
    c = torch.testing.make_tensor((5, 7), dtype=dtype, device="cpu")
    d = c.to(D)
    for got, want in ((d.cpu(), c), (d.t().cpu(), c.t()), (d[1:4, ::2].cpu(), c[1:4, ::2]),
                      (d[2, 3].cpu(), c[2, 3]), (d[:0].cpu(), c[:0]),
                      (c.t().to(D).cpu(), c.t()), (d.conj().cpu(), c.conj())):
        ok = ok and got.dtype == want.dtype and torch.equal(got, want)
""",
    "numbers and CPU scalars": """
x = torch.randn(4, 5)
d = x.to(D)
ok = all(torch.allclose((d * s + torch.tensor(t)).cpu(), x * s + torch.tensor(t), rtol=0,
                        atol=0, equal_nan=True)
         for s, t in ((2.5, 1.0), (-0.0, float("nan")), (3, -2.0), (2.5, 1.0)))
ok = ok and torch.equal((d > 0).sum().cpu(), (x > 0).sum()) and d[1, 2].item() == x[1, 2].item()
""",
    "writes through views": """
x = torch.randn(6, 8)
d = x.to(D)
for t in (x, d):
    t[1:3, ::2] = 5.0
    t[:, 7].zero_()
    t.t()[2].mul_(3)
    t[torch.tensor([0, 4]).to(t.device)] = -1.0
    t.masked_fill_(t > 2, 2.0)
ok = torch.equal(d.cpu(), x)
""",
    "CPU fallback: results, in place, out=": """
x = torch.randn(5, 6)
d = x.to(D)
o, oc = torch.empty(5, 6, device=D), torch.empty(5, 6)
torch.cumsum(d, 1, out=o)
torch.cumsum(x, 1, out=oc)
e, ec = d.clone(), x.clone()
e.t().cumsum_(0)
ec.t().cumsum_(0)
ok = (torch.equal(torch.flip(d, [0]).cpu(), torch.flip(x, [0])) and torch.equal(o.cpu(), oc)
      and torch.equal(e.cpu(), ec) and torch.equal(d[d > 0].cpu(), x[x > 0])
      and torch.equal(d.nonzero().cpu(), x.nonzero()))
""",
    "random draws in place": """
torch.manual_seed(3)
a = torch.empty(4, 3, device=D).normal_()
torch.manual_seed(3)
ok = torch.equal(a.cpu(), torch.empty(4, 3).normal_())
""",
    "errors that read values": """
d = torch.zeros(3, device=D)
try:
    d[torch.tensor([5]).to(D)]
    ok = "no error"
except IndexError as e:
    ok = "out of bounds" in str(e)
""",
    "resize, storages, save and load": """
import io
d = torch.arange(6.0, device=D)
d.resize_(20)
s = torch.UntypedStorage([1, 2, 3], device=D)
b = io.BytesIO()
torch.save(torch.arange(4, device=D), b)
b.seek(0)
back = torch.load(b)
ok = (torch.equal(d[:6].cpu(), torch.arange(6.0)) and bytes(s.cpu()) == bytes([1, 2, 3])
      and back.device.type == "hologram" and torch.equal(back.cpu(), torch.arange(4)))
""",
    "printing": """
ok = "tensor([1.5000, 2.0000], device='hologram:0')" == repr(
    torch.tensor([1.5, 2.0]).to(D))
""",
    "a training step matches the CPU's": """
losses = {}
for dev in ("cpu", D):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                            torch.nn.Linear(16, 4)).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    torch.manual_seed(1)
    x, t = torch.randn(6, 8).to(dev), torch.randint(0, 4, (6,)).to(dev)
    seen = []
    for _ in range(2):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x), t)
        loss.backward()
        opt.step()
        seen.append(loss.item())
    losses[str(dev)] = seen
ok = all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(losses["cpu"], losses["hologram"])) \
    or str(losses)
""",
    "memory statistics, synchronize": """
before = torch.hologram.memory_allocated()
x = torch.empty(1 << 16, device=D)
grown = torch.hologram.memory_allocated() - before
torch.hologram.synchronize()
del x
torch.hologram.empty_cache()
ok = grown >= 1 << 18 and torch.hologram.memory_allocated() == before
""",
    "streams and events": """
H = torch.hologram
s, start, end = H.Stream(), H.Event(enable_timing=True), H.Event(enable_timing=True)
x = torch.arange(5.0, device=D)
start.record()
with H.stream(s):
    y = x * 2 + 1
    y.record_stream(s)
    s.record_event(end)
H.current_stream().wait_stream(s)
H.synchronize()
ok = (torch.equal(y.cpu(), torch.arange(5.0) * 2 + 1) and s.query() and end.query()
      and start.elapsed_time(end) >= 0)
""",
    "DLPack: the memory is shared with no one": """
from hologram.errors import DeviceError
x = torch.ones(3, device=D)
ok = x.__dlpack_device__() == (torch.utils.dlpack.DLDeviceType.kDLExtDev, 0)
why = "HOLOGRAM_CUDA_EMULATE" if BACKEND == "cuda" else "webgpu buffers, which have no"
for attempt in (lambda: x.__dlpack__(), lambda: hologram_torch.from_dlpack(torch.ones(3))):
    try:
        attempt()
        ok = "shared"
    except DeviceError as e:
        ok = ok and why in str(e)
""",
    "dtypes the backend lacks run through the CPU fallback": """
import warnings
a = torch.randn(4, 3, dtype=torch.float64)
i = torch.arange(-6, 6)
da, di = a.to(D), i.to(D)
hologram_torch.reset_fallback_stats()
with warnings.catch_warnings():
    warnings.simplefilter("ignore", hologram_torch.FallbackWarning)
    got = [(da * 2.5 + 1).cpu(), da.sum(0).cpu(), (di // 4).cpu(), (di % 5).cpu(),
           (da[1:] @ da[1:].t()).cpu()]
want = [a * 2.5 + 1, a.sum(0), i // 4, i % 5, a[1:] @ a[1:].t()]
ok = all(g.dtype == w.dtype and torch.allclose(g, w) for g, w in zip(got, want))
counted = sum(hologram_torch.fallback_stats().values())
ok = ok and (counted > 0) == (BACKEND == "webgpu") or (ok, counted)
""",
    "CPU tensors still compute on the host": """
a, b = torch.randn(6), torch.randn(6)
ok = torch.equal(hologram_torch.functional.mul(a, b), a * b) and torch.equal(
    hologram_torch.functional.add(a, torch.tensor(2.0)), a + 2.0)
""",
    "torch.compile runs its graphs on the GPU": """
def step(a, b, s):
    return torch.relu(a * b + s).sum(1)
a, b = torch.randn(8, 5), torch.randn(8, 5)
want = [step(a, b, s) for s in (0.5, 1.5)]
f = torch.compile(step, backend="hologram")  # the device's backend, a CPU scalar staged
got = [f(a.to(D), b.to(D), torch.tensor(s)) for s in (0.5, 1.5)]
stats = hologram_torch.compile_stats()
ok = (all(g.device.type == D.type and torch.allclose(g.cpu(), w) for g, w in zip(got, want))
      and stats["programs"] >= 1 and stats["eager_fallbacks"] == 0)
gather = torch.compile(lambda x, i: torch.gather(x, 1, i), backend="hologram")
try:  # the index check runs on the GPU, raised as eagerly
    gather(a.to(D), torch.tensor([[0, 7]]).expand(8, 2).to(D))
    ok = "no error"
except RuntimeError as e:
    ok = ok and "out of bounds" in str(e)
hologram_torch.reset_compile_stats()
h = torch.compile(lambda a, b, s: step(a, b, s), backend="hologram",
                  options={"backend": "cpu"})
ok = (ok and torch.allclose(h(a.to(D), b.to(D), 0.5).cpu(), want[0])  # host: eagerly
      and hologram_torch.compile_stats()["eager_fallbacks"] >= 1)
hologram_torch.reset_compile_stats()
g = torch.compile(lambda a, b, s: step(a, b, s), backend="hologram")
ok = ok and torch.allclose(g(a, b, 0.5), want[0]) and \
    hologram_torch.compile_stats()["eager_fallbacks"] == 0  # CPU tensors: for the host
""",
    "the backend stays": """
from hologram.errors import DeviceError
try:
    hologram_torch.set_backend("cpu")
    ok = "switched to host memory"
except DeviceError as e:
    ok = "before the first hologram tensor" in str(e)
""",
}

def _webgpu() -> bool:
    from hologram.backends.webgpu.backend import WebGpuBackend

    return WebGpuBackend.is_available()


@pytest.fixture(scope="module", params=[("cuda", "op by op"), ("cuda", "recorded"),
                                        ("webgpu", "op by op"), ("webgpu", "recorded")],
                ids="-".join)
def results(request):
    backend, mode = request.param
    if backend == "cuda":
        pytest.importorskip("triton")
    elif not (REQUIRE_WEBGPU or _webgpu()):
        pytest.skip("no WebGPU adapter (apt-get install mesa-vulkan-drivers libvulkan1)")
    return device_checks(CHECKS, {"HOLOGRAM_CUDA_EMULATE": "1",
                                  "HOLOGRAM_TORCH_BACKEND": backend,
                                  "HOLOGRAM_LAZY": "1" if mode == "recorded" else "0"})


@pytest.mark.parametrize("name", list(CHECKS))
def test_device_on_gpu_memory(results, name):
    assert results[name] is True, results[name]


def test_a_named_cuda_that_cannot_run_here_gives_the_host_backend_at_first_use():
    """HOLOGRAM_TORCH_BACKEND=cuda without a GPU (and without the emulation): importing
    torch probes nothing; the first device tensor warns and the device runs on the host."""
    pytest.importorskip("triton")
    code = ("import warnings, torch, hologram_torch\n"
            "from hologram_torch import memory\n"
            "assert hologram_torch.get_backend() == 'cuda' and memory._device['resolve']\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            "    x = torch.ones(3, device='hologram') * 2\n"
            "said = [str(w.message) for w in seen if 'HOLOGRAM_TORCH_BACKEND' in str(w.message)]\n"
            "print(hologram_torch.get_backend(), memory.host_memory(), x.cpu().tolist(), said)")
    proc = run_fresh(code, {"HOLOGRAM_TORCH_BACKEND": "cuda", "HOLOGRAM_CUDA_EMULATE": None},
                     timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("cpu True [2.0, 2.0, 2.0] ")
    assert "HOLOGRAM_TORCH_BACKEND=cuda: backend 'cuda' cannot run on this machine" in \
        proc.stdout and "the device uses cpu" in proc.stdout
