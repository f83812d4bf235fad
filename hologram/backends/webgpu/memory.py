"""WebGPU device memory: storage buffers in the host pool's 96 size classes, reused.

An allocation is a :class:`Allocation` holding a wgpu buffer of its size class (at least
4 bytes, a multiple of 4, as WebGPU requires); its :meth:`Allocator.handle` is a small
integer that executables map back to the buffer (:func:`lookup`). When the last
reference to an allocation goes, its buffer returns to the allocator's free list of its
class, where the next allocation of the class takes it. The host cannot see this memory
(``host_visible = False``): buffers are copied in with ``queue.write_buffer`` and out with
``queue.read_buffer`` (which waits for the queued work first).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

import numpy as np

from hologram.backends.base import Allocator
from hologram.backends.hostmem import size_class
from hologram.errors import OutOfMemoryError, ShapeError

from . import device as devices

_ids = itertools.count(1)
_live: weakref.WeakValueDictionary[int, Allocation] = weakref.WeakValueDictionary()


class Allocation:
    """One device allocation: ``nbytes`` asked for, in ``buffer`` (its class's size)."""

    __slots__ = ("__weakref__", "buffer", "id", "nbytes")

    def __init__(self, buffer: Any, nbytes: int):
        self.buffer, self.nbytes, self.id = buffer, nbytes, next(_ids)
        _live[self.id] = self

    def __repr__(self) -> str:
        return f"<webgpu allocation {self.id}: {self.nbytes} bytes>"


def lookup(handle: int) -> Allocation:
    """The live allocation behind ``handle``."""
    try:
        return _live[handle]
    except KeyError:
        raise ShapeError(f"webgpu: handle {handle} is not a live webgpu allocation (a buffer "
                         "of another executor's backend, or one already freed)") from None


def padded(nbytes: int) -> int:
    return max(4, -(-nbytes // 4) * 4)


class WebGpuAllocator(Allocator):
    """Device memory of one executor, on the process's device for backend ``kind``."""

    device = "webgpu"
    dlpack_device_type = 15  # kDLWebGPU
    host_visible = False

    def __init__(self, kind: str = "webgpu", memory_limit: int | None = None):
        self.kind = kind
        self.dev = devices.get(kind)
        self._limit = memory_limit
        self._free: dict[int, list[Any]] = {}
        self._lock = threading.Lock()
        self._stats = {"allocated_bytes": 0, "reserved_bytes": 0, "peak_allocated_bytes": 0,
                       "pool_hits": 0, "pool_misses": 0, "num_classes": 96}

    # --- allocations ------------------------------------------------------------------
    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> Allocation:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        binding = self.dev.limits.get("max-storage-buffer-binding-size", 1 << 27)
        if nbytes > binding:
            raise OutOfMemoryError(
                f"webgpu: a buffer of shape {list(shape)} {np.dtype(dtype)} is {nbytes} bytes, "
                f"more than this adapter's storage-binding limit of {binding} bytes "
                f"(max-storage-buffer-binding-size, {self.dev.summary}); split the tensor or "
                "use the cpu backend")
        cbytes = padded(nbytes) if nbytes < 256 else size_class(nbytes)[1]
        cbytes = min(max(cbytes, padded(nbytes)), max(binding, padded(nbytes)))
        with self._lock:
            if self._limit is not None and self._stats["allocated_bytes"] + cbytes > self._limit:
                raise OutOfMemoryError(
                    f"webgpu: allocating {nbytes} bytes would pass the executor's memory limit "
                    f"of {self._limit} bytes ({self._stats['allocated_bytes']} in use); free "
                    "buffers or raise the limit (set_memory_limit)")
            free = self._free.get(cbytes)
            buffer = free.pop() if free else None
            self._stats["pool_hits" if buffer is not None else "pool_misses"] += 1
        if buffer is None:
            wgpu = devices.wgpu_module()
            usage = (wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
                     | wgpu.BufferUsage.COPY_DST)
            buffer = self.dev.device.create_buffer(size=cbytes, usage=usage)
            with self._lock:
                self._stats["reserved_bytes"] += cbytes
        allocation = Allocation(buffer, nbytes)
        with self._lock:
            s = self._stats
            s["allocated_bytes"] += cbytes
            s["peak_allocated_bytes"] = max(s["peak_allocated_bytes"], s["allocated_bytes"])
        weakref.finalize(allocation, self._release, buffer, cbytes)
        return allocation

    def _release(self, buffer: Any, cbytes: int) -> None:
        with self._lock:
            self._stats["allocated_bytes"] -= cbytes
            self._free.setdefault(cbytes, []).append(buffer)

    def handle(self, allocation: Allocation) -> int:
        return allocation.id

    # --- copies -----------------------------------------------------------------------
    def copy_in(self, allocation: Allocation, source: np.ndarray) -> None:
        data = np.ascontiguousarray(source).reshape(-1).view(np.uint8)
        n = data.nbytes
        if n == 0:
            return
        if n > allocation.nbytes:
            raise ShapeError(f"webgpu copy_in: {n} bytes into an allocation of "
                             f"{allocation.nbytes}")
        whole = n - n % 4
        queue = self.dev.queue
        if whole:
            queue.write_buffer(allocation.buffer, 0, data[:whole])
        if n % 4:  # WebGPU writes whole words: keep the bytes after the source's end
            tail = bytearray(queue.read_buffer(allocation.buffer, whole, 4))
            tail[: n % 4] = data[whole:].tobytes()
            queue.write_buffer(allocation.buffer, whole, bytes(tail))

    def copy_out(self, allocation: Allocation, destination: np.ndarray) -> None:
        out = destination.reshape(-1).view(np.uint8)
        n = out.nbytes
        if n == 0:
            return
        raw = self.dev.queue.read_buffer(allocation.buffer, 0, padded(n))
        out[:] = np.frombuffer(raw, np.uint8, n)

    def synchronize(self) -> None:
        sync(self.dev)

    # --- accounting -------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._stats, adapter=self.dev.summary,
                        flushes_subnormals=self.dev.flushes_subnormals)

    def empty_cache(self) -> int:
        with self._lock:
            released = sum(size * len(bufs) for size, bufs in self._free.items())
            buffers = [b for bufs in self._free.values() for b in bufs]
            self._free.clear()
            self._stats["reserved_bytes"] -= released
        for b in buffers:
            b.destroy()
        return released

    @property
    def memory_limit(self) -> int | None:
        return self._limit

    def set_memory_limit(self, limit: int | None) -> None:
        self._limit = limit


_sync_buffers: dict[str, Any] = {}


def sync(dev: devices.Device) -> None:
    """Wait for every submitted command of ``dev``'s queue. wgpu-py 0.32's
    ``on_submitted_work_done_sync`` fails (a cffi TypeError), so this reads 4 bytes of a
    buffer back, which waits for the queue."""
    buffer = _sync_buffers.get(dev.kind)
    if buffer is None:
        wgpu = devices.wgpu_module()
        buffer = dev.device.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC
                                          | wgpu.BufferUsage.COPY_DST)
        _sync_buffers[dev.kind] = buffer
    dev.queue.read_buffer(buffer, 0, 4)
