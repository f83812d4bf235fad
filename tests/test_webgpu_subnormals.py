"""The webgpu backend's subnormal probe, the conformance suite's comparison for a device
that flushes subnormals, and which adapters ``"auto"`` may take.

The probe runs its shader on the adapter here (lavapipe in CI, which keeps subnormals).
The comparison and the choice of ``"auto"`` are checked with the probe's answer and the
adapter's description faked: they test the logic, not a GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conformance import numerics

import hologram as hg
from hologram import backends
from hologram.backends.webgpu import device as devices
from hologram.backends.webgpu.backend import MetalBackend, VulkanBackend, WebGpuBackend
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder

REQUIRED = os.environ.get("HOLOGRAM_REQUIRE_WEBGPU", "") not in ("", "0")
AVAILABLE = WebGpuBackend.is_available()
needs_adapter = pytest.mark.skipif(not AVAILABLE and not REQUIRED,
                                   reason="no WebGPU adapter (apt-get install "
                                          "mesa-vulkan-drivers libvulkan1, or a GPU driver)")

SUB = np.float32(1e-40)  # an f32 subnormal
TINY = np.float32(2.0 ** -126)


# --- the probe ------------------------------------------------------------------------------
@needs_adapter
def test_the_probe_runs_its_shader_on_the_adapter():
    """A second run of the probe on the open device gives the answer stored when it was
    opened; an emulated adapter (lavapipe) keeps subnormals, as the conformance suite's
    bit-exact results on it show."""
    dev = devices.get("webgpu")
    assert devices.probe_subnormals(dev) is dev.flushes_subnormals
    assert WebGpuBackend().flushes_subnormals() is dev.flushes_subnormals
    with hg.Executor("webgpu") as ex:
        assert ex.memory_stats()["flushes_subnormals"] is dev.flushes_subnormals
    print("webgpu adapter:", dev.summary, "flushes subnormals:", dev.flushes_subnormals)
    if not dev.is_hardware:
        assert dev.flushes_subnormals is False


def test_the_probe_reads_any_flushed_result_as_flushing():
    kept = (0x00400000, 0x00400000, 0x00400000, 1)
    assert not devices.flushes(kept)
    for i, flushed in enumerate((0, 0, 0, 0)):  # each result flushed alone
        assert devices.flushes(kept[:i] + (flushed,) + kept[i + 1:])


# --- the conformance suite's comparison ---------------------------------------------------------
def _program():
    b = ProgramBuilder("flush_cases")
    x = b.input("x", "f32", (8,))
    y = b.input("y", "f32", (8,))
    h = b.input("h", "bf16", (8,))
    k = b.kernel((8,))
    a, c, e = k.load(x), k.load(y), k.load(h)
    k.store(b.output("sum", "f32", (8,)), k.add(a, c))
    k.store(b.output("product", "f32", (8,)), k.mul(a, c))
    k.store(b.output("less", "bool", (8,)), k.lt(k.const(0.0, "f32"), a))
    k.store(b.output("half", "bf16", (8,)), k.mul(e, e))
    # a product that underflows, scaled back into the normal range: 0 where it flushed
    k.store(b.output("scaled", "f32", (8,)), k.mul(k.mul(a, c), k.const(2.0 ** 40, "f32")))
    return b.build()


def _flushed(a: np.ndarray) -> np.ndarray:
    return np.where(np.abs(a) < TINY, np.copysign(np.float32(0), a), a).astype(np.float32)


def _inputs():
    x = np.array([SUB, -SUB, 1.0, TINY, -TINY, 3.0, np.nan, 0.0], np.float32)
    y = np.array([0.0, -0.0, SUB, 0.5, 0.5, 2.0, 1.0, -SUB], np.float32)
    h = dt.to_bf16_bits(np.array([1e-20, -1e-20, 1.0, 2.0 ** -70, 3.0, 0.0, -0.0, 1e-39],
                                 np.float32))
    return [x, y, h]


def _device_that_flushes(program, inputs):
    """What a device that flushes f32 subnormals computes (inputs and results)."""
    x, y = _flushed(inputs[0]), _flushed(inputs[1])
    h = _flushed(dt.from_bf16_bits(inputs[2]))
    with np.errstate(all="ignore"):
        return [_flushed(x + y), _flushed(x * y), x > 0.0,
                dt.to_bf16_bits(_flushed(h * h)), _flushed(_flushed(x * y) * 2.0 ** 40)]


def test_forgiven_are_exactly_the_differences_that_flushing_explains():
    program, inputs = _program(), _inputs()
    want = numerics.run(program, "interp", inputs)
    got = _device_that_flushes(program, inputs)
    assert any(not np.array_equal(g.view(np.uint8), w.view(np.uint8))
               for g, w in zip(got, want))  # the cases do differ
    forgiven = numerics.forgive_flushing(program, inputs, got, want)
    types = (dt.float32, dt.float32, dt.bool_, dt.bfloat16, dt.float32)
    assert not np.array_equal(got[4], want[4])  # 2^-127 * 2^40 = 2^-87, not 0
    for t, g, w in zip(types, forgiven, want):
        numerics.assert_close(g, w, t)
    # any other difference stays: a wrong sum, a wrong sign of zero, a wrong comparison,
    # a wrong bf16 product
    for out, at, wrong in ((0, 2, np.float32(2.0)), (1, 1, np.float32(-0.0)), (2, 3, False),
                           (3, 2, dt.to_bf16_bits(np.float32([2.0]))[0])):
        bad = [g.copy() for g in got]
        bad[out][at] = wrong
        forgiven = numerics.forgive_flushing(program, inputs, bad, want)
        with pytest.raises(AssertionError, match="1 of 8 differ"):
            numerics.assert_close(forgiven[out], want[out], types[out])


def test_both_forgives_only_a_backend_that_declares_flushing(monkeypatch):
    """Backends without a ``flushes_subnormals()`` (cpu, interp) are compared as they
    are; webgpu only where its device's probe says it flushes."""
    assert not numerics.flushes_subnormals("interp")
    assert not numerics.flushes_subnormals("cpu")
    if AVAILABLE:
        expected = devices.get("webgpu").flushes_subnormals
        assert numerics.flushes_subnormals("webgpu") is expected
        monkeypatch.setattr(WebGpuBackend, "flushes_subnormals", lambda self: True)
        assert numerics.flushes_subnormals("webgpu")
        program, inputs = _program(), _inputs()
        got, want = numerics.both(program, "webgpu", inputs)
        for t, g, w in zip((dt.float32, dt.float32, dt.bool_, dt.bfloat16, dt.float32), got,
                           want):
            numerics.assert_close(g, w, t)


