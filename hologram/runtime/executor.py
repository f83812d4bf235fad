"""The SDK's executor: a backend, its memory (an allocator), and the buffers made from it.

    with hg.Executor(backend="auto") as ex:           # "auto" | "cpu" | "interp" | ...
        a = ex.allocate((64, 128), dtype=np.float32)   # zero-filled
        b = ex.from_numpy(x)                           # a copy of x
        hg.ops.vector_add(ex, a, b, a)
    # leaving the block closes the executor: its buffers end, its cached memory is released

Each executor gets its own allocator from its backend
(``hologram.backends.get(backend).allocator(memory_limit)``, see
:class:`hologram.backends.base.Allocator`): on the host backends a 96-class host memory
pool (:class:`hologram.backends.hostmem.Pool`); on a GPU (cuda) a pool of device memory
in the same classes. So ``memory_stats()``, ``empty_cache()``, ``memory_limit`` and the
``torch.cuda``-style counters (``memory_allocated()``, ``max_memory_allocated()``,
``memory_reserved()``, ``max_memory_reserved()``, ``reset_peak_memory_stats()``) concern
its buffers only, and ``device`` and ``synchronize()`` are
the allocator's. Compiled kernels are shared by every executor of a backend (the program
cache is global).
"""

from __future__ import annotations

import itertools
import math
import threading

import numpy as np

from hologram import backends
from hologram._native import Registry
from hologram.backends import validate_backend
from hologram.backends.hostmem import Pool
from hologram.errors import (
    DeviceError,
    DTypeError,
    InvalidBufferError,
    OutOfMemoryError,
    ShapeError,
)
from hologram.frontend.mixin import as_shape
from hologram.runtime.buffer import Buffer, _asarray, as_dtype, check_extent

_tokens = itertools.count()


