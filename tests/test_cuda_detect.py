"""Finding a GPU (:func:`hologram.backends.cuda.backend.gpu`) through the real
:class:`~hologram.backends.cuda.driver.Driver` code, with a fake ``cuda.bindings.driver``
module standing in for the NVIDIA driver: the probe's decisions (device count, compute
capability, driver errors) and what ``auto`` may pick. A fake module, not a GPU: it proves
the logic of driver.py's probing, not the real driver's answers (docs/cuda.md)."""

from __future__ import annotations

import ctypes
import re
import sys
import threading
import types

import numpy as np
import pytest

from hologram.backends.cuda import backend as cuda
from hologram.backends.cuda import driver as driver_module
from hologram.errors import DeviceError, OutOfMemoryError

SUCCESS, OUT_OF_MEMORY, NO_DEVICE = 0, 2, 100
_NAMES = {OUT_OF_MEMORY: b"CUDA_ERROR_OUT_OF_MEMORY", NO_DEVICE: b"CUDA_ERROR_NO_DEVICE"}


def fake_cu(count=1, capability=(9, 0), init=SUCCESS, version=12040, loads=True):
    """A stand-in for ``cuda.bindings.driver``: calls answer ``(CUresult, value...)``."""
    calls = []

    def call(name, *values, result=SUCCESS):
        def f(*args):
            calls.append((name, args))
            if name == "cuInit" and not loads:
                raise RuntimeError("libcuda.so.1: cannot open shared object file")
            return (result, *values)
        return f

    attr = types.SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major",
                                 CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor")
    cu = types.SimpleNamespace(
        calls=calls, CUdevice_attribute=attr,
        cuInit=call("cuInit", result=init),
        cuDeviceGetCount=call("cuDeviceGetCount", count),
        cuDeviceGet=call("cuDeviceGet", "device-0"),
        cuDevicePrimaryCtxRetain=call("cuDevicePrimaryCtxRetain", "context"),
        cuCtxSetCurrent=call("cuCtxSetCurrent"),
        cuStreamCreate=call("cuStreamCreate", 0x5EED),
        cuDriverGetVersion=call("cuDriverGetVersion", version),
        cuMemAlloc=call("cuMemAlloc", 0, result=OUT_OF_MEMORY),
        CUevent_flags=types.SimpleNamespace(CU_EVENT_DISABLE_TIMING=2),
        cuEventCreate=call("cuEventCreate", "event"),
        cuEventRecord=call("cuEventRecord"),
        cuStreamWaitEvent=call("cuStreamWaitEvent"),
        cuEventSynchronize=call("cuEventSynchronize"),
        cuCtxPushCurrent=call("cuCtxPushCurrent"),
        cuCtxPopCurrent=call("cuCtxPopCurrent", "context"),
        CUstream=lambda handle: ("CUstream", handle),
        CUfunction_attribute=types.SimpleNamespace(
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="max-dynamic-shared"),
        cuModuleGetFunction=call("cuModuleGetFunction", "function"),
        cuFuncSetAttribute=call("cuFuncSetAttribute"),
        cuMemcpyHtoD=call("cuMemcpyHtoD"),
        cuMemcpyDtoH=call("cuMemcpyDtoH"),
        cuGetErrorName=lambda err: (SUCCESS, _NAMES.get(err)))
    cu.cuDeviceGetAttribute = lambda which, device: (
        SUCCESS, capability[0] if which == "major" else capability[1])
    return cu


@pytest.fixture
def probe(monkeypatch):
    """Probe again with a given fake driver module (the real probe runs once a process)."""
    monkeypatch.delenv("HOLOGRAM_CUDA_EMULATE", raising=False)

    def run(cu, nodes=("/dev/null",)):  # a device node that exists: the driver is asked
        monkeypatch.setattr(cuda, "_GPU", {})
        monkeypatch.setattr(cuda, "_DEVICE_NODES", nodes)
        monkeypatch.setattr(driver_module, "Driver", lambda: real(cu=cu))
        return cuda.gpu()

    real = driver_module.Driver
    return run


@pytest.mark.parametrize("capability,target", [((8, 0), "sm_80"), ((8, 6), "sm_80"),
                                               ((8, 9), "sm_80"), ((9, 0), "sm_90")])
def test_a_device_with_a_target_is_found(probe, capability, target):
    cu = fake_cu(capability=capability)
    found = probe(cu)
    assert found is not None and found[1] == target and cuda.is_gpu_available()
    driver = found[0]
    assert driver.ordinal == 0 and driver.stream_handle() == 0x5EED
    assert driver.version() == 12040 and cuda.why_no_gpu() is None
    assert [name for name, _ in cu.calls][:3] == ["cuInit", "cuDeviceGetCount", "cuDeviceGet"]


