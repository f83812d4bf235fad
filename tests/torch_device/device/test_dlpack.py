"""DLPack for device tensors (hologram_torch/dlpack.py): export with ``__dlpack__`` (read
by NumPy and torch), import with ``hologram_torch.from_dlpack``, no copy either way.

On host memory (the cpu backend: this process) the capsules are kDLCPU and NumPy and
torch's C code are the other side. On GPU memory the capsules are kDLCUDA: checked here on
the recording fake driver of tests/test_cuda_runtime.py in a fresh process (the device's
memory is chosen once per process), which proves the capsules' contents, strides and
stream calls, not a CUDA consumer's reads; those ran on an H200 (docs/torch.md).
"""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402
from hologram.errors import DeviceError  # noqa: E402
from hologram_torch import dlpack, lazy  # noqa: E402

D = "hologram"
ROOT = Path(__file__).resolve().parents[3]


def _shares(a, b) -> bool:
    return np.shares_memory(a, b) if isinstance(a, np.ndarray) else (
        a.untyped_storage().data_ptr() <= b.data_ptr() < a.untyped_storage().data_ptr()
        + max(a.untyped_storage().nbytes(), 1))


@pytest.mark.parametrize("dtype", list(dlpack.CODES))
def test_every_dtype_exports_to_torch_on_the_same_memory(dtype):
    want = torch.testing.make_tensor((5, 7), dtype=dtype, device="cpu")
    h = want.to(D)
    assert h.__dlpack_device__() == (torch.utils.dlpack.DLDeviceType.kDLCPU, 0)
    for got, expected in ((h, want), (h.t(), want.t()), (h[1:, 2:], want[1:, 2:]),
                          (h[:, ::3], want[:, ::3]), (h[2, 3], want[2, 3]),
                          (h[:0], want[:0])):
        c = torch.from_dlpack(got)
        assert c.device.type == "cpu" and c.dtype == dtype
        assert c.shape == expected.shape and c.stride() == expected.stride()
        assert torch.equal(c, expected)
        if got.numel():
            assert c.data_ptr() == got.data_ptr()


def test_numpy_reads_and_writes_the_device_tensors_memory():
    h = torch.arange(12.0, device=D).reshape(3, 4)
    a = np.from_dlpack(h[1:, 1:])
    np.testing.assert_array_equal(a, np.arange(12.0).reshape(3, 4)[1:, 1:])
    a[0, 0] = -1.0  # the host writes the device's memory (host memory: no copy)
    assert h[1, 1].item() == -1.0
    h.mul_(2)
    torch.hologram.synchronize()  # the device may run later (recorded ops), as a GPU would
    assert a[0, 0] == -2.0


def test_an_export_runs_the_recorded_ops_it_depends_on_first():
    with hologram_torch.set_lazy(True):
        x = torch.arange(6.0, device=D)
        y = x * 2 + 1
        x.add_(10)
        a = np.from_dlpack(y)
        np.testing.assert_array_equal(a, np.arange(6.0) * 2 + 1)
        np.testing.assert_array_equal(np.from_dlpack(x), np.arange(6.0) + 10)
        assert not lazy.pending()


def test_an_exported_tensor_outlives_the_device_tensor():
    h = torch.full((1000,), 3.0, device=D)
    a = np.from_dlpack(h)
    del h
    gc.collect()
    others = [torch.full((1000,), 7.0, device=D) for _ in range(8)]  # would reuse the block
    np.testing.assert_array_equal(a, np.full(1000, 3.0))
    assert all(o[0].item() == 7.0 for o in others)


def test_exports_torch_refuses_are_refused_with_its_errors():
    x = torch.ones(3, device=D, requires_grad=True)
    with pytest.raises(BufferError, match="require gradient"):
        x.__dlpack__()
    z = torch.ones(3, dtype=torch.complex64, device=D)
    with pytest.raises(BufferError, match="conjugate bit"):
        torch.from_dlpack(z.conj())
    with pytest.raises(BufferError, match="negative bit"):
        torch.from_dlpack(z.conj().imag)
    assert torch.from_dlpack(x.detach()).data_ptr() == x.data_ptr()


