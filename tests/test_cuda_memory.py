"""Device memory of the cuda backend (:class:`hologram.backends.cuda.runtime.DeviceMemory`):
the host pool's 96 size classes over driver blocks, against the recording fake driver of
tests/test_cuda_runtime.py. Nothing here touches a GPU: it proves the pool's bookkeeping
and its driver calls, not the driver (docs/cuda.md)."""

from __future__ import annotations

import base64
import gc
import json

import numpy as np
import pytest
from test_cuda_runtime import FakeDriver, fake_gpu, needs_triton  # noqa: F401 (a fixture)

import hologram as hg
from hologram.backends.cuda.runtime import DeviceMemory, DeviceProgram
from hologram.backends.hostmem import CLASS_SIZES, MAX_CLASS_BYTES, size_class
from hologram.errors import DeviceError, HologramError, OutOfMemoryError


def test_requests_are_rounded_to_the_host_pools_classes():
    memory = DeviceMemory(FakeDriver(capacity=1 << 24))
    for nbytes in (1, 256, 257, 320, 321, 1000, 4096, 5000, 3 << 20):
        block = memory.alloc((nbytes,), np.uint8)
        assert block.size == size_class(nbytes)[1] and block.size in CLASS_SIZES
        assert block.nbytes == nbytes and block.size <= max(256, 1.25 * nbytes)
        assert len(memory.driver.memory[block.pointer]) == block.size


def test_a_freed_block_is_reused_by_the_next_request_of_its_class():
    driver = FakeDriver()
    memory = DeviceMemory(driver)
    block = memory.alloc((1000,), np.float32)  # 4000 bytes: the 4096-byte class
    pointer = block.pointer
    del block  # the last reference: the block returns to its free list
    gc.collect()
    assert memory.stats()["cached_bytes"] == 4096 and pointer in driver.memory
    again = memory.alloc((4096,), np.uint8)  # another request of the same class
    assert again.pointer == pointer
    other = memory.alloc((5000,), np.uint8)  # another class: a new block
    assert other.pointer != pointer
    stats = memory.stats()
    assert (stats["pool_hits"], stats["pool_misses"], stats["num_driver_allocs"]) == (1, 2, 2)
    assert stats["num_allocs"] == 3 and stats["num_frees"] == 1


def test_peaks_follow_allocated_and_reserved_and_reset():
    memory = DeviceMemory(FakeDriver())
    a = memory.alloc((10_000,), np.uint8)  # 10240
    b = memory.alloc((20_000,), np.uint8)  # 20480
    memory.free(a)
    stats = memory.stats()
    assert stats["allocated_bytes"] == 20480 and stats["peak_allocated_bytes"] == 30720
    assert stats["reserved_bytes"] == stats["peak_reserved_bytes"] == 30720
    memory.reset_peak_stats()
    stats = memory.stats()
    assert stats["peak_allocated_bytes"] == 20480 and stats["peak_reserved_bytes"] == 30720
    memory.empty_cache()
    memory.reset_peak_stats()
    assert memory.stats()["peak_reserved_bytes"] == 20480
    assert b.end.alive


def test_empty_cache_gives_cached_blocks_back_to_the_driver():
    driver = FakeDriver()
    memory = DeviceMemory(driver)
    live = memory.alloc((300,), np.uint8)
    cached = [memory.alloc((n,), np.uint8) for n in (1000, 3000, 70_000)]
    pointers = [c.pointer for c in cached]
    for c in cached:
        memory.free(c)
    assert all(p in driver.memory for p in pointers)
    released = memory.empty_cache()
    assert released == 1024 + 3072 + 81920 == sum(c.size for c in cached)
    assert not any(p in driver.memory for p in pointers) and live.pointer in driver.memory
    stats = memory.stats()
    assert stats["reserved_bytes"] == stats["allocated_bytes"] == 320
    assert stats["cached_bytes"] == 0 and stats["num_driver_frees"] == 3
    assert memory.empty_cache() == 0


def test_the_cache_stays_within_twice_the_peak():
    """A new block that would make the reserve exceed twice the peak of allocated bytes
    frees cached blocks first, largest class first."""
    driver = FakeDriver(capacity=1 << 24)
    memory = DeviceMemory(driver)
    big = memory.alloc((1 << 20,), np.uint8)
    small = memory.alloc((1 << 12,), np.uint8)
    big_pointer = big.pointer
    memory.free(big)
    memory.free(small)
    memory.reset_peak_stats()  # peak 0: the reserve may be twice the new block
    fresh = memory.alloc((3 << 12,), np.uint8)  # another class: a new block
    # 1 MiB + 4 KiB cached + 12 KiB new > 2 * 12 KiB: the largest goes, the small one fits.
    assert big_pointer not in driver.memory and small.pointer in driver.memory
    assert memory.stats()["reserved_bytes"] == small.size + fresh.size


def test_out_of_memory_frees_the_cache_and_retries_once():
    driver = FakeDriver(capacity=2048)
    memory = DeviceMemory(driver)
    cached = memory.alloc((1024,), np.uint8)
    pointer = cached.pointer
    memory.free(cached)
    # 1024 cached + 1536 new > 2048: the driver refuses, the cache goes, the retry fits.
    block = memory.alloc((1536,), np.uint8)
    assert ("free", pointer) in driver.calls and block.pointer in driver.memory
    stats = memory.stats()
    assert stats["num_oom_retries"] == 1 and stats["reserved_bytes"] == 1536
    with pytest.raises(OutOfMemoryError) as info:  # nothing cached left to free
        memory.alloc((1024,), np.uint8)
    message = str(info.value)
    assert "CUDA_ERROR_OUT_OF_MEMORY" in message and "requested 1024 bytes" in message
    assert "1536 bytes allocated and 1536 reserved" in message
    assert memory.stats()["num_oom_retries"] == 2


