"""The SDK's Executor and Buffer: backend selection, allocation, data in and out, DLPack,
memory accounting and buffer lifetime (hologram/runtime/executor.py,
hologram/runtime/buffer.py, hologram/sdk/backend.py)."""

from __future__ import annotations

import gc
import random

import numpy as np
import pytest
import torch

import hologram as hg
from hologram import backends
from hologram.backends.hostmem import CACHE_SLACK, SLAB_BYTES
from hologram.errors import (
    DeviceError,
    DTypeError,
    HologramError,
    InvalidBufferError,
    OutOfMemoryError,
    ShapeError,
)

SUPPORTED = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.float16,
             np.float32, np.float64]
UNSUPPORTED = [np.complex64, np.complex128, np.uint16, np.uint32, np.uint64, object, str,
               "U3", "S3", "V8", "datetime64[s]", "i4,i4"]


@pytest.fixture
def ex():
    with hg.Executor("cpu") as e:
        yield e


# --- backend selection -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["auto", "cpu", "interp", "CPU", " Interp ",
                                  hg.backend.BackendType.CPU, hg.backend.BackendType.AUTO])
def test_executor_backends_that_run_here(name, monkeypatch):
    monkeypatch.delenv("HOLOGRAM_BACKEND", raising=False)
    with hg.Executor(backend=name) as ex:
        assert ex.backend in ("cpu", "interp")
        if str(name).strip().lower() != "auto":
            assert ex.backend == str(name).strip().lower()
        a = ex.from_numpy(np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal((a + a).to_numpy(), [0, 2, 4, 6])


@pytest.mark.parametrize("name", ["cuda", hg.backend.BackendType.CUDA])
def test_unavailable_backends_raise_device_error_naming_the_available(name):
    # cuda runs on an NVIDIA GPU or emulated (HOLOGRAM_CUDA_EMULATE=1, docs/cuda.md); CI has
    # neither
    with pytest.raises(DeviceError) as info:
        hg.Executor(backend=name)
    message = str(info.value)
    assert str(name) in message and "cannot run on this machine" in message
    for available in hg.backend.list_available_backends():
        assert available in message


@pytest.mark.parametrize("name", ["tpu", "", "gpu0", None, 3, 1.5])
def test_unknown_backends_raise_device_error(name):
    with pytest.raises(DeviceError) as info:
        hg.Executor(backend=name)
    if isinstance(name, str):
        assert "cpu" in str(info.value)  # it names what is available


def test_backend_module():
    bt = hg.backend.BackendType
    assert {t.value for t in bt} == {"auto", *backends.BUILTIN, *backends.PLANNED}
    assert {"cpu", "cuda", "metal", "webgpu", "vulkan", "c", "interp"} <= set(backends.BUILTIN)
    assert str(bt.CPU) == "cpu"
    assert hg.backend.is_cuda_available() is False  # no driver runtime yet: false with a GPU
    assert hg.backend.is_metal_available() is False
    available = hg.backend.list_available_backends()
    # in the registry's order: the GPU backends found here, then the host ones
    assert available == [name for name in backends.BUILTIN if name in available]
    assert available[-1] == "interp" and "cpu" in available
    assert hg.backend.validate_backend("CPU") == "cpu"
    assert hg.backend.validate_backend(bt.INTERP) == "interp"
    for name in ("cuda", "metal", "webgpu", "vulkan", "nope"):
        if name in available:  # webgpu/vulkan on a Vulkan driver (lavapipe in CI)
            continue
        with pytest.raises(DeviceError):
            hg.backend.validate_backend(name)


def test_hologram_backend_env_steers_auto(monkeypatch):
    monkeypatch.delenv("HOLOGRAM_BACKEND", raising=False)
    assert hg.backend.get_default_backend() == "cpu"
    assert hg.backend.validate_backend("auto") == "cpu"
    monkeypatch.setenv("HOLOGRAM_BACKEND", "interp")
    assert hg.backend.get_default_backend() == "interp"
    with hg.Executor("auto") as ex:
        assert ex.backend == "interp"
    with hg.Executor("cpu") as ex:  # an explicit name wins over the variable
        assert ex.backend == "cpu"
    monkeypatch.setenv("HOLOGRAM_BACKEND", "bogus")
    with pytest.raises(DeviceError, match="HOLOGRAM_BACKEND"):
        hg.Executor("auto")
    monkeypatch.setenv("HOLOGRAM_BACKEND", "cuda")
    with pytest.raises(DeviceError, match="cuda"):
        hg.backend.get_default_backend()
    monkeypatch.setenv("HOLOGRAM_BACKEND", "auto")
    assert hg.backend.get_default_backend() == "cpu"


# --- allocation and attributes -----------------------------------------------------------

@pytest.mark.parametrize("dtype", SUPPORTED)
def test_allocate_is_zero_filled_for_every_dtype(ex, dtype):
    # Recycle a dirty block first so that zero-filling is observable (not fresh mmap zeros).
    dirty = ex.empty(1024, dtype=np.uint8)
    dirty.to_numpy()[:] = 0xAB
    del dirty
    buf = ex.allocate(1024 // np.dtype(dtype).itemsize, dtype=dtype)
    array = buf.to_numpy()
    assert array.dtype == np.dtype(dtype) and not array.any()
    matrix = ex.allocate((64, 128), dtype=dtype)
    assert matrix.shape == (64, 128) and matrix.dtype == np.dtype(dtype)
    assert not matrix.to_numpy().any()


def test_buffer_attributes(ex):
    buf = ex.allocate((64, 128), dtype=np.float32)
    assert buf.shape == (64, 128)
    assert buf.dtype == np.float32 and isinstance(buf.dtype, np.dtype)
    assert buf.size == 64 * 128
    assert buf.nbytes == 64 * 128 * 4
    assert buf.ndim == 2
    assert buf.device == "cpu"
    assert buf.executor is ex
    assert len(buf) == 64
    assert not buf.freed
    text = repr(buf)
    assert "[64, 128]" in text and "float32" in text and "cpu" in text
    one = ex.allocate(1024, dtype=np.float32)
    assert one.shape == (1024,) and one.nbytes == 4096 and len(one) == 1024
    scalar = ex.allocate((), dtype=np.int64)
    assert scalar.shape == () and scalar.size == 1 and scalar.ndim == 0
    with pytest.raises(TypeError):
        len(scalar)
    empty = ex.allocate(0)
    assert empty.size == 0 and empty.nbytes == 0 and len(empty) == 0
    assert empty.to_numpy().shape == (0,)


def test_empty_has_the_shape_and_dtype(ex):
    buf = ex.empty((3, 5), dtype=np.int16)
    assert buf.shape == (3, 5) and buf.dtype == np.int16
    assert buf.to_numpy().flags.c_contiguous and buf.to_numpy().flags.writeable


@pytest.mark.parametrize("dtype", UNSUPPORTED)
def test_unsupported_dtypes_raise_dtype_error(ex, dtype):
    with pytest.raises(DTypeError, match="supported"):
        ex.allocate(4, dtype=dtype)
    with pytest.raises(DTypeError):
        ex.empty(4, dtype=dtype)
    with pytest.raises(DTypeError):
        ex.from_numpy(np.zeros(4, dtype=dtype))


def test_reshape_views_the_same_memory(ex):
    buf = ex.from_numpy(np.arange(12, dtype=np.float32))
    m = buf.reshape(3, 4)
    assert m.shape == (3, 4)
    assert buf.reshape((4, 3)).shape == (4, 3)
    assert buf.reshape(-1).shape == (12,)
    assert buf.reshape(2, -1).shape == (2, 6)
    assert buf.reshape(np.int64(12)).shape == (12,)
    m.to_numpy()[1, 1] = 100
    assert buf.to_numpy()[5] == 100
    for bad in [(5,), (-1, 5), (-1, -1), (2, -2), "x"]:
        with pytest.raises(ShapeError, match="reshape"):
            buf.reshape(bad)
    empty = ex.allocate(0)
    assert empty.reshape(0, 3).shape == (0, 3)
    with pytest.raises(ShapeError):
        empty.reshape(-1, 0)


# --- data in and out ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", SUPPORTED)
def test_round_trip_every_dtype(ex, dtype):
    x = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    buf = ex.from_numpy(x)
    assert buf.shape == x.shape and buf.dtype == x.dtype
    np.testing.assert_array_equal(buf.to_numpy(), x)
    np.testing.assert_array_equal(np.asarray(buf), x)


def test_to_numpy_is_a_zero_copy_view_unless_copy(ex):
    buf = ex.from_numpy(np.arange(8, dtype=np.float32))
    view = buf.to_numpy()
    buf.fill(3.0)
    np.testing.assert_array_equal(view, np.full(8, 3.0))  # writes show through
    view[0] = -1
    assert buf.to_numpy()[0] == -1
    copy = buf.to_numpy(copy=True)
    buf.fill(5.0)
    np.testing.assert_array_equal(copy, [-1] + [3.0] * 7)
    assert not np.shares_memory(copy, buf.to_numpy())


def test_ex_from_numpy_copies(ex):
    x = np.arange(6, dtype=np.float32)
    buf = ex.from_numpy(x)
    x[:] = 9
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(6))
    assert not np.shares_memory(x, buf.to_numpy())


def test_ex_from_numpy_accepts_non_contiguous_read_only_and_lists(ex):
    x = np.arange(20, dtype=np.float64).reshape(4, 5)
    strided = ex.from_numpy(x.T)
    assert strided.shape == (5, 4)
    np.testing.assert_array_equal(strided.to_numpy(), x.T)
    ro = np.arange(5, dtype=np.int32)
    ro.flags.writeable = False
    buf = ex.from_numpy(ro)
    buf.fill(7)  # the copy is writable
    np.testing.assert_array_equal(buf.to_numpy(), [7] * 5)
    np.testing.assert_array_equal(ro, np.arange(5))
    assert ex.from_numpy([[1.0, 2.0], [3.0, 4.0]]).shape == (2, 2)
    assert ex.from_numpy(np.arange(3), dtype=np.float32).dtype == np.float32
    big_endian = ex.from_numpy(np.arange(3, dtype=">f4"))
    assert big_endian.dtype == np.float32
    np.testing.assert_array_equal(big_endian.to_numpy(), [0, 1, 2])


def test_buffer_from_numpy_fill_and_copy_from(ex):
    buf = ex.allocate((2, 3), dtype=np.float32)
    assert buf.from_numpy(np.arange(6, dtype=np.float64)) is buf  # same_kind conversion
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(6).reshape(2, 3))
    buf.from_numpy(np.ones((3, 2)))  # same number of elements, read row-major
    assert buf.to_numpy().sum() == 6
    with pytest.raises(ShapeError, match="from_numpy"):
        buf.from_numpy(np.ones(5))
    ints = ex.allocate(6, dtype=np.int32)
    with pytest.raises(DTypeError, match="from_numpy"):
        ints.from_numpy(np.ones(6))  # float into int: no
    assert buf.fill(1.0) is buf
    np.testing.assert_array_equal(buf.to_numpy(), np.ones((2, 3)))
    other = ex.from_numpy(np.arange(6, dtype=np.int32))
    assert buf.copy_from(other) is buf
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(6).reshape(2, 3))
    assert ints.copy_from(buf) is ints
    np.testing.assert_array_equal(ints.to_numpy(), np.arange(6))


