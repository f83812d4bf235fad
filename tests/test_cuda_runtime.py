"""The cuda runtime's logic (:mod:`hologram.backends.cuda.runtime`) against a fake driver:
parameters packed from real sm_90 artifacts' metadata (checked against their PTX), launch
configuration, allocation bookkeeping and error paths. The fake driver is a recorder, not
a GPU: nothing here runs a kernel (docs/cuda.md)."""

from __future__ import annotations

import gc
import importlib.util
import json
import re
import weakref

import numpy as np
import pytest

import hologram
import hologram as hg
from hologram import backends
from hologram.backends.cuda import backend as cuda
from hologram.backends.cuda import runtime, triton_process
from hologram.backends.cuda.runtime import DeviceMemory, DeviceProgram, launch_of, parameters
from hologram.errors import DeviceError, OutOfMemoryError, ShapeError
from hologram.frontend.graph import Graph
from hologram.isa.builder import ProgramBuilder

needs_triton = pytest.mark.skipif(not triton_process.triton_installed(),
                                  reason="no triton: pip install 'hologram-tensor[cuda]'")


class FakeDriver:
    """Records calls; memory is host bytes keyed by fake device pointers."""

    ordinal = 0
    stream = 0x5EED

    def __init__(self, capacity: int = 1 << 20, version: int = 12040):
        self.capacity = capacity
        self.driver_version = version
        self.memory: dict[int, bytearray] = {}
        self.next = 0x7F0000000000
        self.calls: list[tuple] = []
        self.streams_of: dict[str, int | None] = {}
        self.finished: set[str] = set()

    def mem_alloc(self, nbytes: int) -> int:
        if sum(map(len, self.memory.values())) + nbytes > self.capacity:
            raise OutOfMemoryError("cuda: cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY")
        pointer, self.next = self.next, self.next + ((nbytes + 255) // 256) * 256
        self.memory[pointer] = bytearray(nbytes)
        return pointer

    def mem_free(self, pointer: int) -> None:
        self.calls.append(("free", pointer))
        del self.memory[pointer]

    def version(self) -> int:
        return self.driver_version

    def stream_handle(self) -> int:
        return self.stream

    def copy_in(self, pointer: int, source: np.ndarray) -> None:
        self.memory[pointer][: source.nbytes] = source.tobytes()

    def copy_in_async(self, pointer: int, source: np.ndarray) -> None:
        self.calls.append(("copy in async", pointer, source.nbytes, self.stream))
        self.copy_in(pointer, source)

    def copy_out(self, destination: np.ndarray, pointer: int) -> None:
        destination.reshape(-1).view(np.uint8)[:] = np.frombuffer(
            bytes(self.memory[pointer][: destination.nbytes]), np.uint8)

    def load_module(self, cubin: bytes):
        assert cubin[:4] == b"\x7fELF"
        self.calls.append(("load", len(cubin)))
        return ("module", len(self.calls))

    def function(self, module, name: str, shared: int = 0):
        self.calls.append(("function", name, shared))
        return ("function", name)

    def launch(self, function, grid, block, shared, params):
        self.calls.append(("launch", function[1], grid, block, shared, tuple(params)))

    def synchronize(self) -> None:
        self.calls.append(("sync",))
        self.finish()

    def record_event(self):
        self.calls.append(("record", "event", self.stream))
        return "event"

    def wait_event(self, stream: int, event) -> None:
        self.calls.append(("wait", stream, event))

    # Deferred releases' events: recorded per call; one on our stream completes when the
    # stream is synchronized, any when the test says (finish) or a caller waits for it.
    def event_on(self, stream=None):
        event = f"event-{len(self.calls)}"
        self.calls.append(("event on", stream, event))
        self.streams_of[event] = stream
        return event

    def event_done(self, event, wait=False) -> bool:
        if wait:
            self.finished.add(event)
        return event in self.finished

    def finish(self, stream=None) -> None:
        """The work queued so far on ``stream`` (None: ours) completes."""
        self.finished.update(e for e, s in self.streams_of.items() if s == stream)


def test_allocation_bookkeeping_and_copies():
    driver = FakeDriver()
    memory = DeviceMemory(driver, memory_limit=4096)
    a = memory.alloc((100,), np.float32)  # 400 bytes: the 448-byte class
    b = memory.alloc((10,), np.int64)  # 80 bytes: the 256-byte class
    assert (a.nbytes, a.size, b.nbytes, b.size) == (400, 448, 80, 256)
    stats = memory.stats()
    assert (stats["allocated_bytes"], stats["requested_bytes"], stats["reserved_bytes"]) == (
        704, 480, 704)
    assert stats["peak_allocated_bytes"] == 704 and stats["num_driver_allocs"] == 2
    assert memory.handle(a) == a.pointer and len(driver.memory[a.pointer]) == 448
    x = np.arange(100, dtype=np.float32)
    memory.copy_in(a, x)
    y = np.empty(100, np.float32)
    memory.copy_out(a, y)
    np.testing.assert_array_equal(x, y)
    memory.free(a)
    stats = memory.stats()
    assert stats["allocated_bytes"] == 256 and stats["peak_allocated_bytes"] == 704
    assert stats["cached_bytes"] == 448 and a.pointer in driver.memory  # kept for reuse
    with pytest.raises(DeviceError, match="freed twice"):
        memory.free(a)
    with pytest.raises(ShapeError, match="which was freed"):
        memory.copy_out(a, y)
    with pytest.raises(ShapeError, match="does not fit"):
        memory.copy_in(b, np.zeros(11, np.int64))
    with pytest.raises(OutOfMemoryError, match=r"limit of 4096 bytes \(256 allocated\)"):
        memory.alloc((1025,), np.float32)
    assert not memory.host_visible and memory.dlpack_device_type == 2


def test_driver_out_of_memory_names_the_request_and_usage():
    memory = DeviceMemory(FakeDriver(capacity=1000))
    kept = memory.alloc((200,), np.float32)
    with pytest.raises(OutOfMemoryError, match="requested 400 bytes, a block of 448; 896 "
                                               "bytes allocated and 896 reserved"):
        memory.alloc((100,), np.float32)
    assert kept.end.alive


def test_launch_configuration_and_parameters_come_from_the_metadata():
    kernel = {"name": "k", "grid": 7, "buffers": [0, 2]}
    compiled = {"metadata": {"name": "k", "num_warps": 8, "shared": 256,
                             "global_scratch_size": 16, "profile_scratch_size": 0}}
    launch = launch_of(kernel, compiled)
    assert (launch.grid, launch.block, launch.shared) == ((7, 1, 1), (256, 1, 1), 256)
    assert parameters(launch, {0: 0x100, 2: 0x200}, (0x300, 0x400)) == [0x100, 0x200, 0x300, 0]
    with pytest.raises(ShapeError, match=r"needs buffers \[2\]"):
        parameters(launch, {0: 0x100}, (0, 0))
    with pytest.raises(DeviceError, match="does not match"):
        launch_of({**kernel, "name": "other"}, compiled)
    with pytest.raises(DeviceError, match="split the program"):
        launch_of({**kernel, "grid": 2**31}, compiled)


@needs_triton
def test_a_program_built_for_sm90_is_loaded_and_launched_on_the_fake_driver(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path))
    g = Graph("chain")
    x = g.input("x", "f32", (6, 300))
    y = x * 2.0 + 1.0
    g.output("rows", g.sum(y, 1, keepdim=True))
    g.output("y", y)
    artifact = hologram.build(g.program(), backend="cuda", target="sm_90").data
    header = json.loads(artifact)
    driver = FakeDriver()
    memory = DeviceMemory(driver)
    program = DeviceProgram(artifact, driver, memory)
    blocks = [memory.alloc((size,), np.uint8) for size in (6 * 300 * 4, 6 * 4, 6 * 300 * 4)]
    handles = tuple(map(memory.handle, blocks))
    program.launch(handles)
    launches = [c for c in driver.calls if c[0] == "launch"]
    assert len(launches) == len(header["kernels"]) >= 1
    for call, kernel, compiled in zip(launches, header["kernels"], header["compiled"]):
        _, name, grid, block, shared, params = call
        assert name == kernel["name"] and grid == (kernel["grid"], 1, 1)
        assert block == (32 * compiled["metadata"]["num_warps"], 1, 1)
        assert shared == compiled["metadata"]["shared"]
        # As many parameters as the compiled kernel's PTX declares: the visible pointers
        # and Triton's hidden scratch pointers.
        ptx = cuda.ptx(artifact, name)
        entry = ptx[ptx.index(".entry"):ptx.index(")", ptx.index(".entry"))]
        assert len(params) == len(re.findall(r"\.param \.u64", entry))
        assert f".reqntid {block[0]}" in ptx
        assert all(p in handles for p in params[: len(kernel["buffers"])])
    with pytest.raises(ShapeError, match="takes 3 buffers"):
        program.launch(handles[:2])


