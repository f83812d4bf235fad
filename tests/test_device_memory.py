"""Executors on memory the host cannot see: a backend registered by this test whose
allocator keeps every allocation in private storage reachable only through copy_in and
copy_out (``host_visible = False``), and whose executable runs the reference interpreter
on copies of it. The SDK must work on it through the allocator contract alone
(hologram/backends/base.py, hologram/runtime/buffer.py, hologram/runtime/executor.py)."""

from __future__ import annotations

import gc
import math
import threading

import numpy as np
import pytest

import hologram as hg
from hologram import backends
from hologram.backends.base import Allocator, Executable
from hologram.backends.interp.backend import InterpBackend
from hologram.backends.interp.interpreter import execute
from hologram.errors import DeviceError, InvalidBufferError, OutOfMemoryError, ShapeError
from hologram.isa.text import parse_program
from hologram.runtime.launch import clear_memo, launch_cache

NAME = "devtest"


class _Store:
    """The "device": allocations by handle (fake addresses, never host addresses)."""

    def __init__(self):
        self.memory: dict[int, np.ndarray] = {}
        self.next = 1 << 44
        self.lock = threading.Lock()

    def new(self, nbytes: int) -> int:
        with self.lock:
            handle = self.next
            self.next += max(nbytes, 1) + 64  # disjoint ranges, like device addresses
            self.memory[handle] = np.zeros(nbytes, np.uint8)
        return handle

    def read(self, handle: int, nbytes: int) -> np.ndarray:
        return self.memory[handle][:nbytes].copy()

    def write(self, handle: int, data: np.ndarray) -> None:
        raw = data.reshape(-1).view(np.uint8)
        self.memory[handle][: raw.size] = raw


STORE = _Store()


class _Allocation:
    __slots__ = ("allocator", "handle", "nbytes")

    def __del__(self) -> None:  # the last buffer viewing it is gone: give it back
        STORE.memory.pop(self.handle, None)
        self.allocator.allocated -= self.nbytes


class DeviceAllocator(Allocator):
    device = "devtest"
    dlpack_device_type = 12  # kDLExtDev
    host_visible = False

    def __init__(self, memory_limit: int | None = None):
        self.limit = memory_limit
        self.allocated = 0
        self.synchronized = 0
        self.copies_in = self.copies_out = 0

    def alloc(self, shape, dtype):
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if self.limit is not None and self.allocated + nbytes > self.limit:
            raise OutOfMemoryError(f"devtest: {nbytes} bytes over the limit {self.limit}")
        allocation = _Allocation()
        allocation.allocator = self
        allocation.handle = STORE.new(nbytes)
        allocation.nbytes = nbytes
        self.allocated += nbytes
        return allocation

    def handle(self, allocation) -> int:
        return allocation.handle

    def copy_in(self, allocation, source: np.ndarray) -> None:
        assert source.flags.c_contiguous and source.nbytes <= allocation.nbytes
        self.copies_in += 1
        STORE.write(allocation.handle, source)

    def copy_out(self, allocation, destination: np.ndarray) -> None:
        assert destination.flags.c_contiguous and destination.nbytes <= allocation.nbytes
        self.copies_out += 1
        destination.reshape(-1).view(np.uint8)[:] = STORE.read(allocation.handle,
                                                               destination.nbytes)

    def synchronize(self) -> None:
        self.synchronized += 1

    def stats(self) -> dict:
        return {"allocated_bytes": self.allocated, "memory_limit": self.limit}

    @property
    def memory_limit(self):
        return self.limit

    def set_memory_limit(self, limit) -> None:
        self.limit = limit


class _OnCopies(Executable):
    """Runs the interpreter on host copies of the device memory, then copies outputs back."""

    def __init__(self, program):
        self.program = program

    def launch(self, handles) -> None:
        params = self.program.params
        arrays = [STORE.read(h, p.nbytes).view(p.dtype.storage) if p.size else
                  np.empty(0, p.dtype.storage) for p, h in zip(params, handles)]
        execute(self.program, arrays)
        for p, h, a in zip(params, handles, arrays):
            if p.kind != "in" and p.size:
                STORE.write(h, a)