def test_array_protocol(ex):
    buf = ex.from_numpy(np.arange(4, dtype=np.float32))
    a = np.asarray(buf)
    assert np.shares_memory(a, buf.to_numpy())
    assert np.asarray(buf, dtype=np.float64).dtype == np.float64
    assert not np.shares_memory(np.array(buf, copy=True), buf.to_numpy())
    with pytest.raises(ValueError):
        np.asarray(buf, dtype=np.float64, copy=False)


# --- DLPack ------------------------------------------------------------------------------

def test_numpy_and_torch_from_dlpack_share_memory(ex):
    buf = ex.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    a = np.from_dlpack(buf)
    t = torch.from_dlpack(buf)
    assert a.shape == (2, 3) and tuple(t.shape) == (2, 3) and t.dtype == torch.float32
    buf.fill(2.0)
    assert (a == 2).all() and bool((t == 2).all())
    t[0, 0] = 42
    assert a[0, 0] == 42 and buf.to_numpy()[0, 0] == 42
    a[1, 2] = -3
    assert float(t[1, 2]) == -3


@pytest.mark.parametrize("via", ["hg", "ex"])
def test_from_dlpack_numpy_is_zero_copy(ex, via):
    x = np.arange(8, dtype=np.float32)
    buf = hg.from_dlpack(x) if via == "hg" else ex.from_dlpack(x)
    assert buf.shape == (8,) and buf.dtype == np.float32
    x[0] = 99
    assert buf.to_numpy()[0] == 99
    buf.fill(1.0)
    assert (x == 1).all()
    if via == "ex":
        hg.ops.vector_add(ex, buf, buf, buf)
        assert (x == 2).all()