@pytest.mark.parametrize("cu,why", [
    (fake_cu(count=0), r"no CUDA device 0 \(the driver sees 0\)"),
    (fake_cu(init=NO_DEVICE), "cuInit failed: CUDA_ERROR_NO_DEVICE"),
    (fake_cu(loads=False), "no NVIDIA driver library.*libcuda"),
    (fake_cu(capability=(7, 5)), r"compute capability 7\.5 has no target"),
    (fake_cu(capability=(10, 0)), r"compute capability 10\.0 has no target"),
])
def test_no_usable_device_means_no_gpu_and_says_why(probe, cu, why):
    assert probe(cu) is None and not cuda.is_gpu_available()
    assert not cuda.CudaBackend.auto_available()
    assert re.search(why, cuda.why_no_gpu())
    if cuda.triton_process.triton_installed():  # else the reason is triton's absence
        assert cuda.why_no_gpu() in cuda.CudaBackend.unavailable_reason()


def test_without_a_device_node_the_driver_is_not_loaded(probe):
    """On Linux a machine without /dev/nvidia* (or WSL's /dev/dxg) has no NVIDIA GPU: the
    probe says so without loading the driver (it runs on every "auto")."""
    cu = fake_cu()
    if sys.platform != "linux":
        pytest.skip("the device nodes are Linux's")
    assert probe(cu, nodes=("/nonexistent/nvidiactl",)) is None and cu.calls == []
    assert "/nonexistent/nvidiactl" in cuda.why_no_gpu()
    assert not cuda.CudaBackend.auto_available()


def test_auto_takes_cuda_on_a_gpu_and_the_cpu_otherwise(probe, monkeypatch):
    """The registry's "auto": cuda first, where CudaBackend.auto_available says so (a real
    GPU, triton installed, not emulated); webgpu never (docs/webgpu.md)."""
    from hologram import backends

    monkeypatch.setenv("HOLOGRAM_BACKEND", "auto")
    probe(fake_cu(capability=(9, 0)))
    assert backends.resolve("auto") == ("cuda" if cuda.triton_process.triton_installed() else "cpu")
    monkeypatch.setenv("HOLOGRAM_CUDA_EMULATE", "1")
    assert backends.resolve("auto") == "cpu"
    monkeypatch.delenv("HOLOGRAM_CUDA_EMULATE")
    probe(fake_cu(count=0))
    assert backends.resolve("auto") == "cpu"
    assert not backends.backend_class("webgpu").auto_available()


def test_driver_errors_name_the_call_and_out_of_memory_is_its_own_error():
    driver = driver_module.Driver(cu=fake_cu())
    with pytest.raises(OutOfMemoryError, match="cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"):
        driver.mem_alloc(1 << 40)
    with pytest.raises(DeviceError, match="cuCtxSynchronize failed: CUDA_ERROR_NO_DEVICE"):
        driver.check("cuCtxSynchronize", (NO_DEVICE,))
    assert driver.check("cuX", (SUCCESS, 1, 2)) == (1, 2) and driver.check("cuY", SUCCESS) is None


def test_kernels_past_48_kib_of_shared_memory_opt_in_and_copies_pass_host_addresses():
    """What the first run on an H100 needed: a kernel asking for more than 48 KiB of
    dynamic shared memory sets CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES first;
    host memory goes to cuMemcpy by address (cuda-bindings reads a 0-d array as the
    number it holds), and a copy of 0 bytes is not made (CUDA_ERROR_INVALID_VALUE)."""
    cu = fake_cu()
    driver = driver_module.Driver(cu=cu)
    cu.calls.clear()
    driver.function("module", "small", 48 * 1024)
    driver.function("module", "large", 48 * 1024 + 1)
    assert cu.calls == [("cuModuleGetFunction", ("module", b"small")),
                        ("cuModuleGetFunction", ("module", b"large")),
                        ("cuFuncSetAttribute", ("function", "max-dynamic-shared", 49153))]
    cu.calls.clear()
    scalar, empty = np.array(7.5, np.float32), np.empty(0, np.float32)
    driver.copy_in(0xD0, scalar)
    driver.copy_out(scalar, 0xD0)
    driver.copy_in(0xD0, empty)
    driver.copy_out(empty, 0xD0)
    assert cu.calls == [("cuMemcpyHtoD", (0xD0, scalar.ctypes.data, 4)),
                        ("cuMemcpyDtoH", (scalar.ctypes.data, 0xD0, 4))]