@needs_triton
def test_a_split_reduction_keeps_partials_and_zeroed_counters_in_program_owned_scratch(
        tmp_path, monkeypatch):
    """A split reduction is one launch: its partials and its rows' counters live in
    scratch memory the program allocates (sized from the artifact). The counters are
    zeroed once, when the program is loaded (every launch leaves them zero: the row's last
    program instance clears its counter), even in a reused block of the pool."""
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path))
    g = Graph("long_sum")
    g.output("s", g.sum(g.input("x", "f32", (2, 200_000)), 1))
    artifact = hologram.build(g.program(), backend="cuda", target="sm_90").data
    header = json.loads(artifact)
    (kernel,) = header["kernels"]
    (partials, counters) = (header["scratch"][i] for i in sorted(header["scratch"], key=int))
    assert partials["dtype"] == "f4" and not partials["zeroed"]
    assert (counters["dtype"], counters["count"], counters["zeroed"]) == ("i4", 2, True)
    assert kernel["writes"] == [1, partials["index"], counters["index"]]
    assert kernel["grid"] == partials["count"]  # one program instance per (row, chunk)
    assert "tl.atomic_add" in header["source"]
    for s in (partials, counters):
        assert header["temps"][str(s["index"])] == s["count"] * 4
    driver = FakeDriver(capacity=1 << 22)
    memory = DeviceMemory(driver)
    dirty = memory.alloc((8,), np.uint8)
    memory.copy_in(dirty, np.full(8, 0xFF, np.uint8))
    memory.free(dirty)  # the counters' block comes back from the pool, dirty
    program = DeviceProgram(artifact, driver, memory)
    where = {i: program.temps[str(s["index"])] for i, s in enumerate((partials, counters))}
    assert bytes(driver.memory[where[1]][:8]) == bytes(8)
    blocks = (memory.alloc((2 * 200_000 * 4,), np.uint8), memory.alloc((8,), np.uint8))
    handles = tuple(map(memory.handle, blocks))
    program.launch(handles)
    (launch,) = [c for c in driver.calls if c[0] == "launch"]
    assert launch[2] == (kernel["grid"], 1, 1)
    assert set(where.values()).isdisjoint(handles)
    params = launch[5]
    assert params[kernel["buffers"].index(partials["index"])] == where[0]
    assert params[kernel["buffers"].index(counters["index"])] == where[1]