@pytest.mark.parametrize("via", ["hg", "ex"])
def test_from_dlpack_torch_is_zero_copy(ex, via):
    t = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    buf = hg.from_dlpack(t) if via == "hg" else ex.from_dlpack(t)
    assert buf.shape == (2, 3) and buf.dtype == np.int64
    t[1, 1] = 50
    assert buf.to_numpy()[1, 1] == 50
    out = hg.ops.vector_add(buf, 1)
    np.testing.assert_array_equal(out.to_numpy(), t.numpy() + 1)
    buf.fill(7)
    assert bool((t == 7).all())


def test_from_dlpack_keeps_the_producer_alive(ex):
    buf = ex.from_dlpack(torch.arange(1000, dtype=torch.float32))
    gc.collect()
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(1000))


def test_from_dlpack_refuses_non_contiguous(ex):
    with pytest.raises(ShapeError, match="contiguous"):
        ex.from_dlpack(np.arange(20.0).reshape(4, 5).T)
    with pytest.raises(ShapeError, match="contiguous"):
        hg.from_dlpack(torch.ones(4, 4)[:, ::2])
    with pytest.raises(ShapeError):
        hg.from_dlpack(np.arange(5.0)[::-1])


def test_from_dlpack_refuses_grad_and_unsupported_objects(ex):
    with pytest.raises(HologramError, match="from_dlpack") as info:
        hg.from_dlpack(torch.ones(3, requires_grad=True))
    assert "grad" in str(info.value)
    for obj in (None, 3, "abc", [1.0, 2.0], object(), np.float32(1.0),
                torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.complex64),
                np.ones(3, dtype=np.complex128), np.ones(3, dtype=np.uint16),
                torch.empty(3, device="meta"), torch.eye(3).to_sparse()):
        with pytest.raises(HologramError, match="from_dlpack"):
            ex.from_dlpack(obj)