class Executor:
    """Runs :mod:`hologram.sdk.ops` on one backend and owns the memory of its buffers.

    ``backend``: a name or :class:`~hologram.sdk.backend.BackendType` (``"auto"`` picks the
    best available); :class:`~hologram.errors.DeviceError` names the available backends
    when it cannot run here. ``memory_limit``: bytes of live buffers beyond which
    allocation raises :class:`~hologram.errors.OutOfMemoryError` (None: no limit).
    """

    def __init__(self, backend: str = "auto", *, memory_limit: int | None = None):
        self.backend = validate_backend(backend)
        #: The backend's memory for this executor (internal API: buffers and ops use it).
        self.allocator = backends.get(self.backend).allocator(memory_limit)
        #: Where buffers live: the allocator's device type ("cpu" for host memory).
        self.device = self.allocator.device
        # This executor's buffers, held weakly, and whether it is closed; with the pool's
        # core, what the ops' native allocating path needs of the executor (see
        # hologram/csrc/fastop.c and registry.c).
        core = self.allocator._core if type(self.allocator) is Pool else None
        self._buffers = Registry(core)
        self._lock = threading.Lock()
        self.closed = False
        # Internal: identifies this executor in the ops' launch keys without keeping it
        # alive (see Buffer.launch_key).
        self.token = next(_tokens)

    # --- buffers ------------------------------------------------------------------------
    def empty(self, shape: int | tuple[int, ...], dtype: object = np.float32) -> Buffer:
        """An uninitialized buffer (contents are whatever the pool block held)."""
        return self.new_buffer(as_shape(shape, "allocate"), as_dtype(dtype, "allocate"))

    def allocate(self, shape: int | tuple[int, ...], dtype: object = np.float32) -> Buffer:
        """A zero-filled buffer of ``shape`` (an int for 1-D) and ``dtype``."""
        buf = self.empty(shape, dtype)
        if self.allocator.host_visible:
            buf.array().fill(0)
        elif buf.size:
            buf.write(np.zeros(buf.size, buf.dtype))
        return buf

    def from_numpy(self, array: object, dtype: object = None) -> Buffer:
        """A new buffer holding a copy of ``array`` (any array-like; non-contiguous and
        read-only arrays are fine, since the data is copied), converted to ``dtype`` if
        given."""
        self._check_open("from_numpy")
        source = _asarray(array, "from_numpy")
        if dtype is None and not source.dtype.isnative:  # big-endian data: copy it native
            dtype = source.dtype.newbyteorder("=")
        dt = as_dtype(source.dtype if dtype is None else dtype, "from_numpy")
        buf = self.new_buffer(source.shape, dt)
        buf.write(source)
        return buf

    def from_dlpack(self, obj: object) -> Buffer:
        """A buffer sharing the memory of ``obj``, no copy: on host backends a NumPy array,
        a torch CPU tensor, any DLPack producer of host memory; on a cuda executor a
        producer of memory on its own CUDA device (``__dlpack_device__() == (2, n)``, a
        torch CUDA tensor), other devices refused with :class:`DeviceError` naming both.
        The producer stays alive while the buffer does. Non-contiguous producers are
        refused (make them contiguous first)."""
        self._check_open("from_dlpack")
        if isinstance(obj, Buffer):
            obj.check_live("from_dlpack")
            if obj.executor is self:
                return obj
        importer = getattr(self.allocator, "import_dlpack", None)
        if importer is not None:  # device memory the allocator can share (kDLCUDA)
            allocation, shape, dtype = importer(obj)
            as_dtype(dtype, "from_dlpack")
            return self.register(Buffer(None, self, foreign=True, allocation=allocation,
                                        signature=(shape, dtype),
                                        handle=self.allocator.handle(allocation)))
        if isinstance(obj, Buffer):
            array = obj.array("from_dlpack")  # memory the host cannot see raises
        elif not self.allocator.host_visible:
            array = None
        else:
            array = _import_dlpack(obj)
        if not self.allocator.host_visible:
            raise DeviceError(f"from_dlpack: executor ({self.backend}) keeps buffers in "
                              f"{self.device} memory, which cannot share host memory; use "
                              "ex.from_numpy(...) to copy")
        return self._wrap_foreign(array)

    def _wrap_foreign(self, array: np.ndarray) -> Buffer:
        as_dtype(array.dtype, "from_dlpack")
        if not array.flags.c_contiguous:
            raise ShapeError(f"from_dlpack: array {list(array.shape)} with strides "
                             f"{list(array.strides)} is not C-contiguous; buffers are "
                             "contiguous, so pass a contiguous copy (.contiguous() in torch, "
                             "np.ascontiguousarray in NumPy) or use ex.from_numpy to copy")
        return self._wrap(array, foreign=True)

    # --- memory -------------------------------------------------------------------------
    def memory_stats(self) -> dict:
        """The allocator's counters. On host backends, the pool's: ``allocated_bytes``,
        ``reserved_bytes``, ``peak_allocated_bytes``, ``num_classes`` (96), ``pool_hits``,
        ``pool_misses`` and more (see :meth:`hologram.backends.hostmem.Pool.stats`)."""
        return self.allocator.stats()

    def empty_cache(self) -> int:
        """Return cached (free) memory to the OS or device; returns the bytes released."""
        return self.allocator.empty_cache()

    # ``torch.cuda``'s names for the same counters (bytes; blocks are class-rounded).
    def memory_allocated(self) -> int:
        """Bytes held by live allocations (``memory_stats()["allocated_bytes"]``)."""
        return self._counter("allocated_bytes", "memory_allocated")

    def max_memory_allocated(self) -> int:
        """The peak of :meth:`memory_allocated` since the start or the last
        :meth:`reset_peak_memory_stats`."""
        return self._counter("peak_allocated_bytes", "max_memory_allocated")

    def memory_reserved(self) -> int:
        """Bytes the allocator holds from the OS or device, live and cached."""
        return self._counter("reserved_bytes", "memory_reserved")

    def max_memory_reserved(self) -> int:
        """The peak of :meth:`memory_reserved` (device allocators count it; the host pool
        does not)."""
        return self._counter("peak_reserved_bytes", "max_memory_reserved")

    def reset_peak_memory_stats(self) -> None:
        """Start the peaks again from the current values."""
        reset = getattr(self.allocator, "reset_peak_stats", None)
        if reset is None:
            raise DeviceError(f"reset_peak_memory_stats: the {self.backend} backend's memory "
                              f"({type(self.allocator).__name__}) keeps no peaks to reset")
        reset()

    def set_memory_limit(self, limit: int | None) -> None:
        self.allocator.set_memory_limit(limit)

    def synchronize(self) -> None:
        """Wait for queued work (the allocator's ``synchronize``). Host backends run ops
        synchronously: nothing to wait for."""
        self._check_open("synchronize")
        self.allocator.synchronize()

    # --- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        """End every buffer of this executor and release its cached memory (idempotent).
        NumPy views taken from its buffers stay valid."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            # Closed before listing: a buffer the native path adds meanwhile sees it.
            self._buffers.close()
            buffers = self._buffers.live()
        for buf in buffers:
            buf.free()
        self.allocator.empty_cache()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._buffers.live())} buffers"
        return f"<hologram.Executor backend={self.backend!r} {state}>"

    # --- internal API: for the SDK's ops, hg.jit and buffers ------------------------------
    def new_buffer(self, shape: tuple[int, ...], dtype: np.dtype) -> Buffer:
        """An uninitialized buffer of a valid ``shape`` and one of the buffer ``dtype`` s
        (NumPy dtype; not checked again: callers got them from a compiled kernel or from
        :func:`~hologram.frontend.mixin.as_shape` and ``as_dtype``)."""
        allocator = self.allocator
        allocation = self._new(shape, dtype)
        if allocator.host_visible:
            return self.register(Buffer(allocator.view(allocation), self,
                                        allocation=allocation,
                                        handle=allocator.handle(allocation)))
        return self.register(Buffer(None, self, allocation=allocation,
                                    signature=(shape, dtype),
                                    handle=allocator.handle(allocation)))

    def register(self, buf: Buffer) -> Buffer:
        """Track ``buf`` (a view made by one of this executor's buffers) so that
        ``close()`` ends it; returns it."""
        with self._lock:
            if self.closed:
                buf.free()
                raise InvalidBufferError(f"executor ({self.backend}) is closed; create a new "
                                         "hg.Executor()")
            self._buffers.add(buf)
        return buf

    # --- private --------------------------------------------------------------------------
    def _new(self, shape: tuple[int, ...], dtype: np.dtype) -> object:
        """An uninitialized allocation for an op output or a new buffer."""
        self._check_open("allocate")
        nbytes = math.prod(shape) * dtype.itemsize
        if not nbytes:  # an empty shape may still have extents no array can address
            check_extent(shape, "allocate")
        elif nbytes > 1 << 50:
            raise OutOfMemoryError(f"allocate: {list(shape)} {dtype} needs {nbytes} bytes, "
                                   "beyond any machine's memory; allocate a smaller buffer")
        try:
            return self.allocator.alloc(shape, dtype)
        except OutOfMemoryError as exc:
            limit = self.allocator.memory_limit
            hint = (f" (this executor's memory_limit is {limit} bytes; raise it with "
                    "ex.set_memory_limit(nbytes) or free buffers with buf.free())"
                    if limit is not None else "")
            raise OutOfMemoryError(f"allocate: {list(shape)} {dtype} ({nbytes} bytes): {exc}"
                                   f"{hint}") from None

    def _counter(self, name: str, where: str) -> int:
        stats = self.allocator.stats()
        if name not in stats:
            raise DeviceError(f"{where}: the {self.backend} backend's memory "
                              f"({type(self.allocator).__name__}) does not count {name}; "
                              f"memory_stats() lists what it counts: {', '.join(stats)}")
        return stats[name]

    def _wrap(self, array: np.ndarray, foreign: bool = False) -> Buffer:
        return self.register(Buffer(array, self, foreign=foreign))

    def _check_open(self, where: str) -> None:
        if self.closed:
            raise InvalidBufferError(f"{where}: executor ({self.backend}) is closed; create a "
                                     "new hg.Executor()")


_default: Executor | None = None
_default_lock = threading.Lock()


def _import_dlpack(obj: object) -> np.ndarray:
    try:
        return np.from_dlpack(obj)
    except Exception as exc:  # whatever the producer raises
        raise DTypeError(f"from_dlpack: cannot import {type(obj).__name__} zero-copy: {exc}. "
                         "Host memory (NumPy arrays, torch CPU tensors without grad) is "
                         "supported; use ex.from_numpy(...) to copy") from exc


def default_executor() -> Executor:
    """The process-wide executor on the ``"auto"`` backend, made when first asked for; used
    by :func:`hologram.from_dlpack` and by ops called without an executor on values that
    have none."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Executor()
        return _default


def from_dlpack(obj: object, executor: Executor | None = None) -> Buffer:
    """Zero-copy buffer over a DLPack producer's memory (host memory: NumPy arrays, torch
    CPU tensors; on a cuda executor, memory of its CUDA device); see
    :meth:`Executor.from_dlpack`."""
    return (executor or default_executor()).from_dlpack(obj)
