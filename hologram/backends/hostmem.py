"""Host memory: the pool of the host backends (cpu, interp), 96 size classes, blocks from
anonymous mmap, reused when freed.

It lives with the backends because it is their :class:`~hologram.backends.base.Allocator`
(:meth:`Backend.allocator <hologram.backends.base.Backend.allocator>` returns a
:class:`Pool`); the runtime re-exports :class:`Pool` and :func:`default_pool`
(``hologram.runtime.Pool``).

Every request is rounded up to one of :data:`NUM_CLASSES` (96) size classes, four per power
of two: ``2**k * (1, 1.25, 1.5, 1.75)`` for ``k = 8 .. 31``, that is 256 B, 320 B, 384 B,
448 B, 512 B, ... 2 GiB, 2.5 GiB, 3 GiB, 3.5 GiB (:data:`CLASS_SIZES`). Above 256 B,
rounding adds less than 25% to a request (under 20% of the block). A freed block goes back
to its class's free list and the next request of that class gets it back, without a system
call and without fresh page faults, which is what makes large elementwise outputs cheap.

Promises:

* allocate and free are O(1): the class index is arithmetic on the size, a free list is a
  stack, and no search happens on either path (occasional trimming, below, is amortized
  O(1): each block it returns to the OS was mapped once);
* thread-safe: the pool's state lives in native code (``hologram/csrc/pool.c``) whose
  functions run under the GIL and never call back into Python midway;
* grows on demand; memory comes from anonymous private mmap and is page aligned, except
  classes of up to ``SLAB_BYTES // 4`` (16 KiB with 4 KiB pages), which are carved from
  ``SLAB_BYTES`` slabs and are aligned to 64 bytes (every class size is a multiple of 64);
* mappings of 2 MiB and more ask for transparent huge pages (``madvise(MADV_HUGEPAGE)``)
  where the OS offers it;
* requests beyond the largest class (3.5 GiB) get their own mapping and give it back to the
  OS when freed;
* the cache stays proportionate: when a new mapping would make ``reserved_bytes`` exceed
  twice ``peak_allocated_bytes``, or the peak and :data:`CACHE_SLACK` (64 MiB) where that
  is more, cached blocks (largest class first) go back to the OS first. (Without the
  slack, blocks taken in turn could pass twice the peak: two compiled programs' scratch
  arenas of 4 and 3 MiB next to 1.5 MiB of smaller ones did, and every call mapped its
  arena afresh.) Slabs go back only when all their blocks are free, by :meth:`Pool.empty_cache` or
  under a memory limit, so small-block slabs can hold the reserve above that bound;
* an optional memory limit bounds ``allocated_bytes``; a request that would pass it raises
  :class:`~hologram.errors.OutOfMemoryError`, and cached blocks are released before the
  pool maps more than the limit.

:meth:`Pool.empty` returns a plain C-contiguous, writable ``numpy.ndarray``. Its ``base`` is
a :class:`Lease` that owns the block; views keep the lease alive, and when the last array
or view goes, CPython's reference counting frees the block at once.
"""

from __future__ import annotations

import ctypes
import math
import operator
from collections.abc import Iterable
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from hologram._native import CACHE_SLACK, NUM_CLASSES, SLAB_BYTES, Lease, PoolCore
from hologram._native import size_class as _size_class
from hologram.backends.base import Allocator, contiguous
from hologram.errors import DTypeError, HologramError, OutOfMemoryError, ShapeError

__all__ = [
    "CACHE_SLACK",
    "CLASS_SIZES",
    "MAX_CLASS_BYTES",
    "MIN_CLASS_BYTES",
    "NUM_CLASSES",
    "SLAB_BYTES",
    "Lease",
    "Pool",
    "address",
    "default_pool",
    "size_class",
]

_MIN_SHIFT = 8  # the smallest class is 2**8 = 256 B
_OCTAVES = NUM_CLASSES // 4
#: Class ``4*(k-8) + j`` holds ``(4 + j) * 2**(k-2)`` bytes, i.e. ``2**k * (1 + j/4)``.
CLASS_SIZES: tuple[int, ...] = tuple(
    (4 + step) << (octave - 2)
    for octave in range(_MIN_SHIFT, _MIN_SHIFT + _OCTAVES)
    for step in range(4)
)
MIN_CLASS_BYTES = CLASS_SIZES[0]  # 256 B
MAX_CLASS_BYTES = CLASS_SIZES[-1]  # 3.5 GiB

# SLAB_BYTES (the native core's, max(64 KiB, 16 pages)): small classes are carved from
# slabs of this size so that a 256 B array does not cost a page and a mapping. Every class
# above ``SLAB_BYTES // 4`` is a multiple of the page size (it is at least four pages and a
# multiple of a quarter of its power of two), so a block of its own wastes nothing.