def test_read_only_dlpack_buffer_is_readable_not_writable(ex):
    x = np.arange(8, dtype=np.float32)
    x.flags.writeable = False
    ro = ex.from_dlpack(x)
    np.testing.assert_array_equal(hg.ops.vector_add(ro, ro).to_numpy(), 2 * x)
    np.testing.assert_array_equal((ro * 3).to_numpy(), 3 * x)
    ok = ex.allocate(8)
    hg.ops.vector_add(ex, ro, ro, ok)
    np.testing.assert_array_equal(ok.to_numpy(), 2 * x)
    for write in (lambda: hg.ops.vector_add(ex, ok, ok, ro),
                  lambda: hg.ops.exp(ex, ok, ro),
                  lambda: ro.from_numpy(np.zeros(8)),
                  lambda: ro.fill(0.0),
                  lambda: ro.copy_from(ok),
                  lambda: hg.ops.copy(ok, ro.reshape(2, 4))):
        with pytest.raises(InvalidBufferError, match="read-only"):
            write()
    np.testing.assert_array_equal(x, np.arange(8))


def test_read_only_out_after_a_writable_foreign_out_of_the_same_shape(ex):
    # The ops' fast path remembers validated calls: a read-only buffer must not reuse the
    # launch that a writable foreign buffer of the same shape validated.
    a, b = ex.from_numpy(np.ones(8, np.float32)), ex.from_numpy(np.ones(8, np.float32))
    writable = ex.from_dlpack(np.zeros(8, np.float32))
    hg.ops.vector_add(ex, a, b, writable)
    hg.ops.vector_add(ex, a, b, writable)
    assert (writable.to_numpy() == 2).all()
    frozen = np.zeros(8, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(InvalidBufferError, match="read-only"):
        hg.ops.vector_add(ex, a, b, ex.from_dlpack(frozen))
    assert not frozen.any()


def test_overlapping_foreign_buffers_give_the_staged_result(ex):
    ones = ex.from_numpy(np.ones(8, np.float32))
    # First a call that takes (and may remember) the fast path with disjoint foreign memory.
    p0, q0 = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    hg.ops.vector_add(ex, ex.from_dlpack(p0), ones, ex.from_dlpack(q0))
    hg.ops.vector_add(ex, ex.from_dlpack(p0), ones, ex.from_dlpack(q0))
    np.testing.assert_array_equal(q0, p0 + 1)
    # Then foreign buffers of the same shapes whose memory overlaps with a shift.
    w = np.arange(10, dtype=np.float32)
    expected = w.copy()
    expected[2:] = w[:8] + 1
    hg.ops.vector_add(ex, ex.from_dlpack(w[:8]), ones, ex.from_dlpack(w[2:]))
    np.testing.assert_array_equal(w, expected)


# --- memory ------------------------------------------------------------------------------

def test_memory_stats_and_empty_cache(ex):
    stats = ex.memory_stats()
    for key in ("allocated_bytes", "reserved_bytes", "peak_allocated_bytes", "num_classes",
                "pool_hits", "pool_misses"):
        assert key in stats
    assert stats["num_classes"] == 96
    assert stats["allocated_bytes"] == 0
    buf = ex.allocate(1 << 20, dtype=np.float32)
    stats = ex.memory_stats()
    assert stats["allocated_bytes"] >= 4 << 20
    assert stats["reserved_bytes"] >= stats["allocated_bytes"]
    assert stats["peak_allocated_bytes"] >= stats["allocated_bytes"]
    misses = stats["pool_misses"]
    del buf
    assert ex.memory_stats()["allocated_bytes"] == 0
    again = ex.allocate(1 << 20, dtype=np.float32)
    stats = ex.memory_stats()
    assert stats["pool_hits"] >= 1 and stats["pool_misses"] == misses
    del again
    assert ex.memory_stats()["reserved_bytes"] > 0
    assert ex.empty_cache() > 0
    assert ex.memory_stats()["reserved_bytes"] == 0


def test_executors_have_separate_pools():
    with hg.Executor("cpu") as one, hg.Executor("cpu") as two:
        keep = one.allocate(1 << 16)
        assert one.memory_stats()["allocated_bytes"] > 0
        assert two.memory_stats()["allocated_bytes"] == 0
        del keep


def test_memory_limit_raises_out_of_memory_naming_request_and_usage():
    with hg.Executor("cpu", memory_limit=1 << 20) as ex:
        keep = ex.allocate(512 << 10, dtype=np.uint8)
        with pytest.raises(OutOfMemoryError) as info:
            ex.allocate(1 << 20, dtype=np.uint8)
        message = str(info.value)
        assert "allocate" in message
        assert "1,048,576" in message  # the request (and the limit)
        assert "524,288" in message  # what is already allocated
        assert "set_memory_limit" in message
        assert isinstance(info.value, MemoryError)
        # Op outputs count too, and the executor stays usable.
        big = ex.allocate(100 << 10, dtype=np.float32)
        with pytest.raises(OutOfMemoryError):
            hg.ops.vector_add(big, big)
        del keep
        out = hg.ops.vector_add(big, big)
        assert out.shape == big.shape
        ex.set_memory_limit(None)
        ex.allocate(2 << 20, dtype=np.uint8)


def test_random_allocate_free_cycles_keep_reserved_within_twice_the_peak():
    """Within twice the peak, or the peak and CACHE_SLACK where that is more (pool docs)."""
    def bound(peak):
        return max(2 * peak, peak + CACHE_SLACK)

    rng = random.Random(7)
    with hg.Executor("cpu") as ex:
        live: list = []
        live_bytes = peak_live = 0
        slack = 25 * SLAB_BYTES  # small-class slabs go back only when wholly free (pool docs)
        for i in range(100_000):
            if live and (len(live) >= 32 or rng.random() < 0.5):
                buf = live.pop(rng.randrange(len(live)))
                live_bytes -= buf.nbytes
                if i % 2:
                    buf.free()
                del buf
            else:
                buf = ex.empty(int(2 ** rng.uniform(0, 22)), dtype=np.uint8)
                live.append(buf)
                live_bytes += buf.nbytes
                peak_live = max(peak_live, live_bytes)
            if i % 64 == 0:
                stats = ex.memory_stats()
                assert stats["reserved_bytes"] <= bound(stats["peak_allocated_bytes"]) + slack
        stats = ex.memory_stats()
        assert stats["reserved_bytes"] <= bound(stats["peak_allocated_bytes"])
        # Class rounding adds less than 25% above 256 B (and small blocks are 256 B).
        assert stats["peak_allocated_bytes"] <= 1.25 * peak_live + 32 * 256
        assert stats["reserved_bytes"] <= bound(1.25 * peak_live) + 64 * 256
        assert stats["pool_hits"] > 0.9 * (stats["pool_hits"] + stats["pool_misses"])
        live.clear()
        assert ex.memory_stats()["allocated_bytes"] == 0


# --- lifetime ----------------------------------------------------------------------------

def test_memory_returns_when_the_last_reference_goes(ex):
    buf = ex.allocate(1 << 20)
    other = buf  # a second reference
    assert ex.memory_stats()["allocated_bytes"] >= 4 << 20
    del buf
    assert ex.memory_stats()["allocated_bytes"] >= 4 << 20
    del other
    assert ex.memory_stats()["allocated_bytes"] == 0
    result = hg.ops.vector_add(ex.allocate(1 << 20), 1.0)
    assert ex.memory_stats()["allocated_bytes"] >= 4 << 20
    del result
    assert ex.memory_stats()["allocated_bytes"] == 0


def test_free_returns_the_memory_and_ends_the_buffer(ex):
    buf = ex.allocate(1 << 20)
    buf.free()
    assert ex.memory_stats()["allocated_bytes"] == 0
    assert buf.freed and "freed" in repr(buf)
    buf.free()  # idempotent
    uses = [buf.to_numpy, lambda: buf.to_numpy(copy=True), lambda: buf.fill(1.0),
            lambda: buf.from_numpy(np.zeros(1 << 20)), lambda: buf.reshape(2, -1),
            lambda: np.asarray(buf), lambda: np.from_dlpack(buf), lambda: torch.from_dlpack(buf),
            lambda: buf + 1, lambda: -buf, lambda: hg.ops.exp(buf), lambda: hg.ops.sum(buf),
            lambda: hg.ops.copy(ex.allocate(1 << 20), buf),
            lambda: ex.allocate(1 << 20).copy_from(buf),
            lambda: ex.from_dlpack(buf)]
    for use in uses:
        with pytest.raises(InvalidBufferError) as info:
            use()
        assert "free()" in str(info.value) and "[1048576]" in str(info.value)


def test_freed_buffer_misses_the_fast_path(ex):
    a, b, c = (ex.from_numpy(np.ones(16, np.float32)) for _ in range(3))
    for _ in range(3):  # validated once, then remembered
        hg.ops.vector_add(ex, a, b, c)
        hg.ops.exp(ex, a, c)
    for victim in (a, b, c):
        keep = [x for x in (a, b, c) if x is not victim]
        victim.free()
        with pytest.raises(InvalidBufferError, match="freed"):
            hg.ops.vector_add(ex, a, b, c)
        if victim is not b:  # exp reads a and writes c
            with pytest.raises(InvalidBufferError, match="freed"):
                hg.ops.exp(ex, a, c)
        a, b, c = (x if x is not victim else ex.from_numpy(np.ones(16, np.float32))
                   for x in (a, b, c))
        del keep


def test_numpy_views_taken_before_free_stay_valid(ex):
    buf = ex.from_numpy(np.arange(1 << 18, dtype=np.float32))
    view = buf.to_numpy()
    tensor = torch.from_dlpack(buf)
    buf.free()
    assert ex.memory_stats()["allocated_bytes"] > 0  # the views hold the block
    assert view[12345] == 12345 and float(tensor[7]) == 7
    view[:] = 1  # still writable memory, not the pool's next block
    filler = ex.allocate(1 << 18)  # must not land on the view's memory
    assert (view == 1).all() and not filler.to_numpy().any()
    del view, tensor, filler
    assert ex.memory_stats()["allocated_bytes"] == 0


def test_close_ends_every_buffer_and_view():
    ex = hg.Executor("cpu")
    a = ex.allocate((4, 4))
    r = a.reshape(16)
    result = a + 1
    foreign = ex.from_dlpack(np.zeros(3))
    view = a.to_numpy()
    ex.close()
    ex.close()  # idempotent
    assert ex.closed and "closed" in repr(ex)
    for buf in (a, r, result, foreign):
        assert buf.freed
        with pytest.raises(InvalidBufferError, match="closed"):
            buf.to_numpy()
        with pytest.raises(InvalidBufferError, match="closed"):
            buf.fill(1)
        with pytest.raises(InvalidBufferError, match="closed"):
            hg.ops.vector_add(buf, buf)
    view[:] = 3  # numpy views stay valid
    assert view.sum() == 48
    for make in (lambda: ex.allocate(4), lambda: ex.empty(4),
                 lambda: ex.from_numpy(np.ones(3)), lambda: ex.from_dlpack(np.ones(3)),
                 ex.synchronize):
        with pytest.raises(InvalidBufferError, match="closed"):
            make()


def test_with_block_closes_and_releases_cached_memory():
    with hg.Executor("cpu") as ex:
        a = ex.allocate(1 << 20)
        b = hg.ops.vector_add(a, a)
        del b
    assert ex.closed and a.freed
    with pytest.raises(InvalidBufferError):
        a.to_numpy()
    stats = ex.memory_stats()
    assert stats["allocated_bytes"] == 0 and stats["reserved_bytes"] == 0


def test_fast_path_after_close_raises():
    ex = hg.Executor("cpu")
    a, c = ex.allocate(16), ex.allocate(16)
    r = c.reshape(4, 4)
    rr = a.reshape(4, 4)
    for _ in range(3):
        hg.ops.vector_add(ex, a, a, c)
        hg.ops.vector_add(ex, rr, rr, r)
    ex.close()
    with pytest.raises(InvalidBufferError):
        hg.ops.vector_add(ex, a, a, c)
    with pytest.raises(InvalidBufferError):
        hg.ops.vector_add(ex, rr, rr, r)


def test_buffers_of_two_executors_do_not_mix():
    with hg.Executor("cpu") as one, hg.Executor("cpu") as two:
        a, b = one.allocate(8), two.allocate(8)
        for call in (lambda: hg.ops.vector_add(a, b), lambda: a + b,
                     lambda: hg.ops.vector_add(one, a, a, b),
                     lambda: hg.ops.vector_add(two, a, a, a),
                     lambda: hg.ops.copy(a, b), lambda: b.copy_from(a)):
            with pytest.raises(InvalidBufferError, match="another executor"):
                call()
        # The explicit way across: a copy, or DLPack.
        np.testing.assert_array_equal(two.from_numpy(a.to_numpy()).to_numpy(), np.zeros(8))
        shared = two.from_dlpack(a)
        assert shared.executor is two
        assert one.from_dlpack(a) is a


def test_default_executor_and_hg_from_dlpack():
    x = np.ones(4, np.float32)
    buf = hg.from_dlpack(x)
    assert buf.executor is hg.default_executor()
    with hg.Executor("interp") as ex:
        assert hg.from_dlpack(x, ex).executor is ex
