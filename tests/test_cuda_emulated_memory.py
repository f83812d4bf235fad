"""Memory at byte addresses: :meth:`Allocator.read` / :meth:`Allocator.write` of the host
pool, of the cuda backend's device memory (against the fake driver of
tests/test_cuda_runtime.py) and of the cuda emulation's memory
(:mod:`hologram.backends.cuda.emulated`): host memory behind tagged, device-style handles,
so that CPU-only runs prove host code never dereferences device memory. Nothing here
touches a GPU."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_cuda_runtime import FakeDriver, needs_triton

import hologram
import hologram as hg
from hologram.backends import base
from hologram.backends.cuda.emulated import TAG, EmulatedMemory, untag
from hologram.backends.cuda.runtime import DeviceMemory
from hologram.backends.hostmem import Pool
from hologram.backends.webgpu.memory import WebGpuAllocator
from hologram.errors import DeviceError, OutOfMemoryError, ShapeError
from hologram.frontend.graph import Graph


@pytest.fixture
def emulate(monkeypatch):
    monkeypatch.setenv("HOLOGRAM_CUDA_EMULATE", "1")
    monkeypatch.setenv("HOLOGRAM_DISABLE_DISK_CACHE", "1")
    yield


# --- the emulated memory ----------------------------------------------------------------
def test_handles_are_tagged_host_addresses_and_not_host_visible():
    memory = EmulatedMemory()
    block = memory.alloc((100,), np.float32)
    handle = memory.handle(block)
    assert TAG == 1 << 55 and handle >> 55 == 1
    assert untag(handle) == block.lease.address == handle - TAG and untag(0) == 0
    assert not memory.host_visible and memory.device == "cuda"
    assert memory.dlpack_device_type == 12  # kDLExtDev: it claims no CUDA device
    with pytest.raises(DeviceError, match="cannot be viewed from the host"):
        memory.view(block)
    with pytest.raises(DeviceError, match="not an address of emulated device memory"):
        untag(block.lease.address)  # a host address handed to the emulated device


def test_a_host_dereference_of_a_handle_faults():
    """What a GPU's device pointer does to host code: the process dies (SIGSEGV), where
    host memory would have been read silently."""
    child = textwrap.dedent("""
        import ctypes, faulthandler, numpy as np
        from hologram.backends.cuda.emulated import EmulatedMemory
        faulthandler.disable()
        memory = EmulatedMemory()
        block = memory.alloc((4,), np.float32)
        memory.copy_in(block, np.ones(4, np.float32))
        print("dereferencing", flush=True)
        print(ctypes.string_at(memory.handle(block), 4))
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=120)
    assert "dereferencing" in done.stdout, done.stderr
    assert done.returncode in (-signal.SIGSEGV, -signal.SIGBUS), (done.returncode,
                                                                   done.stdout, done.stderr)


def test_write_and_read_at_a_handle_plus_an_offset_round_trip():
    memory = EmulatedMemory()
    block = memory.alloc((64,), np.int32)
    memory.copy_in(block, np.arange(64, dtype=np.int32))
    handle = memory.handle(block)
    memory.write(handle + 40, np.array([-1, -2, -3], np.int32))  # elements 10, 11, 12
    part = np.empty(4, np.int32)
    memory.read(handle + 36, part)  # elements 9..12
    np.testing.assert_array_equal(part, [9, -1, -2, -3])
    whole = np.empty(64, np.int32)
    memory.copy_out(block, whole)
    want = np.arange(64, dtype=np.int32)
    want[10:13] = [-1, -2, -3]
    np.testing.assert_array_equal(whole, want)
    # bytes at any offset, any dtype on the host side
    memory.write(handle + 1, np.array([0xAB], np.uint8))
    byte = np.empty(1, np.uint8)
    memory.read(handle + 1, byte)
    assert byte[0] == 0xAB


