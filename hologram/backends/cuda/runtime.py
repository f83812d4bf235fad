"""Running compiled (sm_80/sm_90) artifacts through a driver (:mod:`.driver`): device
memory in the host pool's 96 size classes (with DLPack export and import of kDLCUDA
memory, :mod:`.dlpack`), the kernel parameters read from each compiled kernel's metadata,
launch configuration, modules loaded once per cubin and context, and the program that
launches every kernel in order.

The backend uses it where a GPU is found (:func:`.backend.gpu`). It ran on an H100 once
(docs/cuda.md, "On an H100"); CI tests it against a fake driver (tests/test_cuda_runtime.py).
"""

from __future__ import annotations

import atexit
import base64
import functools
import hashlib
import json
import math
import operator
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hologram.backends.base import Allocator, Executable, contiguous
from hologram.backends.hostmem import CLASS_SIZES, NUM_CLASSES, size_class
from hologram.errors import DeviceError, DTypeError, HologramError, OutOfMemoryError, ShapeError
from hologram.isa.text import parse_program

from . import dlpack

#: The largest grid.x of a launch (2**31 - 1).
MAX_GRID_X = 2**31 - 1
#: Every buffer's address is a multiple of this: kernels are compiled with their pointers
#: so marked (Triton's ``tt.divisibility``), which their vector loads and the matrix
#: products' pipelined copies need. The driver's allocations are 256-byte aligned;
#: imported memory is checked.
ALIGNMENT = 16


@dataclass(frozen=True)
class Launch:
    """How one compiled kernel is launched."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    buffers: tuple[int, ...]  # program buffer indices, one per visible pointer parameter
    global_scratch: int  # bytes per program instance (Triton's global_scratch_size)
    profile_scratch: int


def launch_of(kernel: dict, compiled: dict) -> Launch:
    """The launch of one kernel: its grid (one program instance per ``XBLOCK`` grid
    points), ``32 * num_warps`` threads, and the shared memory and scratch sizes from the
    compiled kernel's metadata (never assumed)."""
    md = compiled["metadata"]
    if md["name"] != kernel["name"]:
        raise DeviceError(f"cuda: compiled kernel {md['name']} does not match {kernel['name']}")
    grid = kernel["grid"]
    if grid > MAX_GRID_X:
        raise DeviceError(f"cuda: kernel {kernel['name']} needs {grid} program instances, "
                          f"more than {MAX_GRID_X}; split the program")
    return Launch(kernel["name"], (grid, 1, 1), (32 * md["num_warps"], 1, 1), md["shared"],
                  tuple(kernel["buffers"]), md.get("global_scratch_size", 0),
                  md.get("profile_scratch_size", 0))


def parameters(launch: Launch, pointers: dict[int, int], scratch: tuple[int, int]) -> list[int]:
    """The kernel's parameters: one device pointer per buffer it touches, in its
    signature's order, then the two hidden pointers Triton 3.9.0 appends (global and
    profile scratch; 0 where the metadata gives no scratch)."""
    missing = [b for b in launch.buffers if b not in pointers]
    if missing:
        raise ShapeError(f"cuda: kernel {launch.name} needs buffers {missing}, not given")
    return [pointers[b] for b in launch.buffers] + [
        scratch[0] if launch.global_scratch else 0,
        scratch[1] if launch.profile_scratch else 0]


class End:
    """What ends a :class:`DeviceBlock`: ``release(*args)``, once, when the block is freed
    (``end()``) or collected. Not at interpreter exit: the process's end frees device
    memory, and the driver or a producer's library may already be gone by then. (A
    ``weakref.finalize`` did this at ~5 µs an allocation, most of an op's host time.)"""

    __slots__ = ("_state",)

    def __init__(self, release: Any, *args: Any):
        self._state = [(release, args)]

    @property
    def alive(self) -> bool:
        return bool(self._state)

    def __call__(self) -> None:
        try:
            release, args = self._state.pop()  # atomic: one caller wins
        except IndexError:
            return
        if not _exiting:
            release(*args)


_exiting = False


@atexit.register
def _at_exit() -> None:
    global _exiting
    _exiting = True


