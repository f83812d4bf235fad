"""The memory of the cuda backend's emulation (``HOLOGRAM_CUDA_EMULATE=1``): host memory
behind device-style handles, so that host code which would dereference GPU memory fails
here too, on a machine without a GPU.

The blocks are the host pool's (:class:`~hologram.backends.hostmem.Pool`, one per
allocator: its size classes, counters and limit), but the allocator says what a GPU's
does: ``host_visible`` is False (no :meth:`~EmulatedMemory.view`; buffers are copied in and
out, as on :class:`~hologram.backends.cuda.runtime.DeviceMemory`), and a handle is not a
host address: it is the block's host address plus :data:`TAG`. Handles keep their
arithmetic (a handle plus a byte offset addresses inside the allocation, as a device
pointer does), and only this module and the emulated executable
(:func:`untag`, in :class:`hologram.backends.cuda.backend._Emulated`) turn them back into
host addresses. A host read or write through a handle faults (SIGSEGV) instead of
silently working.

DLPack is refused both ways: the memory is neither host memory a consumer may read nor
CUDA memory (``__dlpack_device__`` says kDLExtDev, so no consumer takes it for a GPU's).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from hologram.backends.base import Allocator, contiguous
from hologram.backends.hostmem import Lease, Pool
from hologram.errors import DeviceError, ShapeError

#: Added to a block's host address to make its handle. User-space addresses stay below
#: 2**47 (x86-64 with 4-level paging, Linux's default mmap range with 5-level paging
#: too; aarch64 with 48-bit or 52-bit virtual addresses), so a tagged handle is never a
#: mapped host address: on x86-64 it is non-canonical (4-level paging) or above every
#: mapping (5-level), on aarch64 bit 55 selects the kernel's half of the address space.
#: Bit 55 is below aarch64's top-byte-ignore (bits 56-63), which would make a higher tag
#: silently work there.
TAG = 1 << 55


def untag(handle: int) -> int:
    """The host address behind an emulated-memory handle (0 stays 0: no memory).
    :class:`~hologram.errors.DeviceError` for anything else: a host address handed to the
    emulated device is the bug this memory exists to catch."""
    if not handle:
        return 0
    if handle >> 55 != 1:
        raise DeviceError(f"cuda (emulated): {handle:#x} is not an address of emulated device "
                          "memory (a host address? device code takes allocator handles)")
    return handle - TAG


class EmulatedBlock:
    """One allocation: ``pointer`` (its handle: the host address plus :data:`TAG`) and
    ``nbytes`` asked for. The pool block returns when the last reference goes or
    :meth:`EmulatedMemory.free` ends it."""

    __slots__ = ("lease", "nbytes", "pointer")

    def __init__(self, lease: Lease, nbytes: int):
        self.lease: Lease | None = lease
        self.nbytes = nbytes
        self.pointer = lease.address + TAG

    def __repr__(self) -> str:
        return f"<emulated cuda block {self.pointer:#x}: {self.nbytes} bytes>"


class EmulatedMemory(Allocator):
    """The emulated cuda backend's memory: host pool blocks behind tagged handles (see the
    module docstring). Counters, limit and cache are the pool's."""

    device = "cuda"
    dlpack_device_type = 12  # kDLExtDev: not CUDA memory, whatever ``device`` says
    host_visible = False

    def __init__(self, memory_limit: int | None = None):
        self.pool = Pool(memory_limit)

    # --- allocations --------------------------------------------------------------------
    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> EmulatedBlock:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        lease = self.pool.lease(max(nbytes, 1))  # a handle is never 0, as on the GPU
        if lease.address >> 55:
            raise DeviceError(f"cuda (emulated): the host address {lease.address:#x} is not "
                              "below 2**55; handles cannot be tagged on this machine")
        return EmulatedBlock(lease, nbytes)

    def free(self, allocation: EmulatedBlock) -> None:
        """End ``allocation`` now: its block returns to the pool."""
        if allocation.lease is None:
            raise DeviceError(f"cuda (emulated): {allocation!r} was already returned to the "
                              "pool (freed twice?)")
        allocation.lease = None

    def handle(self, allocation: EmulatedBlock) -> int:
        return allocation.pointer

    # --- copies -------------------------------------------------------------------------
    def _address(self, allocation: EmulatedBlock, nbytes: int, what: str) -> int:
        if allocation.lease is None or nbytes > allocation.nbytes:
            raise ShapeError(f"cuda (emulated): {what} of {nbytes} bytes does not fit "
                             f"{allocation!r}" + (", which was freed"
                                                  if allocation.lease is None else ""))
        return allocation.lease.address

    def copy_in(self, allocation: EmulatedBlock, source: np.ndarray) -> None:
        source = np.ascontiguousarray(source)
        address = self._address(allocation, source.nbytes, "copy in")
        if source.nbytes:
            ctypes.memmove(address, source.ctypes.data, source.nbytes)

    def copy_out(self, allocation: EmulatedBlock, destination: np.ndarray) -> None:
        contiguous(destination, "cuda (emulated) copy_out", writable=True)
        address = self._address(allocation, destination.nbytes, "copy out")
        if destination.nbytes:
            ctypes.memmove(destination.ctypes.data, address, destination.nbytes)

    def write(self, handle: int, source: np.ndarray) -> None:
        contiguous(source, "cuda (emulated) write")
        if source.nbytes:
            ctypes.memmove(untag(handle), source.ctypes.data, source.nbytes)

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        if nbytes:
            ctypes.memmove(untag(destination), untag(source), nbytes)

    def read(self, handle: int, destination: np.ndarray) -> None:
        contiguous(destination, "cuda (emulated) read", writable=True)
        if destination.nbytes:
            ctypes.memmove(destination.ctypes.data, untag(handle), destination.nbytes)

    # --- DLPack: refused ----------------------------------------------------------------
    def export_dlpack(self, allocation: EmulatedBlock, *args: Any, **kwargs: Any) -> Any:
        raise DeviceError("__dlpack__: the emulated cuda backend's memory "
                          "(HOLOGRAM_CUDA_EMULATE=1) is no GPU's and not shared with DLPack "
                          "consumers; export buf.to_numpy() (a host copy) instead")

    def import_dlpack(self, producer: Any) -> Any:
        raise DeviceError(f"from_dlpack: the emulated cuda backend (HOLOGRAM_CUDA_EMULATE=1) "
                          f"keeps buffers in emulated device memory, which shares no "
                          f"{type(producer).__name__}'s memory; copy it in with "
                          "ex.from_numpy(...)")

    # --- accounting: the pool's ---------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The pool's counters (:meth:`hologram.backends.hostmem.Pool.stats`)."""
        return self.pool.stats()

    def empty_cache(self) -> int:
        return self.pool.empty_cache()

    def reset_peak_stats(self) -> None:
        self.pool.reset_peak_stats()

    @property
    def memory_limit(self) -> int | None:
        return self.pool.memory_limit

    def set_memory_limit(self, limit: int | None) -> None:
        self.pool.set_memory_limit(limit)