def test_copy_and_dl_device_ask_for_a_copy_or_the_same_memory():
    h = torch.arange(4.0, device=D)
    kcpu = (torch.utils.dlpack.DLDeviceType.kDLCPU, 0)
    copied = torch.from_dlpack(h, copy=True)
    assert copied.data_ptr() != h.data_ptr() and torch.equal(copied, h.cpu())
    same = torch.from_dlpack(h.__dlpack__(dl_device=kcpu))
    assert same.data_ptr() == h.data_ptr()
    with pytest.raises(BufferError, match="not on"):
        h.__dlpack__(dl_device=(torch.utils.dlpack.DLDeviceType.kDLCUDA, 0))


def test_the_legacy_to_dlpack_exports_the_devices_memory():
    h = torch.arange(4.0, device=D)
    back = torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(h))
    assert back.device.type == "cpu" and back.data_ptr() == h.data_ptr()
    c = torch.arange(3)
    assert torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(c)).data_ptr() == \
        c.data_ptr()


def test_cpu_tensors_keep_torchs_own_protocol():
    c = torch.arange(3.0)
    assert c.__dlpack_device__() == (torch.utils.dlpack.DLDeviceType.kDLCPU, 0)
    assert torch.from_dlpack(c).data_ptr() == c.data_ptr()
    assert torch.Tensor.__dlpack__.__name__ == "__dlpack__"


def test_from_dlpack_shares_numpy_memory_at_any_offset():
    base = np.arange(40, dtype=np.float32)
    view = base[1:37].reshape(6, 6)[:, 1:5]  # 4 bytes past a 16-byte boundary, strided
    h = hologram_torch.from_dlpack(view)
    assert h.device.type == D and h.data_ptr() == view.ctypes.data
    assert h.stride() == (6, 1) and h.shape == (6, 4)
    np.testing.assert_array_equal((h * 2 + 1).cpu().numpy(), view * 2 + 1)
    np.testing.assert_array_equal(h.sum(1).cpu().numpy(), view.sum(1))
    h.add_(100)  # the producer sees the device's writes, once they ran
    torch.hologram.synchronize()
    assert base[2] == 102 and base[1] == 1
    assert torch.hologram.from_dlpack is hologram_torch.from_dlpack


def test_from_dlpack_takes_cpu_tensors_capsules_and_keeps_the_producer_alive():
    c = torch.randn(8, 6, dtype=torch.bfloat16).t()
    h = hologram_torch.from_dlpack(c)
    assert h.dtype == torch.bfloat16 and h.stride() == c.stride()
    assert torch.equal((h + 1).cpu(), c + 1)
    capsule = torch.utils.dlpack.to_dlpack(torch.arange(5))
    from_capsule = hologram_torch.from_dlpack(capsule)
    assert from_capsule.tolist() == [0, 1, 2, 3, 4]
    a = np.full(100, 5.0)
    h = hologram_torch.from_dlpack(a)
    del a
    gc.collect()
    assert (h + 0).cpu().tolist() == [5.0] * 100
    d = torch.ones(2, device=D)
    assert hologram_torch.from_dlpack(d).data_ptr() == d.data_ptr()


def test_from_dlpack_refuses_another_devices_memory_naming_the_copy():
    class OnGpu:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            raise AssertionError("never asked for its capsule")

    with pytest.raises(DeviceError, match=r"kDLCUDA memory .* host memory .*t\.cpu\(\)"):
        hologram_torch.from_dlpack(OnGpu())