class DeviceBlock:
    """One allocation of :class:`DeviceMemory`: ``pointer`` (the device address), ``nbytes``
    asked for, ``size`` (its block's, the size class). When the last reference to it goes
    (or :meth:`DeviceMemory.free` ends it), its block returns to the pool."""

    __slots__ = ("__weakref__", "end", "nbytes", "pointer", "size")

    def __init__(self, pointer: int, nbytes: int, size: int):
        self.pointer, self.nbytes, self.size = pointer, nbytes, size
        self.end: End | None = None

    def __del__(self) -> None:
        if self.end is not None:
            self.end()

    def __repr__(self) -> str:
        return f"<cuda block {self.pointer:#x}: {self.nbytes} of {self.size} bytes>"


class DeviceMemory(Allocator):
    """Device memory of one executor (or of the programs' temporaries), in the host pool's
    96 size classes (:func:`hologram.backends.hostmem.size_class`), with its policy:

    * a request is rounded up to its class; a freed block goes back to its class's free
      list, and the next request of that class takes it without a driver call (one
      ``cuMemAlloc`` per block, never per request);
    * requests beyond the largest class get a block of their own, freed to the driver when
      they end;
    * the cache stays proportionate: before a new block would make ``reserved_bytes``
      exceed twice the peak of ``allocated_bytes`` (or the limit), cached blocks go back to
      the driver, largest class first;
    * the driver's ``CUDA_ERROR_OUT_OF_MEMORY`` is retried once after every cached block is
      freed; then :class:`OutOfMemoryError` names the request and the usage;
    * an optional limit bounds ``allocated_bytes`` (class-rounded), like the host pool's;
    * memory another stream may still use is let go only once that stream's work has
      completed (:meth:`_defer`: a DLPack consumer's reads of an exported block after its
      deleter call, our own work on an imported block before the producer's deleter), as
      ``Tensor.record_stream`` does in PyTorch.

    Counters (:meth:`stats`) follow ``torch.cuda``'s: allocated, reserved (cuMemAlloc'd,
    live and cached) and their peaks, which :meth:`reset_peak_stats` restarts.
    """

    device = "cuda"
    dlpack_device_type = 2  # kDLCUDA
    host_visible = False

    def __init__(self, driver: Any, memory_limit: int | None = None):
        self.driver = driver
        #: The CUDA device ordinal (DLPack's device id).
        self.device_id = driver.ordinal
        self._limit: int | None = None
        self._free: list[list[int]] = [[] for _ in range(NUM_CLASSES)]
        # Reentrant: a block collected while the lock is held (a garbage collection inside
        # alloc) returns itself through _release on the same thread.
        self._lock = threading.RLock()
        self._stats = dict.fromkeys(_COUNTERS, 0)
        # Releases waiting for an event: (event, release, args); see _defer.
        self._deferred: list[tuple[Any, Any, tuple]] = []
        self.set_memory_limit(memory_limit)

    # --- allocations --------------------------------------------------------------------
    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> DeviceBlock:
        nbytes = max(math.prod(shape) * np.dtype(dtype).itemsize, 1)
        index, size = size_class(nbytes)
        s = self._stats
        if self._deferred:
            self._collect()
        with self._lock:
            if self._limit is not None and s["allocated_bytes"] + size > self._limit:
                raise OutOfMemoryError(
                    f"cuda: allocating {nbytes} bytes (a block of {size}) would pass the "
                    f"memory limit of {self._limit} bytes ({s['allocated_bytes']} allocated); "
                    "free buffers or raise the limit (set_memory_limit)")
            free = self._free[index] if index >= 0 else None
            if free:
                pointer = free.pop()
                s["cached_bytes"] -= size
                s["pool_hits"] += 1
            else:
                pointer = self._new_block(nbytes, size)
                s["pool_misses" if index >= 0 else "large_allocs"] += 1
            s["allocated_bytes"] += size
            s["requested_bytes"] += nbytes
            s["num_allocs"] += 1
            s["peak_allocated_bytes"] = max(s["peak_allocated_bytes"], s["allocated_bytes"])
        block = DeviceBlock(pointer, nbytes, size)
        block.end = End(self._release, pointer, nbytes, size, index)
        return block

    def _new_block(self, nbytes: int, size: int) -> int:
        """A fresh block from the driver (the lock held), the cache trimmed first."""
        s = self._stats
        used = s["allocated_bytes"] + size
        target = 2 * max(s["peak_allocated_bytes"], used)
        if self._limit is not None:
            target = min(target, self._limit)
        if s["reserved_bytes"] + size > target:
            self._trim(target - size)
        try:
            pointer = self.driver.mem_alloc(size)
        except OutOfMemoryError as err:
            s["num_oom_retries"] += 1
            # What other streams still use is waited for, every cached block goes back to
            # the driver, then once more.
            self._collect(wait=True)
            self._trim(0)
            try:
                pointer = self.driver.mem_alloc(size)
            except OutOfMemoryError:
                raise OutOfMemoryError(
                    f"{err} (requested {nbytes} bytes, a block of {size}; "
                    f"{s['allocated_bytes']} bytes allocated and {s['reserved_bytes']} "
                    "reserved by this allocator after freeing its cache); free buffers or "
                    "use a smaller batch") from None
        s["reserved_bytes"] += size
        s["peak_reserved_bytes"] = max(s["peak_reserved_bytes"], s["reserved_bytes"])
        s["num_driver_allocs"] += 1
        return pointer

    def _trim(self, target: int) -> int:
        """Free cached blocks, largest class first, until ``reserved_bytes <= target``;
        returns the bytes freed."""
        s, released = self._stats, 0
        for index in range(NUM_CLASSES - 1, -1, -1):
            free = self._free[index]
            while free and s["reserved_bytes"] > target:
                self.driver.mem_free(free.pop())
                size = CLASS_SIZES[index]
                s["reserved_bytes"] -= size
                s["cached_bytes"] -= size
                s["num_driver_frees"] += 1
                released += size
        return released

    def _release(self, pointer: int, nbytes: int, size: int, index: int) -> None:
        with self._lock:
            s = self._stats
            s["allocated_bytes"] -= size
            s["requested_bytes"] -= nbytes
            s["num_frees"] += 1
            if index < 0:  # a block of its own: straight back to the driver
                self.driver.mem_free(pointer)
                s["reserved_bytes"] -= size
                s["num_driver_frees"] += 1
                return
            self._free[index].append(pointer)
            s["cached_bytes"] += size

    def _defer(self, stream: int | None, release: Any, *args: Any) -> None:
        """Call ``release(*args)`` once the work queued on ``stream`` (a CUDA stream handle;
        None: ours) until now has completed: an event is recorded there, and each
        allocation, :meth:`synchronize` and :meth:`empty_cache` release what has completed
        (and an allocation the driver refuses waits for all of it). Until then, ``args``
        (a block, a producer) stay alive."""
        event = self.driver.event_on(stream)
        with self._lock:
            self._deferred.append((event, release, args))

    def _collect(self, wait: bool = False) -> None:
        """Run the deferred releases whose event has completed (with ``wait``: all, once
        their events have). The releases run outside the lock where the caller holds none
        (a producer's deleter may take its own allocator's lock)."""
        with self._lock:
            deferred, self._deferred = self._deferred, []
            ready = []
            for entry in deferred:
                (ready if self.driver.event_done(entry[0], wait) else self._deferred).append(
                    entry)
        for _, release, args in ready:
            release(*args)

    def _after_consumer(self, stream: int, block: DeviceBlock) -> None:
        """An exported block's deleter call (:func:`.dlpack.export`'s ``on_delete``): the
        consumer may still have reads of it queued on its stream, so the block is held
        until they complete."""
        self._defer(stream, _let_go, block)

    def release_after(self, block: DeviceBlock, streams: Any) -> None:
        """Hold ``block``, which its owner let go, until the work queued so far on each of
        ``streams`` (handles as integers) has completed: no later request gets it while
        work on another stream may still use it (the torch device's
        ``Tensor.record_stream`` and side streams)."""
        for stream in streams:
            self._defer(stream, _let_go, block)

    def free(self, allocation: DeviceBlock) -> None:
        """End ``allocation`` now: its block returns to the pool."""
        if not allocation.end.alive:
            raise DeviceError(f"cuda: {allocation!r} was already returned to the pool "
                              "(freed twice?)")
        allocation.end()

    def handle(self, allocation: DeviceBlock) -> int:
        return allocation.pointer

    # --- DLPack (kDLCUDA) ---------------------------------------------------------------
    def export_dlpack(self, allocation: DeviceBlock, shape: tuple[int, ...],
                      dtype: np.dtype | tuple[int, int],
                      max_version: tuple[int, int] | None = None, stream: object = None, *,
                      offset: int = 0, strides: tuple[int, ...] | None = None) -> Any:
        """A DLPack capsule of ``allocation``'s ``shape`` elements from byte ``offset``
        (kDLCUDA, this device; C-contiguous or with ``strides`` in elements; ``dtype`` a
        NumPy dtype or DLPack's ``(code, bits)``; versioned when ``max_version`` allows),
        keeping the block alive until the consumer's deleter call.

        ``stream`` is the consumer's (``__dlpack__``'s argument, :func:`.dlpack.
        consumer_stream`): the work queued on this driver's stream is ordered before it,
        without waiting on the host: an event recorded on our stream, which the
        consumer's stream waits for. Nothing where it is our own stream, or for -1 (the
        consumer asked for no synchronization).

        The other way round, the consumer's reads queued on its stream before its deleter
        call are waited for (an event on its stream) before the block can be reused."""
        consumer = dlpack.consumer_stream(stream)
        ours = dlpack.stream_argument(self.driver.stream_handle())
        other = consumer is not None and consumer != ours
        if other:
            self.driver.wait_event(consumer, self.driver.record_event())
        return dlpack.export(allocation.pointer + offset, shape, dtype,
                             (dlpack.KDL_CUDA, self.device_id), allocation, max_version,
                             functools.partial(self._after_consumer, consumer) if other
                             else None, strides)

    def take_dlpack(self, producer: Any) -> dlpack.Tensor:
        """The tensor of a DLPack ``producer`` of memory on this device, its capsule taken
        (the caller calls ``release()`` once, or hands it to :meth:`foreign_block`). The
        producer is given this driver's stream (``__dlpack__(stream=...)``), so it orders
        its queued work before ours, as the protocol asks of it. Other devices are
        refused."""
        kind, ordinal = map(int, producer.__dlpack_device__())
        if (kind, ordinal) != (dlpack.KDL_CUDA, self.device_id):
            name = dlpack.DEVICE_NAMES.get(kind, f"DLPack device type {kind}")
            raise DeviceError(
                f"from_dlpack: {type(producer).__name__} holds {name}:{ordinal} memory and "
                f"this executor (cuda) keeps buffers on cuda:{self.device_id}; move it there "
                f"first (torch: t.to('cuda:{self.device_id}')), or copy host data in with "
                "ex.from_numpy(...)")
        # DLPack 1.x first (it says whether the memory is read-only); producers older
        # than max_version refuse the keyword.
        stream = dlpack.stream_argument(self.driver.stream_handle())
        try:
            capsule = producer.__dlpack__(stream=stream, max_version=(1, 0))
        except TypeError:
            capsule = producer.__dlpack__(stream=stream)
        return dlpack.unpack(capsule, "from_dlpack")

    def foreign_block(self, tensor: dlpack.Tensor, producer: Any, pointer: int,
                      nbytes: int) -> DeviceBlock:
        """An allocation (not this pool's) of ``nbytes`` of ``tensor``'s memory from
        ``pointer``, whose end calls its deleter once and releases ``producer``, once the
        work queued on our stream by then has completed (:meth:`_defer`), so the producer
        cannot reuse the memory under our kernels."""
        block = DeviceBlock(pointer, nbytes, nbytes)
        block.end = End(self._defer, None, _release_foreign, tensor.release, producer)
        return block

    def import_dlpack(self, producer: Any) -> tuple[DeviceBlock, tuple[int, ...], np.dtype]:
        """The memory of a DLPack ``producer`` on this device, zero-copy
        (:meth:`take_dlpack`, :meth:`foreign_block`), with the tensor's shape and dtype.
        Strided and read-only tensors, dtypes without a buffer dtype (bfloat16) and memory
        not aligned to :data:`ALIGNMENT` bytes are refused."""
        tensor = self.take_dlpack(producer)
        what = type(producer).__name__
        if not tensor.c_contiguous or tensor.read_only:
            tensor.release()
            how = ("read-only" if tensor.read_only else
                   f"not C-contiguous (strides {list(tensor.strides)})")
            raise ShapeError(f"from_dlpack: {what} {list(tensor.shape)} {tensor.dtype} is "
                             f"{how}; buffers are contiguous and writable, so pass a "
                             "contiguous, writable copy (.contiguous() or .clone() in torch)")
        if tensor.dtype is None:
            tensor.release()
            raise DTypeError(f"from_dlpack: DLPack dtype (code {tensor.code}, {tensor.bits} "
                             "bits) has no buffer dtype; convert the tensor first (e.g. to "
                             "float32)")
        if tensor.data % ALIGNMENT:
            tensor.release()
            raise ShapeError(f"from_dlpack: {what} {list(tensor.shape)} {tensor.dtype} starts "
                             f"at {tensor.data:#x}, not on a {ALIGNMENT}-byte boundary (a "
                             "view into a larger tensor?); the kernels' vector loads assume "
                             "it, so pass a copy (.clone() in torch)")
        nbytes = int(np.prod(tensor.shape, dtype=np.int64)) * tensor.dtype.itemsize
        return (self.foreign_block(tensor, producer, tensor.data, nbytes), tensor.shape,
                tensor.dtype)

    # --- copies -------------------------------------------------------------------------
    def _check(self, allocation: DeviceBlock, nbytes: int, what: str) -> None:
        if not allocation.end.alive or nbytes > allocation.nbytes:
            raise ShapeError(f"cuda: {what} of {nbytes} bytes does not fit {allocation!r}"
                             + ("" if allocation.end.alive else ", which was freed"))

    def copy_in(self, allocation: DeviceBlock, source: np.ndarray) -> None:
        self._check(allocation, source.nbytes, "copy in")
        self.driver.copy_in(allocation.pointer, source)

    def copy_out(self, allocation: DeviceBlock, destination: np.ndarray) -> None:
        self._check(allocation, destination.nbytes, "copy out")
        self.driver.copy_out(destination, allocation.pointer)

    def write(self, handle: int, source: np.ndarray) -> None:
        """Copy ``source`` (C-contiguous) to the device address ``handle`` (a block's
        pointer, or one plus an offset into it): ``cuMemcpyHtoD``."""
        contiguous(source, "cuda write")
        if source.nbytes:
            self.driver.copy_in(handle, source)

    def write_async(self, handle: int, source: np.ndarray, keep: object) -> None:
        """``cuMemcpyHtoDAsync`` on the current stream; ``keep`` (and ``source``) are held
        until it completes. From page-locked memory (torch's ``pin_memory()``) the host
        returns at once; from pageable memory the driver stages the bytes first."""
        contiguous(source, "cuda write")
        if source.nbytes:
            self.driver.copy_in_async(handle, source)
            self._defer(None, _let_go, keep, source)

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        """``cuMemcpyDtoDAsync`` on the stream the kernels run on (in order with them)."""
        if nbytes:
            self.driver.copy_device(destination, source, nbytes)

    def read(self, handle: int, destination: np.ndarray) -> None:
        """Copy ``destination.nbytes`` bytes at the device address ``handle`` into
        ``destination`` (C-contiguous, writable): ``cuMemcpyDtoH``."""
        contiguous(destination, "cuda read", writable=True)
        if destination.nbytes:
            self.driver.copy_out(destination, handle)

    def synchronize(self) -> None:
        self.driver.synchronize()
        if self._deferred:
            self._collect()

    # --- accounting ---------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters, in bytes or counts: ``allocated_bytes`` (live blocks, class-rounded),
        ``requested_bytes`` (what their callers asked for), ``reserved_bytes`` (every block
        the driver gave, live or cached), ``cached_bytes``, ``peak_allocated_bytes``,
        ``peak_reserved_bytes``, ``pool_hits`` / ``pool_misses`` (class requests served
        from / not from a free list), ``large_allocs`` (beyond the largest class),
        ``num_allocs`` / ``num_frees``, ``num_driver_allocs`` / ``num_driver_frees``
        (``cuMemAlloc`` / ``cuMemFree`` calls), ``num_oom_retries``, ``num_classes``,
        ``memory_limit``."""
        with self._lock:
            return dict(self._stats, num_classes=NUM_CLASSES, memory_limit=self._limit)

    def empty_cache(self) -> int:
        """Free every cached block to the driver (live ones are untouched), after the
        deferred releases whose streams are done; returns the bytes freed."""
        self._collect()
        with self._lock:
            return self._trim(0)

    def reset_peak_stats(self) -> None:
        """Start both peaks again from the current allocated and reserved bytes."""
        with self._lock:
            s = self._stats
            s["peak_allocated_bytes"] = s["allocated_bytes"]
            s["peak_reserved_bytes"] = s["reserved_bytes"]

    @property
    def memory_limit(self) -> int | None:
        return self._limit

    def set_memory_limit(self, limit: int | None) -> None:
        """Bound ``allocated_bytes`` (None: no bound); cached blocks beyond it are freed."""
        if limit is not None:
            try:
                limit = operator.index(limit)
            except TypeError:
                raise HologramError(f"cuda: set_memory_limit expects a number of bytes or "
                                    f"None, got {limit!r}") from None
            if limit < 0:
                raise HologramError(f"cuda: set_memory_limit: limit must be >= 0, got {limit}")
        with self._lock:
            self._limit = limit
            if limit is not None:
                self._trim(max(limit, self._stats["allocated_bytes"]))


def _let_go(*held: Any) -> None:
    """A deferred release that only lets go of what it held (:meth:`DeviceMemory._defer`)."""


def _release_foreign(release: Any, producer: Any) -> None:
    """The end of an imported tensor: the producer's deleter (``producer`` was held until
    now to keep its memory alive)."""
    release()


#: The counters of :meth:`DeviceMemory.stats`.
_COUNTERS = ("allocated_bytes", "requested_bytes", "reserved_bytes", "cached_bytes",
             "peak_allocated_bytes", "peak_reserved_bytes", "pool_hits", "pool_misses",
             "large_allocs", "num_allocs", "num_frees", "num_driver_allocs",
             "num_driver_frees", "num_oom_retries")


#: Modules loaded per driver (one context each), by the cubin's digest: a cubin is loaded
#: (``cuModuleLoadData``) once per context and process, however many programs hold it.
_modules: weakref.WeakKeyDictionary[Any, dict[bytes, Any]] = weakref.WeakKeyDictionary()
_modules_lock = threading.Lock()


def module_of(driver: Any, cubin: bytes) -> Any:
    """The module of ``cubin`` in ``driver``'s context, loaded on first use."""
    digest = hashlib.sha256(cubin).digest()
    with _modules_lock:
        loaded = _modules.setdefault(driver, {})
        if digest not in loaded:
            loaded[digest] = driver.load_module(cubin)
        return loaded[digest]