def test_zero_byte_copies_do_nothing_and_host_arrays_are_checked():
    memory = EmulatedMemory()
    block = memory.alloc((8,), np.float32)
    memory.copy_in(block, np.arange(8, dtype=np.float32))
    empty = np.empty(0, np.float32)
    for handle in (memory.handle(block), 0, 12345):  # not even looked at
        memory.write(handle, empty)
        memory.read(handle, empty)
    memory.copy_in(block, empty)
    memory.copy_out(block, empty)
    out = np.empty(8, np.float32)
    memory.copy_out(block, out)
    np.testing.assert_array_equal(out, np.arange(8))
    with pytest.raises(ShapeError, match="C-contiguous"):
        memory.write(memory.handle(block), np.arange(8.0, dtype=np.float32)[::2])
    frozen = np.zeros(2, np.float32)
    frozen.setflags(write=False)
    with pytest.raises(ShapeError, match="writable"):
        memory.read(memory.handle(block), frozen)
    with pytest.raises(DeviceError, match="not an address of emulated device memory"):
        memory.write(np.zeros(1).ctypes.data, np.ones(1))


def test_allocations_are_distinct_and_copies_stay_in_their_own():
    memory = EmulatedMemory()
    blocks = [memory.alloc((n,), np.uint8) for n in (1, 100, 256, 257, 5000, 5000, 70_000)]
    spans = sorted((memory.handle(b), memory.handle(b) + b.nbytes) for b in blocks)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    for k, b in enumerate(blocks):
        memory.copy_in(b, np.full(b.nbytes, k, np.uint8))
    for k, b in enumerate(blocks):
        out = np.empty(b.nbytes, np.uint8)
        memory.copy_out(b, out)
        assert (out == k).all()
    zero = memory.alloc((0,), np.float32)  # a handle all the same, never 0
    assert zero.nbytes == 0 and memory.handle(zero) >> 55 == 1


def test_copy_in_and_out_check_sizes_and_freed_blocks():
    memory = EmulatedMemory()
    block = memory.alloc((10,), np.float64)
    x = np.linspace(0, 1, 10)
    memory.copy_in(block, x)
    memory.copy_in(block, np.array([7.0]))  # a prefix
    y = np.empty(10)
    memory.copy_out(block, y)
    np.testing.assert_array_equal(y, [7.0, *x[1:]])
    with pytest.raises(ShapeError, match="does not fit"):
        memory.copy_in(block, np.zeros(11))
    with pytest.raises(ShapeError, match="does not fit"):
        memory.copy_out(block, np.zeros(11))
    memory.free(block)
    with pytest.raises(ShapeError, match="which was freed"):
        memory.copy_out(block, y)
    with pytest.raises(DeviceError, match="freed twice"):
        memory.free(block)


def test_stats_count_allocations_and_the_limit_holds():
    memory = EmulatedMemory(memory_limit=4096)
    a = memory.alloc((100,), np.float32)  # 400 bytes: the 448-byte class
    b = memory.alloc((10,), np.int64)  # 80 bytes: the 256-byte class
    stats = memory.stats()
    assert (stats["num_allocs"], stats["allocated_bytes"], stats["requested_bytes"]) == (
        2, 704, 480)
    assert stats["memory_limit"] == memory.memory_limit == 4096
    with pytest.raises(OutOfMemoryError):
        memory.alloc((1025,), np.float32)
    memory.free(a)
    del b
    stats = memory.stats()
    assert stats["num_frees"] == 2 and stats["allocated_bytes"] == 0
    assert stats["peak_allocated_bytes"] == 704
    memory.reset_peak_stats()
    assert memory.stats()["peak_allocated_bytes"] == 0
    assert memory.empty_cache() > 0 and memory.stats()["reserved_bytes"] == 0
    memory.set_memory_limit(None)
    assert memory.memory_limit is None