def test_the_limit_bounds_allocated_bytes_and_trims_the_cache():
    driver = FakeDriver()
    memory = DeviceMemory(driver, memory_limit=8192)
    a = memory.alloc((4096,), np.uint8)
    with pytest.raises(OutOfMemoryError, match=r"5000 bytes \(a block of 5120\).*limit of "
                                               r"8192 bytes \(4096 allocated\)"):
        memory.alloc((5000,), np.uint8)
    memory.free(a)
    assert memory.stats()["cached_bytes"] == 4096
    memory.set_memory_limit(1024)  # the cache beyond the new limit goes back
    assert memory.stats()["reserved_bytes"] == 0 and memory.memory_limit == 1024
    memory.set_memory_limit(None)
    assert memory.alloc((1 << 16,), np.uint8).size == 1 << 16
    with pytest.raises(HologramError, match=">= 0"):
        memory.set_memory_limit(-1)
    with pytest.raises(HologramError, match="number of bytes"):
        memory.set_memory_limit("1GB")


def test_requests_beyond_the_largest_class_get_a_block_of_their_own():
    driver = FakeDriver(capacity=1 << 40)
    driver.memory = _Sizes()  # track sizes without holding 3.5 GiB of host bytes
    memory = DeviceMemory(driver)
    nbytes = MAX_CLASS_BYTES + 1
    block = memory.alloc((nbytes,), np.uint8)
    assert block.size == size_class(nbytes)[1] >= nbytes
    assert memory.stats()["large_allocs"] == 1
    pointer = block.pointer
    memory.free(block)
    assert pointer not in driver.memory and memory.stats()["reserved_bytes"] == 0


class _Sizes(dict):
    """Fake device memory that records sizes only (for blocks of gigabytes)."""

    def __setitem__(self, pointer, data):
        super().__setitem__(pointer, _Length(len(data)))


class _Length:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def _artifact(*cubins: bytes) -> bytes:
    names = [f"k{i}" for i in range(len(cubins))]
    return json.dumps({
        "program": "p", "params": [0], "interpreted": [], "temps": {"1": 100}, "scratch": {},
        "kernels": [{"name": n, "kernel": i, "grid": 4, "buffers": [0, 1]}
                    for i, n in enumerate(names)],
        "compiled": [{"name": n, "cubin": base64.b64encode(c).decode(),
                      "metadata": {"name": n, "num_warps": 4, "shared": 0}}
                     for n, c in zip(names, cubins)]}).encode()


def test_a_cubin_is_loaded_once_per_context_and_temporaries_return_to_the_pool():
    driver = FakeDriver()
    memory = DeviceMemory(driver)
    artifact = _artifact(b"\x7fELF one", b"\x7fELF two")
    first = DeviceProgram(artifact, driver, memory)
    second = DeviceProgram(artifact, driver, memory)
    assert len([c for c in driver.calls if c[0] == "load"]) == 2  # one per cubin
    assert first.functions == second.functions
    DeviceProgram(artifact, FakeDriver(), DeviceMemory(FakeDriver()))  # another context
    assert len([c for c in driver.calls if c[0] == "load"]) == 2
    assert memory.stats()["allocated_bytes"] == 2 * 256
    del first, second
    gc.collect()
    assert memory.stats()["allocated_bytes"] == 0


@needs_triton
def test_executors_expose_torch_cuda_style_counters(fake_gpu):  # noqa: F811 (the fixture)
    driver = fake_gpu
    with hg.Executor("cuda") as ex:
        assert ex.memory_allocated() == ex.memory_reserved() == 0
        a = ex.from_numpy(np.ones(1000, np.float32))  # 4000 bytes: 4096
        b = ex.allocate((3000,), np.float32)  # 12000 bytes: 12288
        assert ex.memory_allocated() == 4096 + 12288 == ex.max_memory_allocated()
        assert ex.memory_reserved() == ex.max_memory_reserved() == 4096 + 12288
        pointer = b.handle
        b.free()
        del b
        gc.collect()
        assert ex.memory_allocated() == 4096 and ex.max_memory_allocated() == 16384
        c = ex.empty((3000,), np.float32)  # the cached block again
        assert c.handle == pointer and ex.memory_stats()["pool_hits"] == 1
        c.free()
        del c
        gc.collect()
        ex.reset_peak_memory_stats()
        assert ex.max_memory_allocated() == 4096 and ex.max_memory_reserved() == 16384
        assert ex.empty_cache() == 12288 and pointer not in driver.memory
        np.testing.assert_array_equal(a.to_numpy(), np.ones(1000, np.float32))
    assert ex.memory_allocated() == ex.memory_reserved() == 0  # close ends and frees all


def test_host_executors_have_the_same_counters_except_the_reserved_peak():
    with hg.Executor("cpu") as ex:
        buf = ex.allocate((1000,), np.float32)
        assert ex.memory_allocated() == ex.memory_stats()["allocated_bytes"] >= 4000
        assert ex.max_memory_allocated() >= ex.memory_allocated()
        assert ex.memory_reserved() >= ex.memory_allocated()
        with pytest.raises(DeviceError, match="does not count peak_reserved_bytes"):
            ex.max_memory_reserved()
        buf.free()
        ex.reset_peak_memory_stats()
        assert ex.max_memory_allocated() == ex.memory_allocated()