def test_a_launch_passes_each_parameter_by_address_in_a_reused_block():
    """cuLaunchKernel gets the address of an array of pointers, each to one 64-bit value
    (the kernel's pointer parameters in order); the block is made once per parameter
    count and refilled for each launch (the driver reads it during the call)."""
    cu = fake_cu()
    seen, count = [], [0]

    def launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        pointers = (ctypes.c_void_p * count[0]).from_address(params)
        values = [ctypes.c_uint64.from_address(p).value for p in pointers]
        seen.append((function, (gx, gy, gz), (bx, by, bz), shared, stream, params, values))
        return (SUCCESS,)

    cu.cuLaunchKernel = launch
    driver = driver_module.Driver(cu=cu)
    for params in ([0xA0, 0xB0, 0xC0], [1, 2, 3], [5, 4, 3, 2, 1]):
        count[0] = len(params)
        driver.launch("f", (7, 1, 1), (128, 1, 1), 64, params)
        assert seen[-1][:5] == ("f", (7, 1, 1), (128, 1, 1), 64, 0x5EED)
        assert seen[-1][6] == params
    assert seen[0][5] == seen[1][5] != seen[2][5]  # one block per parameter count
    cu.cuLaunchKernel = lambda *args: (NO_DEVICE,)
    with pytest.raises(DeviceError, match="cuLaunchKernel failed: CUDA_ERROR_NO_DEVICE"):
        driver.launch("f", (1, 1, 1), (32, 1, 1), 0, [0])


def test_stream_ordering_records_one_untimed_event_and_waits_on_the_consumers_stream():
    """driver.py's calls behind DLPack's stream semantics: one event, created without
    timing on first use and recorded again on our stream each time; the consumer's stream
    handle (1 and 2: the default streams) wrapped as a CUstream for cuStreamWaitEvent."""
    cu = fake_cu()
    driver = driver_module.Driver(cu=cu)
    cu.calls.clear()
    for consumer in (1, 2, 0x7E57AB1E):
        driver.wait_event(consumer, driver.record_event())
    assert cu.calls == [("cuEventCreate", (2,)), ("cuEventRecord", ("event", 0x5EED)),
                        ("cuStreamWaitEvent", (("CUstream", 1), "event", 0)),
                        ("cuEventRecord", ("event", 0x5EED)),
                        ("cuStreamWaitEvent", (("CUstream", 2), "event", 0)),
                        ("cuEventRecord", ("event", 0x5EED)),
                        ("cuStreamWaitEvent", (("CUstream", 0x7E57AB1E), "event", 0))]
    cu.cuStreamWaitEvent = lambda *args: (NO_DEVICE,)
    with pytest.raises(DeviceError, match="cuStreamWaitEvent failed: CUDA_ERROR_NO_DEVICE"):
        driver.wait_event(1, "event")


def test_held_memory_waits_on_events_recorded_on_the_consumers_stream_with_our_context():
    """driver.py's calls behind the deferred releases: an untimed event recorded on the
    given stream (ours for None), queried (CUDA_ERROR_NOT_READY is "not yet", any other
    error raises) or waited for, and reused once complete; each with this driver's
    context pushed and popped, since a DLPack deleter may run on any thread."""
    cu = fake_cu()
    driver = driver_module.Driver(cu=cu)
    answers = [(600,), (SUCCESS,), (NO_DEVICE,)]
    cu.cuEventQuery = lambda event: (cu.calls.append(("cuEventQuery", (event,))),
                                     answers.pop(0))[1]
    cu.calls.clear()
    first = driver.event_on(0x7E57AB1E)
    assert not driver.event_done(first)
    assert driver.event_done(first)
    again = driver.event_on()  # the completed event is reused, on our stream
    push, pop = ("cuCtxPushCurrent", ("context",)), ("cuCtxPopCurrent", ())
    assert cu.calls == [push, ("cuEventCreate", (2,)),
                        ("cuEventRecord", ("event", ("CUstream", 0x7E57AB1E))), pop,
                        push, ("cuEventQuery", ("event",)), pop,
                        push, ("cuEventQuery", ("event",)), pop,
                        push, ("cuEventRecord", ("event", 0x5EED)), pop]
    with pytest.raises(DeviceError, match="cuEventQuery failed: CUDA_ERROR_NO_DEVICE"):
        driver.event_done(again)
    assert cu.calls[-1] == pop  # popped on the error too
    cu.calls.clear()
    assert driver.event_done(again, wait=True)
    assert cu.calls == [push, ("cuEventSynchronize", ("event",)), pop]