@needs_triton
def test_an_emulation_artifact_is_refused_by_the_device_program(monkeypatch):
    monkeypatch.setenv("HOLOGRAM_DISABLE_DISK_CACHE", "1")
    g = Graph("plain")
    g.output("y", g.input("x", "f32", (4,)) * 2.0)
    artifact = hologram.build(g.program(), backend="cuda").data
    with pytest.raises(DeviceError, match="sm_80"):
        DeviceProgram(artifact, FakeDriver(), DeviceMemory(FakeDriver()))


def test_the_real_driver_says_what_is_missing():
    """Without cuda-bindings, or with it but without an NVIDIA driver (CI: the test extra
    installs it), Driver() raises DeviceError naming what is missing, and the backend is
    just unavailable; only on a GPU does it start."""
    from hologram.backends.cuda.driver import Driver

    if importlib.util.find_spec("cuda.bindings") is None:
        missing = "cuda-bindings"
    else:
        missing = "NVIDIA driver|cuInit|no CUDA device"
    try:
        driver = Driver()
    except DeviceError as err:
        assert re.search(missing, str(err)), err
        assert cuda.gpu() is None and cuda.why_no_gpu()
    else:  # a GPU: what the backend would run on
        assert driver.capability() >= (1, 0)


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """The backend as it is where :func:`cuda.gpu` finds an sm_90 GPU, the fake driver
    standing in for it (nothing executes); a fresh backend instance before and after."""
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("HOLOGRAM_CUDA_EMULATE", raising=False)
    driver = FakeDriver()
    monkeypatch.setitem(cuda._GPU, "found", (driver, "sm_90"))
    backends._instances.pop("cuda", None)
    yield driver
    backends._instances.pop("cuda", None)


@needs_triton
def test_on_a_gpu_programs_compile_for_its_target_and_launch_through_the_driver(fake_gpu):
    driver = fake_gpu
    assert "cuda" in backends.available() and hg.backend.is_cuda_available()
    impl = backends.get("cuda")
    assert impl.target() == impl.target("sm_90")
    g = Graph("wired")
    g.output("y", g.input("x", "f32", (1000,)) * 2.0)
    compiled = hologram.compile(g.program(), backend="cuda")
    x = np.arange(1000, dtype=np.float32)
    out = compiled(x)  # copied in, launched, copied back (the fake computes nothing)
    assert out.shape == (1000,) and out.dtype == np.float32
    launches = [c for c in driver.calls if c[0] == "launch"]
    loads = [c for c in driver.calls if c[0] == "load"]
    assert len(launches) == 1 and len(loads) == 1
    inputs = [p for p, m in driver.memory.items() if bytes(m[: x.nbytes]) == x.tobytes()]
    assert inputs and inputs[0] in launches[0][5]  # the kernel got the copied input
    with hg.Executor("cuda") as ex:  # executors hold device memory from the driver
        before = len(driver.memory)
        buf = ex.from_numpy(np.full(10, 3.0, np.float32))
        assert len(driver.memory) == before + 1 and not buf.host_visible
        np.testing.assert_array_equal(buf.to_numpy(), np.full(10, 3.0, np.float32))