def test_flush_keeps_the_sign_and_leaves_other_dtypes():
    a = np.array([SUB, -SUB, TINY, -0.0, np.inf], np.float32)
    out = numerics.flush(a, dt.float32)
    assert out.view(np.uint32).tolist() == [0, 0x80000000, 0x00800000, 0x80000000, 0x7F800000]
    assert numerics.flush(a, dt.float32) is not a and a[0] == SUB  # a copy
    bits = np.array([0x0001, 0x8001, 0x0080, 0x3F80], np.uint16)
    assert numerics.flush(bits, dt.bfloat16).tolist() == [0, 0x8000, 0x0080, 0x3F80]
    half = np.array([6e-8, -6e-8], np.float16)  # f16 subnormals are normal f32 values
    assert numerics.flush(half, dt.float16) is half


# --- "auto" -------------------------------------------------------------------------------------
class _FakeAdapter:
    def __init__(self, adapter_type: str, backend_type: str = "Vulkan"):
        self.info = {"adapter_type": adapter_type, "backend_type": backend_type,
                     "device": f"a {adapter_type} adapter"}
        self.summary = self.info["device"]


@pytest.fixture
def fake_adapter(monkeypatch):
    """Make every webgpu name's adapter the one given, with a GPU device node present."""
    def install(adapter, node: bool = True):
        monkeypatch.setattr(WebGpuBackend, "_available", {})
        monkeypatch.setattr(WebGpuBackend, "_auto", {})
        monkeypatch.setattr(devices, "gpu_may_exist", lambda: node)

        def found(kind="webgpu"):
            if adapter is None:
                raise AssertionError("no adapter may be asked for")
            return adapter

        monkeypatch.setattr(devices, "adapter", found)

    return install


@pytest.mark.parametrize("adapter_type", ["DiscreteGPU", "IntegratedGPU"])
def test_auto_may_take_a_gpu_adapter(fake_adapter, adapter_type):
    """The selection logic only: the adapter's description is faked."""
    fake_adapter(_FakeAdapter(adapter_type))
    assert WebGpuBackend.auto_available()
    assert VulkanBackend.auto_available() and VulkanBackend.is_available()


@pytest.mark.parametrize("adapter_type", ["CPU", "Unknown", ""])
def test_auto_never_takes_an_emulated_adapter(fake_adapter, adapter_type):
    """The selection logic only: lavapipe, llvmpipe and SwiftShader say ``CPU``; an
    adapter that does not say what it is is not taken either. By name, webgpu still runs
    on it."""
    fake_adapter(_FakeAdapter(adapter_type))
    assert WebGpuBackend.is_available()
    assert not WebGpuBackend.auto_available()
    assert not MetalBackend.auto_available() and not VulkanBackend.auto_available()


def test_auto_loads_no_driver_where_no_gpu_device_node_exists(fake_adapter):
    fake_adapter(None, node=False)  # asking for the adapter would fail the test
    assert not WebGpuBackend.auto_available()


def test_cuda_comes_before_webgpu_for_auto():
    order = list(backends.BUILTIN)
    assert order.index("cuda") < order.index("webgpu")


def test_auto_takes_a_gpu_adapter_before_the_cpu_backend(fake_adapter, monkeypatch):
    """The selection logic only: no cuda, a (faked) GPU adapter: "auto" is webgpu."""
    fake_adapter(_FakeAdapter("DiscreteGPU"))
    monkeypatch.setenv("HOLOGRAM_BACKEND", "auto")
    monkeypatch.setattr(backends.backend_class("cuda"), "auto_available",
                        classmethod(lambda cls: False))
    assert backends.resolve("auto") == "webgpu"


@needs_adapter
def test_auto_does_not_take_the_adapter_here_unless_it_is_a_gpu():
    dev = devices.get("webgpu")
    assert WebGpuBackend.auto_available() == dev.is_hardware
    if not dev.is_hardware:
        assert backends.resolve("auto") != "webgpu"