def size_class(nbytes: int) -> tuple[int, int]:
    """The class serving a request of ``nbytes``: ``(index, class_bytes)``.

    ``class_bytes`` is the smallest class size >= ``nbytes`` (``nbytes <= 256`` gives class
    0). Requests beyond :data:`MAX_CLASS_BYTES` give ``(-1, nbytes rounded up to a page)``:
    they are served by a mapping of their own.
    """
    if nbytes < 0:
        raise ShapeError(f"size_class: nbytes must be >= 0, got {nbytes}")
    return _size_class(nbytes)


def address(array: np.ndarray) -> int:
    """The host address of ``array``'s first element (what host executables launch on):
    the one helper for it (:meth:`Pool.handle` is this function)."""
    try:  # the buffer protocol is ~3x faster than array.ctypes.data
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError):  # read-only or empty
        return array.ctypes.data


def _fmt(nbytes: int) -> str:
    """``41943040`` -> ``'40.0 MiB (41,943,040 B)'``: readable and exact."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            short = f"{nbytes} B" if unit == "B" else f"{value:.1f} {unit}"
            break
        value /= 1024
    return short if unit == "B" else f"{short} ({nbytes:,} B)"


def _shape(shape: int | Iterable[int]) -> tuple[int, ...]:
    try:
        if type(shape) is tuple or isinstance(shape, Iterable):  # the first test is cheap
            dims = tuple(map(operator.index, shape))
        else:
            dims = (operator.index(shape),)
    except TypeError:
        raise ShapeError(f"Pool.empty: shape must be an int or ints, got {shape!r}") from None
    if dims and min(dims) < 0:
        raise ShapeError(f"Pool.empty: negative dimension in shape {dims}")
    return dims


class Pool(Allocator):
    """A host memory pool; see the module docstring for what it promises. It is the
    :class:`~hologram.backends.base.Allocator` of the host backends (cpu, interp): an
    allocation is the array :meth:`empty` returns, its handle the array's address.

    ``memory_limit`` (bytes, or None for none) is the same as calling
    :meth:`set_memory_limit` after construction.
    """

    def __init__(self, memory_limit: int | None = None):
        # The free lists, slabs and counters (hologram/csrc/pool.c). Its functions run
        # under the GIL and never call back into Python midway, which makes them atomic:
        # the GIL is the pool's lock, and a fork never sees a half-updated pool.
        self._core = PoolCore()
        self._limit: int | None = None
        if memory_limit is not None:
            self.set_memory_limit(memory_limit)

    # -- public API ------------------------------------------------------------------------

    def empty(self, shape: int | Iterable[int], dtype: DTypeLike = np.float64) -> np.ndarray:
        """An uninitialized C-contiguous, writable array viewing a pool block.

        Like ``numpy.empty``: the contents are whatever the block held. The block returns
        to the pool when the array and every view of it are gone. A zero-size request
        returns an ordinary empty array and does not touch the pool.
        """
        dims = _shape(shape)
        dt = np.dtype(dtype)
        if dt.subdtype is not None:  # like numpy: (float32, 3) appends its shape
            dt, sub = dt.subdtype
            dims = dims + sub
        if dt.hasobject:
            raise DTypeError(
                f"Pool.empty: dtype {dt} holds Python objects; pool memory is raw bytes, "
                "use numpy.empty for object arrays"
            )
        return self.alloc(dims, dt)

    # -- the Allocator contract (host memory: copies are NumPy copies) ---------------------

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """:meth:`empty` for a shape tuple and a NumPy dtype already checked (the SDK's
        path for every op output)."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            return np.empty(shape, dtype)
        # The array over the lease's buffer: exact for structured (padded) dtypes too.
        return np.ndarray(shape, dtype, self.lease(nbytes))

    def handle(self, allocation: np.ndarray) -> int:
        """The allocation's host address: its block's, for this pool's arrays (cheaper
        than reading the array's), else :func:`address`."""
        memory = allocation.base
        if type(memory) is Lease:
            return memory.address
        return address(allocation)

    def view(self, allocation: np.ndarray) -> np.ndarray:
        return allocation

    def copy_in(self, allocation: np.ndarray, source: np.ndarray) -> None:
        raw = source.reshape(-1).view(np.uint8)
        np.copyto(allocation.reshape(-1).view(np.uint8)[: raw.size], raw)

    def copy_out(self, allocation: np.ndarray, destination: np.ndarray) -> None:
        raw = destination.reshape(-1).view(np.uint8)
        np.copyto(raw, allocation.reshape(-1).view(np.uint8)[: raw.size])

    def write(self, handle: int, source: np.ndarray) -> None:
        """Copy ``source`` (C-contiguous) to the host address ``handle``."""
        contiguous(source, "Pool.write")
        if source.nbytes:
            ctypes.memmove(handle, source.ctypes.data, source.nbytes)

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        """Copy ``nbytes`` from host address ``source`` to ``destination``."""
        if nbytes:
            ctypes.memmove(destination, source, nbytes)

    def read(self, handle: int, destination: np.ndarray) -> None:
        """Copy ``destination.nbytes`` bytes at the host address ``handle`` into
        ``destination`` (C-contiguous, writable)."""
        contiguous(destination, "Pool.read", writable=True)
        if destination.nbytes:
            ctypes.memmove(destination.ctypes.data, handle, destination.nbytes)

    @property
    def core(self) -> PoolCore:
        """The native pool behind :meth:`lease`: its ``alloc(nbytes)`` is a lease, or None
        at the limit (MemoryError when the system refuses), without lease's messages. For
        native callers (hologram/csrc/native_api.h) that send a refusal to a path which
        calls :meth:`lease`."""
        return self._core

    def lease(self, nbytes: int) -> Lease:
        """A block of at least ``nbytes`` (> 0) bytes, owned by the returned
        :class:`Lease`: its ``address`` is valid until the lease and every array viewing
        it (NumPy views it through the buffer protocol) are gone, which returns the block.
        ``lease.nbytes`` is the block's size (its class size)."""
        try:
            lease = self._core.alloc(nbytes)
        except MemoryError as exc:
            raise OutOfMemoryError(
                f"Pool: {exc} for a request of {_fmt(nbytes)}; {_fmt(self._core.allocated)} "
                f"is allocated by this pool and {_fmt(self._core.reserved)} reserved. Free "
                "arrays you no longer need or call empty_cache()."
            ) from None
        if lease is None:
            stats = self._core.stats()
            raise OutOfMemoryError(self._limit_message(nbytes, size_class(nbytes)[1],
                                                       stats["allocated_bytes"],
                                                       self._limit))
        return lease

    def stats(self) -> dict[str, Any]:
        """Counters, in bytes or counts.

        ``allocated_bytes``: live blocks, class-rounded; ``requested_bytes``: what the
        callers of those blocks asked for; ``reserved_bytes``: everything mapped from the
        OS (live, cached and slab remainder); ``cached_bytes``: free blocks kept for reuse;
        ``peak_allocated_bytes``; ``num_classes``; ``pool_hits`` / ``pool_misses``: class
        requests served from / not from a free list; ``large_allocs``: requests beyond the
        largest class; ``num_allocs`` / ``num_frees``: all blocks handed out / returned
        (zero-size requests are not counted); ``memory_limit``: bytes or None.
        """
        stats = self._core.stats()
        stats["num_classes"] = NUM_CLASSES
        stats["memory_limit"] = self._limit
        return stats

    def empty_cache(self) -> int:
        """Return every cached block, and every slab whose blocks are all free, to the OS.

        Live arrays are untouched. Returns the number of bytes released.
        """
        return self._core.empty_cache()

    def set_memory_limit(self, limit: int | None) -> None:
        """Bound ``allocated_bytes`` to ``limit`` bytes (None: no bound).

        Takes effect for the next request; arrays already handed out stay valid even above
        a lowered limit. Cached blocks beyond the limit are released now.
        """
        if limit is not None:
            try:
                limit = operator.index(limit)
            except TypeError:
                raise HologramError(
                    f"set_memory_limit: expected a number of bytes or None, got {limit!r}"
                ) from None
            if limit < 0:
                raise HologramError(f"set_memory_limit: limit must be >= 0, got {limit}")
        self._core.set_limit(limit)
        self._limit = limit

    @property
    def memory_limit(self) -> int | None:
        """The current limit in bytes, or None."""
        return self._limit

    def reset_peak_stats(self) -> None:
        """Start ``peak_allocated_bytes`` again from the current ``allocated_bytes``."""
        self._core.reset_peak()

    def __repr__(self) -> str:
        return (
            f"<hologram Pool allocated={_fmt(self._core.allocated)} "
            f"reserved={_fmt(self._core.reserved)} limit={self._limit}>"
        )

    def _limit_message(self, nbytes: int, cbytes: int, used: int, limit: int) -> str:
        return (
            f"Pool: cannot allocate {_fmt(nbytes)} (rounded to {_fmt(cbytes)}): "
            f"{_fmt(used)} is already allocated and the memory limit is {_fmt(limit)}. "
            "Free arrays you no longer need, raise the limit with "
            "pool.set_memory_limit(nbytes), or remove it with pool.set_memory_limit(None)."
        )


_DEFAULT = Pool()


def default_pool() -> Pool:
    """The process-wide pool, used by whatever has no pool of its own."""
    return _DEFAULT