class DeviceBackend(InterpBackend):
    name = NAME

    def load(self, artifact: bytes) -> Executable:
        return _OnCopies(parse_program(artifact.decode()))

    def allocator(self, memory_limit: int | None = None) -> Allocator:
        return DeviceAllocator(memory_limit)


@pytest.fixture(scope="module", autouse=True)
def registered():
    backends.register(NAME, DeviceBackend)
    yield
    backends.unregister(NAME)
    launch_cache().discard(lambda k: len(k) > 1 and isinstance(k[1], str) and k[1] == NAME)
    clear_memo()


@pytest.fixture
def ex():
    with hg.Executor(NAME) as e:
        yield e


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --- registration ------------------------------------------------------------------------

def test_registered_backend_is_available_and_named():
    assert NAME in backends.available() and NAME in backends.names()
    assert hg.backend.validate_backend(NAME.upper()) == NAME
    assert backends.resolve("auto") != NAME  # built-in backends are preferred
    with pytest.raises(DeviceError, match="taken"):
        backends.register(NAME, DeviceBackend)
    with pytest.raises(DeviceError, match="taken"):
        backends.register("cpu", DeviceBackend)
    with pytest.raises(DeviceError, match="Backend"):
        backends.register("other", object)
    with pytest.raises(DeviceError, match="registered"):
        backends.unregister("cpu")


# --- memory through the allocator ----------------------------------------------------------

def test_executor_memory_comes_from_the_backend(ex):
    assert type(ex.allocator) is DeviceAllocator
    assert ex.device == "devtest"
    buf = ex.allocate((2, 3))
    assert buf.device == "devtest" and not buf.host_visible
    assert buf.__dlpack_device__() == (12, 0)
    with hg.Executor("cpu") as host:
        assert isinstance(host.allocator, hg.runtime.Pool)
        assert host.device == "cpu" and host.allocate(3).__dlpack_device__() == (1, 0)


def test_allocate_from_numpy_to_numpy_copy(ex):
    zeros = ex.allocate((2, 3), np.int32)
    np.testing.assert_array_equal(zeros.to_numpy(), np.zeros((2, 3), np.int32))
    x = rand(4, 5)
    buf = ex.from_numpy(x)
    got = buf.to_numpy()
    np.testing.assert_array_equal(got, x)
    got[:] = 0  # a copy: the device memory is untouched
    np.testing.assert_array_equal(buf.to_numpy(), x)
    assert buf.to_numpy() is not buf.to_numpy()
    buf.from_numpy(np.arange(20, dtype=np.float64))  # converted same_kind, copied in
    np.testing.assert_array_equal(buf.to_numpy().reshape(-1), np.arange(20))
    strided = np.arange(40, dtype=np.float32)[::2]  # non-contiguous source
    np.testing.assert_array_equal(ex.from_numpy(strided).to_numpy(), strided)
    np.testing.assert_array_equal(np.asarray(buf), buf.to_numpy())
    assert ex.allocator.copies_in >= 3 and ex.allocator.copies_out >= 3


def test_host_never_sees_the_memory(ex):
    buf = ex.from_numpy(rand(3))
    with pytest.raises(DeviceError, match="host cannot see"):
        buf.array()
    with pytest.raises(DeviceError, match="to_numpy"):
        buf.__dlpack__()
    with pytest.raises(DeviceError):
        np.from_dlpack(buf)
    with pytest.raises(DeviceError, match="from_numpy"):
        ex.from_dlpack(np.zeros(3, np.float32))
    with pytest.raises(ValueError):
        buf.__array__(copy=False)