def test_another_thread_makes_the_context_current_once_before_its_first_call():
    """A driver context is current per thread: the first call from a thread other than
    the one that started the driver sets it (cuCtxSetCurrent), once per thread."""
    cu = fake_cu()
    cu.cuMemAlloc = lambda nbytes: (cu.calls.append(("cuMemAlloc", (nbytes,))), (SUCCESS,
                                                                                 0xA0))[1]
    driver = driver_module.Driver(cu=cu)
    cu.calls.clear()
    driver.mem_alloc(256)
    assert cu.calls == [("cuMemAlloc", (256,))]  # the starting thread has it already
    for _ in range(2):
        cu.calls.clear()
        worker = threading.Thread(target=lambda: [driver.mem_alloc(256) for _ in range(2)])
        worker.start()
        worker.join()
        assert cu.calls == [("cuCtxSetCurrent", ("context",)), ("cuMemAlloc", (256,)),
                            ("cuMemAlloc", (256,))]


def test_auto_may_pick_cuda_only_on_a_real_gpu(probe, monkeypatch):
    probe(fake_cu(capability=(9, 0)))
    if not cuda.triton_process.triton_installed():
        assert not cuda.CudaBackend.auto_available()  # it cannot compile without triton
        return
    assert cuda.CudaBackend.auto_available() and cuda.CudaBackend.is_available()
    monkeypatch.setenv("HOLOGRAM_CUDA_EMULATE", "1")  # a GPU, but running emulated
    assert cuda.CudaBackend.is_available() and not cuda.CudaBackend.auto_available()
    probe(fake_cu(count=0))
    assert cuda.CudaBackend.is_available() and not cuda.CudaBackend.auto_available()


def test_streams_events_and_device_copies_go_to_the_current_stream():
    """driver.py's calls behind the torch device's streams (hologram_torch/streams.py): a
    thread's launches and device copies go to the stream it made current, events are
    timed or not as asked, queries read CUDA_ERROR_NOT_READY as "not yet"."""
    cu = fake_cu()
    launched = []
    cu.cuLaunchKernel = lambda function, *rest: launched.append(rest[7]) or (SUCCESS,)
    cu.cuMemcpyDtoDAsync = lambda *args: cu.calls.append(("DtoD", args)) or (SUCCESS,)
    cu.CUevent_flags.CU_EVENT_DEFAULT = 0
    ready = {"stream": 600, "event": SUCCESS}  # 600: CUDA_ERROR_NOT_READY
    cu.cuStreamQuery = lambda stream: (ready["stream"],)
    cu.cuEventQuery = lambda event: (ready["event"],)
    cu.cuEventElapsedTime = lambda start, end: (SUCCESS, 2.5)
    cu.cuCtxSynchronize = lambda: cu.calls.append(("ctx sync", ())) or (SUCCESS,)
    driver = driver_module.Driver(cu=cu)
    assert driver.stream == driver.default_stream == 0x5EED
    cu.cuStreamCreate = lambda flags: (SUCCESS, 0x51DE)
    side = driver.new_stream()
    driver.use_stream(side)
    driver.launch("f", (1, 1, 1), (32, 1, 1), 0, [0])
    driver.copy_device(0x100, 0x200, 64)
    seen = []
    other = threading.Thread(target=lambda: seen.append(driver.stream))
    other.start()
    other.join()
    assert seen == [0x5EED]  # the current stream is the thread's own
    driver.use_stream(None)
    driver.launch("f", (1, 1, 1), (32, 1, 1), 0, [0])
    assert launched == [0x51DE, 0x5EED]
    assert cu.calls[-1] == ("DtoD", (0x100, 0x200, 64, 0x51DE))
    assert not driver.stream_done(side) and driver.event_finished("event")
    ready["stream"] = SUCCESS
    assert driver.stream_done(side)
    cu.calls.clear()
    timed = driver.new_event(timing=True)
    driver.record(timed, side)
    assert cu.calls == [("cuEventCreate", (0,)), ("cuEventRecord", ("event", 0x51DE))]
    assert driver.elapsed_ms(timed, timed) == 2.5
    driver.synchronize_all()
    assert cu.calls[-1] == ("ctx sync", ())


def test_device_properties_come_from_the_driver():
    cu = fake_cu()
    cu.cuDeviceGetName = lambda length, device: (SUCCESS, b"NVIDIA H200\0\0\0")
    cu.cuDeviceTotalMem = lambda device: (SUCCESS, 150 << 30)
    cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = "sms"
    capability = cu.cuDeviceGetAttribute
    cu.cuDeviceGetAttribute = lambda which, device: (
        (SUCCESS, 132) if which == "sms" else capability(which, device))
    assert driver_module.Driver(cu=cu).properties() == {
        "name": "NVIDIA H200", "total_memory": 150 << 30, "multi_processor_count": 132}