#: The reasons already warned about when a kernel ran on the interpreter.
_warned: set[str] = set()


class DeviceProgram(Executable):
    """A compiled artifact loaded through ``driver``: each kernel's module (shared through
    :func:`module_of`), temporaries and scratch owned by the program, every kernel launched
    in order on the stream.

    The kernels assume their pointers are multiples of :data:`ALIGNMENT` (their vector
    loads do); a launch given one that is not (a view starting inside a block, as torch's
    ``x[1:]``) runs the program's twin compiled without that assumption (``unaligned``:
    artifact -> the same artifact compiled so), built on first need."""

    def __init__(self, artifact: bytes, driver: Any, memory: DeviceMemory,
                 unaligned: Callable[[bytes], bytes] | None = None):
        header = json.loads(artifact)
        self.artifact, self.unaligned, self.twin = artifact, unaligned, None
        if "compiled" not in header:
            raise DeviceError(f"cuda: program {header['program']} was not built for a GPU "
                              "target; build it with target='sm_80' or 'sm_90'")
        self.driver, self.memory = driver, memory
        self.name = header["program"]
        self.params = header["params"]
        # Kernels the renderer cannot express run on the reference interpreter, in their
        # place among the launches (a stable sort keeps a split kernel's parts in order).
        delegated = header["interpreted"]
        self.program = parse_program(header["text"]) if delegated else None
        self.steps = sorted([(k["kernel"], j) for j, k in enumerate(header["kernels"])] +
                            [(d["kernel"], d) for d in delegated],
                            key=operator.itemgetter(0))
        self.launches = [launch_of(k, c) for k, c in zip(header["kernels"], header["compiled"])]
        self.functions = [driver.function(module_of(driver, base64.b64decode(c["cubin"])),
                                          c["name"], launch.shared)
                          for c, launch in zip(header["compiled"], self.launches)]
        # The blocks are held here: they return to the pool with the program.
        self.blocks = {i: memory.alloc((max(nbytes, 1),), np.uint8)
                       for i, nbytes in header["temps"].items()}
        self.temps = {i: block.pointer for i, block in self.blocks.items()}
        for i, s in header["scratch"].items():  # split reductions' counters start at 0
            if s["zeroed"]:
                driver.copy_in(self.temps[i], np.zeros(header["temps"][i], np.uint8))
        self.scratch, self.scratch_blocks = [], []
        for launch in self.launches:
            instances = launch.grid[0] * launch.grid[1] * launch.grid[2]
            blocks = [memory.alloc((size * instances,), np.uint8) if size else None
                      for size in (launch.global_scratch, launch.profile_scratch)]
            self.scratch_blocks.append(blocks)
            self.scratch.append(tuple(b.pointer if b is not None else 0 for b in blocks))
        # Each launch's parameters, worked out once: the temporaries' and scratch pointers
        # in place, and the positions the caller's buffers go to (patched per call).
        slot = {b: k for k, b in enumerate(self.params)}
        known = {**{int(i): p for i, p in self.temps.items()}, **dict.fromkeys(slot, 0)}
        self.templates = [
            (parameters(launch, known, scratch),
             tuple((i, slot[b]) for i, b in enumerate(launch.buffers) if b in slot))
            for launch, scratch in zip(self.launches, self.scratch)]

    def launch(self, handles: tuple[int, ...]) -> None:
        if len(handles) != len(self.params):
            raise ShapeError(f"cuda program {self.name}: takes {len(self.params)} buffers, "
                             f"got {len(handles)}")
        if self.unaligned is not None and any(h % ALIGNMENT for h in handles):
            if self.twin is None:
                self.twin = DeviceProgram(self.unaligned(self.artifact), self.driver,
                                          self.memory)
            self.twin.launch(handles)
            return
        for index, step in self.steps:
            if not isinstance(step, int):
                self._interpret(index, step["reason"], self._pointers(handles))
                continue
            launch = self.launches[step]
            if launch.grid[0] == 0:
                continue
            template, patches = self.templates[step]
            params = template.copy()
            for i, k in patches:
                params[i] = handles[k]
            self.driver.launch(self.functions[step], launch.grid, launch.block, launch.shared,
                               params)

    def _pointers(self, handles: tuple[int, ...]) -> dict[int, int]:
        """Every buffer's device address, by its index in the program."""
        pointers = {int(i): p for i, p in self.temps.items()}
        pointers.update(zip(self.params, handles))
        return pointers

    def _interpret(self, index: int, reason: str, pointers: dict[int, int]) -> None:
        """Kernel ``index`` on the interpreter: the program's buffers copied to the host
        (the copies wait for the queued launches), the kernel run, what it writes copied
        back. Slow, and warned about once per reason."""
        # Lazy: only programs with a delegated kernel need the interpreter.
        from hologram.backends.interp.interpreter import run_kernel

        if reason not in _warned:
            _warned.add(reason)
            warnings.warn(f"the cuda backend runs a kernel on the reference interpreter: "
                          f"{reason}", stacklevel=4)
        program, kernel = self.program, self.program.kernels[index]
        self.driver.synchronize()
        memory = []
        for i, buf in enumerate(program.buffers):
            host = np.empty(buf.nbytes, np.uint8)
            self.driver.copy_out(host, pointers[i])
            memory.append(host.view(buf.dtype.storage))
        run_kernel(program, kernel, memory)
        for i in sorted(kernel.writes()):
            self.driver.copy_in(pointers[i], memory[i])