def test_ops_run_on_device_memory(ex):
    x, y = rand(6, seed=1), rand(6, seed=2)
    a, b, c = ex.from_numpy(x), ex.from_numpy(y), ex.empty(6)
    for _ in range(3):  # the general path, then the validated launch
        assert hg.ops.vector_add(ex, a, b, c) is c
        np.testing.assert_allclose(c.to_numpy(), x + y, rtol=1e-6)
    np.testing.assert_allclose((a * b + 1.5).to_numpy(), x * y + 1.5, rtol=1e-6)  # scalars
    np.testing.assert_allclose(hg.ops.sum(a).to_numpy(), x.sum(), rtol=1e-5)
    np.testing.assert_allclose((a.reshape(2, 3) @ b.reshape(3, 2)).to_numpy(),
                               x.reshape(2, 3) @ y.reshape(3, 2), rtol=1e-5)
    hg.ops.vector_add(ex, a, b, a)  # in place
    np.testing.assert_allclose(a.to_numpy(), x + y, rtol=1e-6)
    hg.ops.vector_neg(ex, b, c, n=4)  # the first 4 elements
    np.testing.assert_allclose(c.to_numpy()[:4], -y[:4])
    c.fill(2.5)
    np.testing.assert_array_equal(c.to_numpy(), np.full(6, 2.5, np.float32))
    c.copy_from(b)
    np.testing.assert_array_equal(c.to_numpy(), y)
    d = ex.from_numpy(x)
    hg.ops.reduce_sum(ex, d, d)  # out overlaps the input: staged, then copied over
    assert d.to_numpy()[0] == pytest.approx(x.sum(), rel=1e-5)
    np.testing.assert_array_equal(d.to_numpy()[1:], x[1:])


def test_compiled_programs_copy_host_arrays_in_and_out():
    """NumPy arrays are host memory: a call copies them into device allocations, runs
    there and copies the outputs back (fresh arrays, or the given ones); bad arrays are
    refused as on the host."""
    from hologram.frontend.graph import Graph
    from hologram.isa import dtypes as dt

    g = Graph("twice")
    g.output("y", g.input("x", dt.float32, (3,)) * 2)
    compiled = hg.compile(g.program(), NAME)
    x = rand(3, seed=5)
    np.testing.assert_array_equal(compiled(x), x * 2)
    out = np.full(3, np.nan, np.float32)
    assert compiled(x, out) is out
    np.testing.assert_array_equal(out, x * 2)
    with pytest.raises(ShapeError, match="twice"):
        compiled(np.ones(4, np.float32))


def test_jit_on_device_memory(ex):
    fused = hg.jit(lambda a, b: hg.ops.relu(a * b + a))
    x, y = rand(8, seed=3), rand(8, seed=4)
    a, b = ex.from_numpy(x), ex.from_numpy(y)
    for _ in range(2):
        np.testing.assert_allclose(fused(a, b).to_numpy(), np.maximum(x * y + x, 0),
                                   rtol=1e-6)
    assert fused.compiled_signatures == 1


def test_synchronize_memory_accounting_and_lifetime(ex):
    before = ex.allocator.synchronized
    ex.synchronize()
    assert ex.allocator.synchronized == before + 1
    base = ex.memory_stats()["allocated_bytes"]
    buf = ex.empty(100)
    view = buf.reshape(10, 10)
    assert ex.memory_stats()["allocated_bytes"] == base + 400
    buf.free()
    gc.collect()
    assert ex.memory_stats()["allocated_bytes"] == base + 400  # the view still holds it
    assert view.to_numpy().shape == (10, 10)
    view.free()
    gc.collect()
    assert ex.memory_stats()["allocated_bytes"] == base
    with pytest.raises(InvalidBufferError):
        view.to_numpy()
    ex.set_memory_limit(base + 64)
    with pytest.raises(OutOfMemoryError, match="memory_limit"):
        ex.empty(100)
    ex.set_memory_limit(None)
    ex.close()
    with pytest.raises(InvalidBufferError):
        ex.synchronize()