# --- the emulated backend ---------------------------------------------------------------
@needs_triton
def test_the_emulated_backend_uses_it(emulate):
    impl = hologram.backends.get("cuda")
    assert isinstance(impl.allocator(), EmulatedMemory)
    with hg.Executor("cuda") as ex:
        assert isinstance(ex.allocator, EmulatedMemory) and ex.device == "cuda"
        a = np.arange(300, dtype=np.float32)
        x = ex.from_numpy(a)
        assert not x.host_visible and x.handle >> 55 == 1
        y = x * x + x
        assert y.handle >> 55 == 1 and y.handle != x.handle
        np.testing.assert_array_equal(y.to_numpy(), a * a + a)
        np.testing.assert_array_equal(ex.allocate(5, np.int32).to_numpy(), np.zeros(5))
        assert ex.memory_stats()["num_allocs"] >= 3
        assert x.__dlpack_device__() == (12, 0)  # no CUDA device claimed
        with pytest.raises(DeviceError, match="emulated"):
            x.__dlpack__()
        with pytest.raises(DeviceError, match="emulated"):
            ex.from_dlpack(a)


@needs_triton
def test_a_compiled_program_copies_in_and_out_and_matches_the_interpreter(emulate):
    g = Graph("emulated_memory")
    x = g.input("x", "f32", (5, 300))
    n = g.input("n", "i32", (300,))
    g.output("y", x * 2.0 + 1.0)
    g.output("s", g.reduce("sum", x, (1,), keepdim=False))
    g.output("m", n * n)
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((5, 300)).astype(np.float32)
    ns = rng.integers(-1000, 1000, 300).astype(np.int32)
    compiled = hologram.compile(g.program(), backend="cuda")
    assert compiled._native_call is None  # the device path: copied in, launched, copied out
    got = compiled(xs, ns)
    want = hologram.compile(g.program(), backend="interp")(xs, ns)
    for gg, ww in zip(got, want):
        np.testing.assert_allclose(gg, ww, rtol=2e-6)
    # Host addresses are not device memory: the emulated executable refuses them.
    host = [np.empty(p.size, p.dtype.storage) for p in compiled.params]
    with pytest.raises(DeviceError, match="not an address of emulated device memory"):
        compiled.launch(tuple(a.ctypes.data for a in host))


# --- read and write of the host pool and of device memory -------------------------------
def test_pool_read_and_write_at_host_addresses():
    pool = Pool()
    a = pool.empty(32, np.float32)
    a[:] = np.arange(32)
    handle = pool.handle(a)
    pool.write(handle + 8, np.array([-1.0, -2.0], np.float32))
    np.testing.assert_array_equal(a[:5], [0, 1, -1, -2, 4])
    out = np.empty(3, np.float32)
    pool.read(handle + 4, out)
    np.testing.assert_array_equal(out, [1, -1, -2])
    pool.write(0, np.empty(0, np.float32))  # 0 bytes: nothing, not even at address 0
    pool.read(0, np.empty(0, np.float32))


class AddressedDriver(FakeDriver):
    """The fake driver, with pointers into a block (a block's pointer plus an offset)
    resolved as the real driver's are, and its copies counted."""

    def _at(self, pointer: int) -> tuple[bytearray, int]:
        for start, data in self.memory.items():
            if start <= pointer < start + len(data):
                return data, pointer - start
        raise AssertionError(f"{pointer:#x} is in no block")

    def copy_in(self, pointer: int, source: np.ndarray) -> None:
        self.calls.append(("copy in", pointer, source.nbytes))
        data, offset = self._at(pointer)
        data[offset: offset + source.nbytes] = source.tobytes()

    def copy_out(self, destination: np.ndarray, pointer: int) -> None:
        self.calls.append(("copy out", pointer, destination.nbytes))
        data, offset = self._at(pointer)
        destination.reshape(-1).view(np.uint8)[:] = np.frombuffer(
            bytes(data[offset: offset + destination.nbytes]), np.uint8)

    def copy_device(self, destination: int, source: int, nbytes: int) -> None:
        self.calls.append(("copy device", destination, source, nbytes))
        src, at = self._at(source)
        dst, to = self._at(destination)
        dst[to: to + nbytes] = src[at: at + nbytes]


