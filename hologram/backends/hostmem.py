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
* thread-safe: one lock per pool, held only for the list and counter updates; system calls
  (mmap, munmap, madvise) run outside it;
* grows on demand; memory comes from anonymous private mmap and is page aligned, except
  classes of up to ``SLAB_BYTES // 4`` (16 KiB with 4 KiB pages), which are carved from
  ``SLAB_BYTES`` slabs and are aligned to 64 bytes (every class size is a multiple of 64);
* mappings of 2 MiB and more ask for transparent huge pages (``madvise(MADV_HUGEPAGE)``)
  where the OS offers it;
* requests beyond the largest class (3.5 GiB) get their own mapping and give it back to the
  OS when freed;
* the cache stays proportionate: when a new mapping would make ``reserved_bytes`` exceed
  twice ``peak_allocated_bytes``, cached blocks (largest class first) go back to the OS
  first. Slabs go back only when all their blocks are free, by :meth:`Pool.empty_cache` or
  under a memory limit, so small-block slabs can hold the reserve above that bound;
* an optional memory limit bounds ``allocated_bytes``; a request that would pass it raises
  :class:`~hologram.errors.OutOfMemoryError`, and cached blocks are released before the
  pool maps more than the limit.

:meth:`Pool.empty` returns a plain C-contiguous, writable ``numpy.ndarray``. Its ``base`` is
a small lease object that owns the block; views keep the lease alive, and when the last
array or view goes, CPython's reference counting frees the block at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import operator
import os
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from hologram.backends.base import Allocator
from hologram.errors import DTypeError, HologramError, OutOfMemoryError, ShapeError

__all__ = [
    "CLASS_SIZES",
    "MAX_CLASS_BYTES",
    "MIN_CLASS_BYTES",
    "NUM_CLASSES",
    "SLAB_BYTES",
    "Pool",
    "address",
    "default_pool",
    "size_class",
]

NUM_CLASSES = 96
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

