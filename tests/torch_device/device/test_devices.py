"""Several devices: ``HOLOGRAM_TORCH_DEVICES=N`` makes hologram:0 to hologram:N-1 on host
memory (as JAX's host platform device count does), so that code written for several GPUs
(a model split over two devices, ``torch.cuda.set_device(rank)``) runs on one machine.

Each device's tensors carry its index; a kernel's results go to its operands' device
(the registry's guard, as CUDA's device guards), operands on two devices are PyTorch's
error, copies move tensors between them, and ``set_device``/``device(i)`` choose where
tensors made without an index go. The count is fixed before the first device tensor, so
the checks run in fresh processes, op by op and recorded, each against the CPU.
"""

from __future__ import annotations

import pytest
from util import device_checks, run_fresh

pytest.importorskip("torch")

#: Each check is a snippet that sets ``ok`` (True, or a string saying what differs).
CHECKS = {
    "count, indices and the current device": """
H = torch.hologram
a = torch.arange(6.0, device="hologram:1")
ok = (H.device_count() == 2 and H.current_device() == 0 and a.device.index == 1
      and a.untyped_storage().device.index == 1 and repr(a).endswith("device='hologram:1')"))
""",
    "results go to their operands' device": """
x = torch.randn(4, 5)
d = x.to("hologram:1")
got = [d * 2, d.t() @ d, d.sum(0), d[1:].relu_(), torch.cumsum(d, 1), d.view(20),
       torch.cat([d, d]), d.clone(), d.new_zeros(3), torch.empty_like(d), d.float()]
ok = all(g.device.index == 1 for g in got) or [str(g.device) for g in got]
ok = ok is True and torch.equal(got[0].cpu(), x * 2) and torch.allclose(got[1].cpu(), x.t() @ x)
""",
    "two devices in one op: PyTorch's error": """
a, b = torch.ones(3, device="hologram:0"), torch.ones(3, device="hologram:1")
ok = "no error"
try:
    a + b
except RuntimeError as e:
    ok = "Expected all tensors to be on the same device" in str(e) and "hologram:1" in str(e)
""",
    "copies between devices": """
x = torch.randn(3, 4)
a = x.to("hologram:0")
b = a.to("hologram:1")
c = torch.empty(3, 4, device="hologram:1")
c.copy_(a.t().t())
e = torch.empty(4, 3, device="hologram:0")
e.copy_(b.t())
ok = (b.device.index == 1 and torch.equal(b.cpu(), x) and torch.equal(c.cpu(), x)
      and torch.equal(e.cpu(), x.t()) and b.data_ptr() != a.data_ptr())
""",
    "set_device and the device context": """
H = torch.hologram
H.set_device(1)
first = torch.zeros(2, device="hologram").device.index
H.set_device(0)
with H.device(1):
    inside = (torch.ones(2, device="hologram").device.index, H.current_device())
after = torch.ones(2, device="hologram").device.index
ok = (first, inside, after) == (1, (1, 1), 0) or str((first, inside, after))
""",
    "an invalid ordinal": """
from hologram_torch.device import InvalidDeviceError
ok = "no error"
try:
    torch.ones(2, device="hologram:2")
except RuntimeError as e:
    ok = isinstance(e, InvalidDeviceError) and "hologram:0 to hologram:1" in str(e)
""",
    "a model split over two devices trains like the CPU": """
def run(first, second):
    torch.manual_seed(0)
    a, b = torch.nn.Linear(6, 8).to(first), torch.nn.Linear(8, 3).to(second)
    opt = torch.optim.AdamW([*a.parameters(), *b.parameters()], lr=0.05)
    x, t = torch.randn(5, 6), torch.randint(0, 3, (5,))
    losses = []
    for _ in range(3):
        opt.zero_grad()
        h = torch.nn.functional.gelu(a(x.to(first)))
        loss = torch.nn.functional.cross_entropy(b(h.to(second)), t.to(second))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.device for p in (*a.parameters(), *b.parameters())]
want, _ = run("cpu", "cpu")
got, where = run("hologram:0", "hologram:1")
ok = (all(abs(g - w) <= 1e-5 * abs(w) for g, w in zip(got, want))
      and [d.index for d in where] == [0, 0, 1, 1]) or str((got, want, where))
""",
    "the CPU fallback keeps the device": """
import warnings
x = torch.randn(5)
d = x.to("hologram:1")
with warnings.catch_warnings():
    warnings.simplefilter("ignore", hologram_torch.FallbackWarning)
    s = torch.sort(d)
    m = d[d > 0]
ok = (s.values.device.index == 1 and m.device.index == 1
      and torch.equal(s.values.cpu(), torch.sort(x).values) and torch.equal(m.cpu(), x[x > 0]))
""",
    "save and load keep the device": """
import io
buffer = io.BytesIO()
torch.save(torch.arange(4.0, device="hologram:1"), buffer)
buffer.seek(0)
back = torch.load(buffer)
ok = back.device.index == 1 and torch.equal(back.cpu(), torch.arange(4.0))
""",
}

@pytest.fixture(scope="module", params=["op by op", "recorded"])
def results(request):
    from hologram_torch import native

    if not native.active():
        pytest.skip(f"several devices need the device's native library: {native.reason()}")
    return device_checks(CHECKS, {"HOLOGRAM_TORCH_DEVICES": "2",
                                  "HOLOGRAM_TORCH_BACKEND": "cpu",
                                  "HOLOGRAM_LAZY": "1" if request.param == "recorded" else "0"})


@pytest.mark.parametrize("name", list(CHECKS))
def test_several_devices(results, name):
    assert results[name] is True, results[name]


def test_a_gpu_backend_keeps_one_device_and_says_why():
    """GPU memory is one GPU's: HOLOGRAM_TORCH_DEVICES=2 with the cuda emulation warns and
    makes one device."""
    pytest.importorskip("triton")
    code = ("import warnings\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            "    import torch, hologram_torch\n"
            "    torch.ones(1, device='hologram')\n"
            "print(torch.hologram.device_count(),"
            " [str(w.message) for w in seen if 'HOLOGRAM_TORCH_DEVICES' in str(w.message)])")
    proc = run_fresh(code, {"HOLOGRAM_TORCH_DEVICES": "2", "HOLOGRAM_TORCH_BACKEND": "cuda",
                            "HOLOGRAM_CUDA_EMULATE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("1 ") and "one GPU" in proc.stdout, proc.stdout