def test_device_memory_read_and_write_go_to_the_driver():
    driver = AddressedDriver()
    memory = DeviceMemory(driver)
    block = memory.alloc((16,), np.int16)
    memory.copy_in(block, np.arange(16, dtype=np.int16))
    memory.write(block.pointer + 6, np.array([-7, -8], np.int16))
    assert driver.calls[-1] == ("copy in", block.pointer + 6, 4)
    out = np.empty(4, np.int16)
    memory.read(block.pointer + 4, out)
    assert driver.calls[-1] == ("copy out", block.pointer + 4, 8)
    np.testing.assert_array_equal(out, [2, -7, -8, 5])
    calls = len(driver.calls)
    memory.write(block.pointer, np.empty(0, np.int16))
    memory.read(block.pointer, np.empty(0, np.int16))
    assert len(driver.calls) == calls  # 0 bytes: no driver call


def test_allocators_without_addresses_refuse_read_and_write():
    class Objects(base.Allocator):
        def alloc(self, shape, dtype):
            return object()

        def handle(self, allocation):
            return id(allocation)

        def copy_in(self, allocation, source):
            pass

        def copy_out(self, allocation, destination):
            pass

    with pytest.raises(DeviceError, match=r"Objects.*not addresses"):
        Objects().write(1, np.ones(1))
    with pytest.raises(DeviceError, match=r"Objects.*not addresses"):
        Objects().read(1, np.ones(1))
    # webgpu's handles are made-up byte addresses (a buffer's id and an offset): it reads
    # and writes at them itself (tests/test_webgpu.py)
    assert WebGpuAllocator.read is not base.Allocator.read
    assert WebGpuAllocator.write is not base.Allocator.write


class _HostStaged(Pool):
    """Host memory whose copies between handles take the base class's default path."""

    copy = base.Allocator.copy


@pytest.mark.parametrize("make", [EmulatedMemory, Pool, lambda: DeviceMemory(AddressedDriver()),
                                  _HostStaged], ids=["emulated", "pool", "cuda", "default"])
def test_copies_between_handles(make):
    """Allocator.copy: device to device at handles plus offsets (the torch device's staged
    results and resizes); the default goes through the host (read, then write)."""
    memory = make()
    i32 = np.dtype(np.int32)
    a, b = memory.alloc((32,), i32), memory.alloc((32,), i32)
    memory.copy_in(a, np.arange(32, dtype=np.int32))
    memory.copy_in(b, np.zeros(32, np.int32))
    memory.copy(memory.handle(b) + 8, memory.handle(a) + 40, 12)  # a[10:13] -> b[2:5]
    memory.copy(memory.handle(b), memory.handle(a), 0)
    out = np.empty(32, np.int32)
    memory.copy_out(b, out)
    want = np.zeros(32, np.int32)
    want[2:5] = [10, 11, 12]
    np.testing.assert_array_equal(out, want)
    if isinstance(memory, DeviceMemory):
        assert ("copy device", memory.handle(b) + 8, memory.handle(a) + 40,
                12) in memory.driver.calls


@needs_triton
def test_a_call_interrupted_before_its_reply_ends_the_triton_process(emulate):
    """A request whose reply never gets read (Ctrl-C, a test's time limit) must not leave
    that reply to answer the next request: the child is ended, the next call starts
    another, and its answer is its own."""
    from hologram.backends.cuda import triton_process

    g = Graph("interrupted")
    g.output("y", g.input("x", "f32", (4,)) * 2.0)
    compiled = hologram.compile(g.program(), backend="cuda")
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(compiled(x), x * 2)
    child = triton_process._workers["interpret"]
    read = child.process.stdout.read

    def interrupted(n):
        raise KeyboardInterrupt

    child.process.stdout.read = interrupted
    with pytest.raises(KeyboardInterrupt):
        compiled(x)
    child.process.stdout.read = read
    assert child.process.wait(timeout=30) is not None  # ended
    np.testing.assert_array_equal(compiled(x + 1), (x + 1) * 2)
    assert triton_process._workers["interpret"] is not child
