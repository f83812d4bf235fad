"""WebGPU device memory: storage buffers in the host pool's 96 size classes, reused.

An allocation is a :class:`Allocation` holding a wgpu buffer of its size class (at least
4 bytes, a multiple of 4, as WebGPU requires). When the last reference to an allocation
goes, its buffer returns to the allocator's free list of its class, where the next
allocation of the class takes it. The host cannot see this memory (``host_visible =
False``): buffers are copied in with ``queue.write_buffer`` and out with
``queue.read_buffer`` (which waits for the queued work first).

WebGPU memory has no addresses, so handles are made up: an allocation's
:meth:`Allocator.handle` is its buffer's id (:class:`Block`) shifted left by :data:`SHIFT`
bits, and a handle plus a byte offset below the buffer's size stands for that byte
(:func:`locate` maps it back). So the memory behaves as byte-addressed memory: a PyTorch
storage holds a handle as its data pointer, views add their offsets to it, and
:meth:`WebGpuAllocator.read`, :meth:`~WebGpuAllocator.write` and
:meth:`~WebGpuAllocator.copy` work at any handle (the parts of 4-byte words at the ends are
read, merged and written back, as WebGPU copies whole words only). An executable binds the
allocation and passes the offset to its shaders (``backend._Executable.launch``).
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from typing import Any

import numpy as np

from hologram.backends.base import Allocator
from hologram.backends.hostmem import size_class
from hologram.errors import OutOfMemoryError, ShapeError

from . import device as devices

#: Bits of a handle below the buffer's id: a byte offset (a storage binding is at most
#: 4 GiB, so every byte of a buffer has a handle of its own).
SHIFT = 32
_ids = itertools.count(1)


class Block:
    """One wgpu buffer of the allocators', under an id for as long as it exists: a freed
    allocation's buffer keeps its id (and its handles) in the free list and in the next
    allocation that takes it, as a freed block of GPU memory keeps its address."""

    __slots__ = ("buffer", "id")

    def __init__(self, buffer: Any):
        self.buffer, self.id = buffer, next(_ids)
        _blocks[self.id] = self


_blocks: dict[int, Block] = {}  # every buffer not destroyed, by id


class Allocation:
    """One device allocation: ``nbytes`` asked for, in ``block`` (its class's size)."""

    __slots__ = ("__weakref__", "block", "buffer", "id", "nbytes")

    def __init__(self, block: Block, nbytes: int):
        self.block, self.nbytes = block, nbytes
        self.buffer, self.id = block.buffer, block.id

    def __repr__(self) -> str:
        return f"<webgpu allocation of buffer {self.id}: {self.nbytes} bytes>"


def locate(handle: int) -> tuple[Block, int]:
    """The buffer behind ``handle``, and the byte offset into it."""
    block = _blocks.get(handle >> SHIFT)
    offset = handle & ((1 << SHIFT) - 1)
    if block is None or offset > block.buffer.size:
        raise ShapeError(f"webgpu: handle {handle:#x} is not in a webgpu buffer (memory of "
                         "another executor's backend, or released by empty_cache)")
    return block, offset


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
        self._free: dict[int, list[Block]] = {}
        self._lock = threading.Lock()
        self._stats = {"allocated_bytes": 0, "reserved_bytes": 0, "peak_allocated_bytes": 0,
                       "pool_hits": 0, "pool_misses": 0, "num_classes": 96}

    # --- allocations ------------------------------------------------------------------
    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> Allocation:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize  # (np.prod: ~5 µs more)
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
            block = free.pop() if free else None
            self._stats["pool_hits" if block is not None else "pool_misses"] += 1
        if block is None:
            wgpu = devices.wgpu_module()
            usage = (wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
                     | wgpu.BufferUsage.COPY_DST)
            block = Block(self.dev.device.create_buffer(size=cbytes, usage=usage))
            with self._lock:
                self._stats["reserved_bytes"] += cbytes
        allocation = Allocation(block, nbytes)
        with self._lock:
            s = self._stats
            s["allocated_bytes"] += cbytes
            s["peak_allocated_bytes"] = max(s["peak_allocated_bytes"], s["allocated_bytes"])
        weakref.finalize(allocation, self._release, block, cbytes)
        return allocation

    def _release(self, block: Block, cbytes: int) -> None:
        with self._lock:
            self._stats["allocated_bytes"] -= cbytes
            self._free.setdefault(cbytes, []).append(block)

    def handle(self, allocation: Allocation) -> int:
        return allocation.id << SHIFT

    # --- copies -----------------------------------------------------------------------
    def copy_in(self, allocation: Allocation, source: np.ndarray) -> None:
        n = source.nbytes
        if n > allocation.nbytes:
            raise ShapeError(f"webgpu copy_in: {n} bytes into an allocation of "
                             f"{allocation.nbytes}")
        self._write(allocation.buffer, 0, np.ascontiguousarray(source).reshape(-1))

    def copy_out(self, allocation: Allocation, destination: np.ndarray) -> None:
        self._read(allocation.buffer, 0, destination)

    def write(self, handle: int, source: np.ndarray) -> None:
        block, offset = locate(handle)
        self._write(block.buffer, offset, source.reshape(-1))

    def read(self, handle: int, destination: np.ndarray) -> None:
        block, offset = locate(handle)
        self._read(block.buffer, offset, destination)

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        if not nbytes:
            return
        (dst, at), (src, start) = locate(destination), locate(source)
        # WebGPU copies whole words only, and between two buffers: else through the host
        if at % 4 or start % 4 or nbytes % 4 or src is dst:
            super().copy(destination, source, nbytes)
            return
        encoder = self.dev.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(src.buffer, start, dst.buffer, at, nbytes)
        self.dev.queue.submit([encoder.finish()])

    def _write(self, buffer: Any, offset: int, source: np.ndarray) -> None:
        """``source``'s bytes into ``buffer`` at byte ``offset``: the words they cover,
        those at the ends merged with the bytes already there."""
        data = source.view(np.uint8)
        n = data.nbytes
        if not n:
            return
        start, stop = offset - offset % 4, padded(offset + n)
        if start != offset or stop != offset + n:
            words = np.empty(stop - start, np.uint8)
            ends = [start] if stop - start == 4 else [start, stop - 4]
            for end in ends:  # (the words partly written)
                words[end - start:end - start + 4] = np.frombuffer(
                    self.dev.queue.read_buffer(buffer, end, 4), np.uint8)
            words[offset - start:offset - start + n] = data
            data = words
        self.dev.queue.write_buffer(buffer, start, data)

    def _read(self, buffer: Any, offset: int, destination: np.ndarray) -> None:
        out = destination.reshape(-1).view(np.uint8)
        n = out.nbytes
        if not n:
            return
        start = offset - offset % 4
        raw = self.dev.queue.read_buffer(buffer, start, padded(offset + n) - start)
        out[:] = np.frombuffer(raw, np.uint8, n, offset - start)

    def synchronize(self) -> None:
        sync(self.dev)

    # --- accounting -------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._stats, adapter=self.dev.summary,
                        flushes_subnormals=self.dev.flushes_subnormals)

    def reset_peak_stats(self) -> None:
        with self._lock:
            self._stats["peak_allocated_bytes"] = self._stats["allocated_bytes"]

    def empty_cache(self) -> int:
        with self._lock:
            released = sum(size * len(bufs) for size, bufs in self._free.items())
            blocks = [b for bufs in self._free.values() for b in bufs]
            self._free.clear()
            for b in blocks:
                del _blocks[b.id]
            self._stats["reserved_bytes"] -= released
        for b in blocks:
            b.buffer.destroy()
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