_GPU_MEMORY = r"""
import sys, gc
sys.path.insert(0, TESTS)
import numpy as np, torch
from test_cuda_runtime import FakeDriver
from test_cuda_dlpack import _Handmade
import hologram_torch
from hologram.backends.cuda import dlpack as cuda_dlpack
from hologram.backends.cuda.runtime import DeviceMemory
from hologram_torch import memory

driver = FakeDriver()
memory.use_memory(DeviceMemory(driver), "cuda")
t = memory.empty([4, 5], torch.float32)
assert t.__dlpack_device__() == (torch.utils.dlpack.DLDeviceType.kDLCUDA, 0)
v = t[1:, 2:]
capsule = v.__dlpack__(stream=0x7E57AB1E, max_version=(1, 0))
assert driver.calls[-2:] == [("record", "event", driver.stream), ("wait", 0x7E57AB1E, "event")]
got = cuda_dlpack.unpack(capsule, "test")
assert got.data == t.data_ptr() + (1 * 5 + 2) * 4 == v.data_ptr(), (got.data, v.data_ptr())
assert (got.shape, got.strides, got.device, got.code, got.bits) == ((3, 3), (5, 1), (2, 0), 2, 32)
driver.copy_in(t.data_ptr(), np.arange(20, dtype=np.float32))
host = torch.from_dlpack(t.__dlpack__(dl_device=(1, 0)))  # a host copy of GPU memory
assert host.device.type == "cpu" and host.tolist() == np.arange(20.0).reshape(4, 5).tolist()
try:
    t.__dlpack__(dl_device=(1, 0), copy=False)
except BufferError as e:
    assert "only as a copy" in str(e), e
else:
    raise AssertionError("GPU memory was exported to the host without a copy")
empty = cuda_dlpack.unpack(memory.empty([0, 3], torch.float32).__dlpack__(), "test")
assert (empty.shape, empty.device) == ((0, 3), (2, 0))
empty.release()
b = memory.empty([3], torch.bfloat16)
got_b = cuda_dlpack.unpack(b.__dlpack__(stream=-1), "test")
assert (got_b.code, got_b.bits, got_b.strides) == (4, 16, (1,))
del t, v, b
gc.collect()
held = memory.stats()["allocated_bytes"]
assert held > 0, held  # the capsules hold the blocks until their deleters run
got.release(); got_b.release()
gc.collect()
driver.finish(0x7E57AB1E); driver.finish(None); memory.synchronize()

producer = _Handmade(0x7E0000001000, (3, 4), dtype=(4, 16), strides=(1, 3), byte_offset=4,
                     versioned=True)
h = hologram_torch.from_dlpack(producer)
assert producer.streams == [driver.stream]
assert h.dtype == torch.bfloat16 and h.shape == (3, 4) and h.stride() == (1, 3)
assert h.data_ptr() == 0x7E0000001004 and h.storage_offset() == 2
assert h.untyped_storage().data_ptr() == 0x7E0000001000
del h
gc.collect()
assert producer.deleted == 0  # after the work queued on our stream by then
driver.finish(); memory.synchronize()
assert producer.deleted == 1
src = torch.arange(6.0).pin_memory()  # (the native hooks' pinned memory)
dst = memory.empty([6], torch.float32)
dst.copy_(src, non_blocking=True)
assert bytes(driver.memory[dst.data_ptr()][:24]) == src.numpy().tobytes()
assert (driver.calls[-2][0] == "copy in async") == src.is_pinned(), driver.calls[-3:]
try:
    hologram_torch.from_dlpack(_Handmade(0x1000, (3,), device=(1, 0)))
except Exception as e:
    assert "cpu:0 memory" in str(e), e
else:
    raise AssertionError("host memory was taken for the GPU's")
print("OK")
"""


def test_on_gpu_memory_capsules_are_kdlcuda_with_strides_and_stream_order():
    code = _GPU_MEMORY.replace("TESTS", repr(str(ROOT / "tests")))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), (
        done.stdout[-2000:] + done.stderr[-4000:])