@needs_triton
def test_on_a_gpu_an_artifact_for_another_target_is_refused_naming_both(fake_gpu):
    g = Graph("elsewhere")
    g.output("y", g.input("x", "f32", (4,)) * 2.0)
    for target, built in (("sm_80", "sm_80"), (None, "the emulation")):
        artifact = hologram.build(g.program(), backend="cuda", target=target)
        if target is None:  # what an emulated build makes
            artifact = json.loads(artifact.data)
            artifact["target"] = None
            artifact = json.dumps(artifact).encode()
        else:
            artifact = artifact.data
        with pytest.raises(DeviceError, match=f"built for {built}.*GPU \\(sm_90\\)"):
            backends.get("cuda").load(artifact)


@needs_triton
def test_on_a_gpu_a_kernel_the_renderer_cannot_express_runs_on_the_interpreter(fake_gpu,
                                                                              monkeypatch):
    """A delegated kernel (a row of sums reduced again per grid point) runs in its place:
    the queued launches are waited for, the program's buffers copied to the host, the
    interpreter runs the kernel, and what it writes is copied back (the fake driver's
    memory then holds the interpreter's values); warned about once."""
    driver = fake_gpu
    monkeypatch.setattr(runtime, "_warned", set())
    b = ProgramBuilder("delegated")
    x = b.input("x", "f32", (4, 5, 6))
    m = b.output("m", "f32", (4,))
    k = b.kernel((4, 5, 6))
    rows = k.reduce("sum", k.mul(k.load(x), 2.0), 2)
    k.store(m, k.reduce("max", k.mul(rows, rows), 1), strides=(1, 0, 0), shape=(4, 1, 1))
    x0 = np.random.default_rng(3).standard_normal(120).astype(np.float32)
    with pytest.warns(UserWarning, match="reference interpreter"):
        got = hologram.compile(b.build(), backend="cuda")(x0)
    want = ((x0.reshape(4, 5, 6).astype(np.float64) * 2).sum(2) ** 2).max(1)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert not [c for c in driver.calls if c[0] == "launch"]
    assert ("sync",) in driver.calls


@needs_triton
def test_a_launch_at_an_unaligned_address_runs_a_twin_compiled_without_the_alignment(
        fake_gpu):
    """The kernels' pointers are compiled as multiples of 16 bytes (vector loads); a view
    that starts between two boundaries (torch's ``x[1:]``: its data pointer) would fault
    on a GPU. Such a launch runs the program's twin, compiled without that assumption."""
    g = Graph("offset")
    g.output("y", g.input("x", "f32", (1024,)) * 2.0)
    impl = backends.get("cuda")
    artifact = impl.compile(g.program())
    program = impl.load(artifact)
    kernels = json.loads(artifact)["kernels"]
    name = kernels[0]["name"]
    assert "ld.global.v4" in cuda.ptx(artifact, name)
    blocks = [program.memory.alloc((4096 + 16,), np.uint8) for _ in range(2)]
    x, y = (program.memory.handle(b) for b in blocks)
    loads = lambda: sum(c[0] == "load" for c in fake_gpu.calls)  # noqa: E731
    loaded = loads()
    program.launch((x, y))
    assert program.twin is None and loads() == loaded
    program.launch((x + 4, y + 16))
    twin = program.twin
    assert twin is not None and loads() == loaded + len(kernels)
    ptx = cuda.ptx(twin.artifact, name)
    assert "ld.global.v4" not in ptx and "ld.global" in ptx
    program.launch((x, y + 8))  # the twin serves every unaligned launch, built once
    assert program.twin is twin and loads() == loaded + len(kernels)
    launched = [c[5][:2] for c in fake_gpu.calls if c[0] == "launch"]
    assert [p[0] for p in launched[::len(kernels)]] == [x, x + 4, x]  # the input x


def test_an_asynchronous_write_holds_its_source_until_the_stream_passes_it():
    driver = FakeDriver()
    memory = DeviceMemory(driver)
    block = memory.alloc((16,), np.uint8)
    source = np.arange(16, dtype=np.uint8)

    class Owner:  # what owns the source's memory (a pinned torch tensor)
        pass

    owner = Owner()
    alive = weakref.ref(owner)
    memory.write_async(block.pointer, source, owner)
    del owner
    gc.collect()
    assert driver.calls[0] == ("copy in async", block.pointer, 16, driver.stream)
    assert bytes(driver.memory[block.pointer][:16]) == source.tobytes()
    assert alive() is not None  # the copy may still be reading it
    driver.finish()
    memory.synchronize()
    gc.collect()
    assert alive() is None