_PAGE = mmap.PAGESIZE
_HUGE_PAGE = 2 << 20
#: Small classes are carved from slabs of this size so that a 256 B array does not cost a
#: page and a mapping. Every class above ``SLAB_BYTES // 4`` is a multiple of the page size
#: (it is at least four pages and a multiple of a quarter of its power of two), so a block
#: of its own wastes nothing.
SLAB_BYTES = max(64 << 10, 16 * _PAGE)
_NUM_SLAB_CLASSES = sum(1 for size in CLASS_SIZES if size <= SLAB_BYTES // 4)

# Private, not shared: shared anonymous memory is shmem, where MADV_HUGEPAGE does not apply.
# Windows has no flags argument; mmap(-1, n) is private anonymous memory there anyway.
_MAP_KWARGS: dict[str, int] = {"flags": mmap.MAP_PRIVATE} if hasattr(mmap, "MAP_PRIVATE") else {}
_MADV_HUGEPAGE: int | None = getattr(mmap, "MADV_HUGEPAGE", None)


def size_class(nbytes: int) -> tuple[int, int]:
    """The class serving a request of ``nbytes``: ``(index, class_bytes)``.

    ``class_bytes`` is the smallest class size >= ``nbytes`` (``nbytes <= 256`` gives class
    0). Requests beyond :data:`MAX_CLASS_BYTES` give ``(-1, nbytes rounded up to a page)``:
    they are served by a mapping of their own.
    """
    if nbytes <= MIN_CLASS_BYTES:
        if nbytes < 0:
            raise ShapeError(f"size_class: nbytes must be >= 0, got {nbytes}")
        return 0, MIN_CLASS_BYTES
    # n - 1 lies in [2**octave, 2**(octave+1)); its top three bits (4..7) name the quarter
    # below the class, so the class is one quarter above: (step + 1) * 2**(octave-2) >= n.
    m = nbytes - 1
    octave = m.bit_length() - 1
    shift = octave - 2
    step = m >> shift
    index = 4 * (octave - _MIN_SHIFT) + step - 3
    if index >= NUM_CLASSES:
        return -1, -(-nbytes // _PAGE) * _PAGE
    return index, (step + 1) << shift


def address(array: np.ndarray) -> int:
    """The host address of ``array``'s first element (what host executables launch on):
    the one helper for it (:meth:`Pool.handle` is this function)."""
    try:  # the buffer protocol is ~3x faster than array.ctypes.data
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError):  # read-only or empty
        return array.ctypes.data


def _map(nbytes: int) -> tuple[mmap.mmap, int]:
    """A fresh anonymous private mapping and its address (page aligned, zero filled)."""
    mm = mmap.mmap(-1, nbytes, **_MAP_KWARGS)
    if nbytes >= _HUGE_PAGE and _MADV_HUGEPAGE is not None:
        # THP disabled or unsupported: plain pages are still correct.
        with contextlib.suppress(OSError):
            mm.madvise(_MADV_HUGEPAGE)
    # The ctypes view is a temporary buffer export: it is gone before close() needs none.
    return mm, ctypes.addressof(ctypes.c_char.from_buffer(mm))


class _Slab:
    """One mapping carved into equal blocks of a small class."""

    __slots__ = ("live", "mm", "nbytes")

    def __init__(self, mm: mmap.mmap, nbytes: int):
        self.mm = mm
        self.nbytes = nbytes
        self.live = 1  # blocks handed out; at 0 every block is on the free list


class _Block:
    """A block of one class (``index >= 0``) or a direct mapping (``index == -1``).

    ``nbytes`` is the class size, or the mapped size of a direct block. ``mm`` is the
    block's own mapping, or None for a block carved from ``slab``.
    """

    __slots__ = ("addr", "index", "mm", "nbytes", "slab")

    def __init__(
        self, addr: int, index: int, nbytes: int, mm: mmap.mmap | None, slab: _Slab | None
    ):
        self.addr = addr
        self.index = index
        self.nbytes = nbytes
        self.mm = mm
        self.slab = slab


class _Lease:
    """The owner of one block for owners that are not NumPy arrays (:meth:`Pool.lease`),
    and the ``base`` of arrays of blocks beyond the largest class: NumPy builds those
    from ``__array_interface__`` and keeps this object as their base."""

    __slots__ = ("__array_interface__", "block", "pool", "requested")

    @property
    def address(self) -> int:
        return self.block.addr

    def __del__(self) -> None:
        self.pool._free(self.block, self.requested)


def _class_lease(cbytes: int) -> type:
    """The ``base`` type of arrays of one class's blocks: a ctypes array of the class
    size over the block (``from_address``: it owns nothing), which NumPy views through the
    buffer protocol (half the cost of ``__array_interface__``, on every op's output).
    Views keep the lease alive, so the block returns to the pool exactly when the last
    array or view referring to it is gone."""

    class ClassLease(ctypes.c_char * cbytes):
        __slots__ = ("block", "pool", "requested")

        def __del__(self) -> None:
            self.pool._free(self.block, self.requested)

    return ClassLease


_LEASE_TYPES: list[type | None] = [None] * NUM_CLASSES  # by class, made on first use
_LEASE_TYPE_SET: set[type] = set()


def _make_lease_type(index: int) -> type:
    lease_type = _class_lease(CLASS_SIZES[index])
    _LEASE_TYPE_SET.add(lease_type)
    _LEASE_TYPES[index] = lease_type  # a race makes two equal types: both are registered
    return lease_type


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


_POOLS: weakref.WeakSet[Pool] = weakref.WeakSet()


class Pool(Allocator):
    """A host memory pool; see the module docstring for what it promises. It is the
    :class:`~hologram.backends.base.Allocator` of the host backends (cpu, interp): an
    allocation is the array :meth:`empty` returns, its handle the array's address.

    ``memory_limit`` (bytes, or None for none) is the same as calling
    :meth:`set_memory_limit` after construction.
    """

    def __init__(self, memory_limit: int | None = None):
        self._lock = threading.Lock()
        self._free_lists: list[list[_Block]] = [[] for _ in range(NUM_CLASSES)]
        # Bit i set: class i (not a slab class) has cached blocks. Trimming takes the highest
        # bit, so finding the largest cached block is O(1).
        self._cached_mask = 0
        # Frees that found the lock taken (another thread, or a finalizer that ran while
        # this thread held it): applied by the next operation that holds the lock. Waiting
        # instead could deadlock a thread on its own lock.
        self._pending: list[tuple[_Block, int]] = []
        self._limit: int | None = None
        self._allocated = 0
        self._requested = 0
        self._reserved = 0
        self._cached = 0
        self._peak = 0
        self._hits = 0
        self._misses = 0
        self._allocs = 0
        self._frees = 0
        self._large = 0
        _POOLS.add(self)
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
        block = self._allocate(nbytes)
        index = block.index
        if index >= 0:
            lease = (_LEASE_TYPES[index] or _make_lease_type(index)).from_address(block.addr)
            memory = lease
        else:  # beyond the largest class: a lease of its own, viewed as bytes
            lease = _Lease()
            lease.__array_interface__ = {"data": (block.addr, False), "shape": (nbytes,),
                                         "typestr": "|u1", "version": 3}
            memory = np.asarray(lease)
        lease.pool = self
        lease.block = block
        lease.requested = nbytes
        # The array over the memory's buffer: exact for structured (padded) dtypes too.
        return np.ndarray(shape, dtype, memory)

    def handle(self, allocation: np.ndarray) -> int:
        """The allocation's host address: its block's, for this pool's arrays (cheaper
        than reading the array's), else :func:`address`."""
        memory = allocation.base
        if type(memory) in _LEASE_TYPE_SET:
            return memory.block.addr
        return address(allocation)

    def view(self, allocation: np.ndarray) -> np.ndarray:
        return allocation

    def copy_in(self, allocation: np.ndarray, source: np.ndarray) -> None:
        raw = source.reshape(-1).view(np.uint8)
        np.copyto(allocation.reshape(-1).view(np.uint8)[: raw.size], raw)

    def copy_out(self, allocation: np.ndarray, destination: np.ndarray) -> None:
        raw = destination.reshape(-1).view(np.uint8)
        np.copyto(raw, allocation.reshape(-1).view(np.uint8)[: raw.size])

    def lease(self, nbytes: int) -> _Lease:
        """A block of at least ``nbytes`` (> 0) bytes, owned by the returned lease: its
        ``address`` is valid until the lease is garbage-collected, which returns the block.
        For owners that are not NumPy arrays (e.g. a torch storage keeps its lease)."""
        lease = _Lease()
        lease.pool = self
        lease.block = self._allocate(nbytes)
        lease.requested = nbytes
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
        closing: list[mmap.mmap] = []
        with self._lock:
            self._drain_locked(closing)
            stats = {
                "allocated_bytes": self._allocated,
                "requested_bytes": self._requested,
                "reserved_bytes": self._reserved,
                "cached_bytes": self._cached,
                "peak_allocated_bytes": self._peak,
                "num_classes": NUM_CLASSES,
                "pool_hits": self._hits,
                "pool_misses": self._misses,
                "num_allocs": self._allocs,
                "num_frees": self._frees,
                "large_allocs": self._large,
                "memory_limit": self._limit,
            }
        _close(closing)
        return stats

    def empty_cache(self) -> int:
        """Return every cached block, and every slab whose blocks are all free, to the OS.

        Live arrays are untouched. Returns the number of bytes released.
        """
        closing: list[mmap.mmap] = []
        with self._lock:
            before = self._reserved
            self._drain_locked(closing)
            self._trim_locked(-1, closing)
            self._release_slabs_locked(closing)
            released = before - self._reserved
        _close(closing)
        return released

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
        closing: list[mmap.mmap] = []
        with self._lock:
            self._limit = limit
            if limit is not None and self._reserved > limit:
                self._drain_locked(closing)
                self._trim_locked(limit, closing)
                if self._reserved > limit:
                    self._release_slabs_locked(closing)
        _close(closing)

    @property
    def memory_limit(self) -> int | None:
        """The current limit in bytes, or None."""
        return self._limit

    def reset_peak_stats(self) -> None:
        """Start ``peak_allocated_bytes`` again from the current ``allocated_bytes``."""
        with self._lock:
            self._peak = self._allocated

    def __repr__(self) -> str:
        return (
            f"<hologram Pool allocated={_fmt(self._allocated)} "
            f"reserved={_fmt(self._reserved)} limit={self._limit}>"
        )

    # -- allocation ------------------------------------------------------------------------

    def _allocate(self, nbytes: int) -> _Block:
        index, cbytes = size_class(nbytes)
        if index >= 0:
            with self._lock:  # a hit with nothing pending and no limit in the way
                free = self._free_lists[index]
                if free and not self._pending and (
                        self._limit is None or self._allocated + cbytes <= self._limit):
                    block = self._hit_locked(free, index, cbytes)
                    self._account_locked(nbytes, cbytes)
                    return block
        return self._allocate_locked(nbytes, index, cbytes)

    def _hit_locked(self, free: list[_Block], index: int, cbytes: int) -> _Block:
        """The next block of class ``index``'s non-empty free list ``free``."""
        block = free.pop()
        if block.slab is not None:
            block.slab.live += 1
        elif not free:
            self._cached_mask &= ~(1 << index)
        self._cached -= cbytes
        self._hits += 1
        return block

    def _account_locked(self, nbytes: int, cbytes: int) -> None:
        """Count a block of ``cbytes`` handed out for a request of ``nbytes``."""
        self._allocated += cbytes
        self._requested += nbytes
        self._allocs += 1
        if self._allocated > self._peak:
            self._peak = self._allocated

    def _allocate_locked(self, nbytes: int, index: int, cbytes: int) -> _Block:
        """:meth:`_allocate` beyond its hit path: misses, pending frees, the limit."""
        closing: list[mmap.mmap] = []
        map_bytes = old_peak = 0
        with self._lock:
            if self._pending:
                self._drain_locked(closing)
            limit = self._limit
            used = self._allocated
            if limit is not None and used + cbytes > limit:
                block = None
                over_limit = True
            else:
                over_limit = False
                free = self._free_lists[index] if index >= 0 else None
                if free:
                    block = self._hit_locked(free, index, cbytes)
                else:
                    block = None
                    if index < 0:
                        self._large += 1
                    else:
                        self._misses += 1
                    map_bytes = SLAB_BYTES if 0 <= index < _NUM_SLAB_CLASSES else cbytes
                    self._reserved += map_bytes
                    old_peak = self._peak
                    # Keep the cache proportionate: never more than twice the peak, and
                    # below the limit if there is one.
                    target = 2 * max(self._peak, used + cbytes)
                    if limit is not None:
                        target = min(target, limit)
                    if self._reserved > target:
                        self._trim_locked(target, closing)
                        if limit is not None and self._reserved > limit:
                            self._release_slabs_locked(closing)
                self._account_locked(nbytes, cbytes)
        _close(closing)
        if over_limit:
            raise OutOfMemoryError(self._limit_message(nbytes, cbytes, used, limit))
        if block is not None:
            return block
        return self._allocate_new(nbytes, index, cbytes, map_bytes, old_peak)

    def _allocate_new(
        self, nbytes: int, index: int, cbytes: int, map_bytes: int, old_peak: int
    ) -> _Block:
        """Map memory for a miss already accounted for; undo the accounting if the OS says
        no."""
        try:
            mm, addr = _map(map_bytes)
        except (OSError, OverflowError, ValueError) as exc:
            with self._lock:
                self._reserved -= map_bytes
                self._allocated -= cbytes
                self._requested -= nbytes
                self._allocs -= 1
                if index < 0:
                    self._large -= 1
                else:
                    self._misses -= 1
                # Approximate under a race (another thread's peak in between is lost), and
                # only on the rare path where the OS refused memory.
                self._peak = max(old_peak, self._allocated)
            raise OutOfMemoryError(
                f"Pool: the OS refused to map {_fmt(map_bytes)} for a request of "
                f"{_fmt(nbytes)} ({exc}); {_fmt(self._allocated)} is allocated by this pool "
                f"and {_fmt(self._reserved)} reserved. Free arrays you no longer need or call "
                "empty_cache()."
            ) from exc
        if map_bytes == cbytes or index < 0:
            return _Block(addr, index, cbytes, mm, None)
        # A new slab: hand out its first block, put the others on the free list.
        slab = _Slab(mm, map_bytes)
        count = map_bytes // cbytes
        # Reversed, so that the free list (a stack) hands out ascending addresses.
        rest = [
            _Block(addr + i * cbytes, index, cbytes, None, slab) for i in range(count - 1, 0, -1)
        ]
        with self._lock:
            self._free_lists[index].extend(rest)
            self._cached += cbytes * len(rest)
        return _Block(addr, index, cbytes, None, slab)

    def _limit_message(self, nbytes: int, cbytes: int, used: int, limit: int) -> str:
        return (
            f"Pool: cannot allocate {_fmt(nbytes)} (rounded to {_fmt(cbytes)}): "
            f"{_fmt(used)} is already allocated and the memory limit is {_fmt(limit)}. "
            "Free arrays you no longer need, raise the limit with "
            "pool.set_memory_limit(nbytes), or remove it with pool.set_memory_limit(None)."
        )

    # -- freeing ---------------------------------------------------------------------------

    def _free(self, block: _Block, requested: int) -> None:
        """Return a block (called by the lease's finalizer)."""
        if not self._lock.acquire(blocking=False):
            self._pending.append((block, requested))  # list.append is atomic
            return
        if block.index >= 0 and not self._pending:  # the common case: nothing to unmap
            try:
                self._release_locked(block, requested, None)
            finally:
                self._lock.release()
            return
        closing: list[mmap.mmap] = []
        try:
            self._release_locked(block, requested, closing)
            if self._pending:
                self._drain_locked(closing)
        finally:
            self._lock.release()
        # Not _close(): finalizers can run at interpreter exit, after module globals are gone.
        for mm in closing:
            mm.close()

    def _release_locked(self, block: _Block, requested: int,
                        closing: list[mmap.mmap] | None) -> None:
        # ``closing`` (where unmapped blocks go) may be None for a class block.
        nbytes = block.nbytes
        self._allocated -= nbytes
        self._requested -= requested
        self._frees += 1
        if block.index < 0:  # direct mapping: straight back to the OS
            self._reserved -= nbytes
            closing.append(block.mm)
            return
        self._free_lists[block.index].append(block)
        self._cached += nbytes
        if block.slab is not None:
            block.slab.live -= 1
        else:
            self._cached_mask |= 1 << block.index

    def _drain_locked(self, closing: list[mmap.mmap]) -> None:
        pending = self._pending
        while pending:
            block, requested = pending.pop()
            self._release_locked(block, requested, closing)

    def _trim_locked(self, target: int, closing: list[mmap.mmap]) -> None:
        """Unmap cached blocks of their own mapping, largest first, until reserved <= target."""
        mask = self._cached_mask
        lists = self._free_lists
        while mask and self._reserved > target:
            index = mask.bit_length() - 1
            free = lists[index]
            block = free.pop()
            if not free:
                mask &= ~(1 << index)
            self._reserved -= block.nbytes
            self._cached -= block.nbytes
            closing.append(block.mm)
        self._cached_mask = mask

    def _release_slabs_locked(self, closing: list[mmap.mmap]) -> None:
        """Unmap every slab whose blocks are all free (walks the small free lists)."""
        for index in range(_NUM_SLAB_CLASSES):
            free = self._free_lists[index]
            if not free:
                continue
            keep = [b for b in free if b.slab.live]
            if len(keep) == len(free):
                continue
            self._cached -= CLASS_SIZES[index] * (len(free) - len(keep))
            for slab in {id(b.slab): b.slab for b in free if not b.slab.live}.values():
                self._reserved -= slab.nbytes
                closing.append(slab.mm)
            self._free_lists[index] = keep


def _close(maps: list[mmap.mmap]) -> None:
    # Outside the lock: munmap of a large block is a system call worth not serializing on.
    for mm in maps:
        mm.close()


_DEFAULT = Pool()


def default_pool() -> Pool:
    """The process-wide pool, used by whatever has no pool of its own."""
    return _DEFAULT


_FORKING: list[Pool] = []


def _before_fork() -> None:
    # A lock held by another thread at fork() would stay held forever in the child, and the
    # counters could be half-updated: fork only between critical sections.
    _FORKING[:] = list(_POOLS)
    for pool in _FORKING:
        pool._lock.acquire()


def _after_fork() -> None:
    for pool in _FORKING:
        pool._lock.release()
    _FORKING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork
    )
