"""Device memory: torch storages over blocks of the backend's memory, and tensors made on
them.

No allocator can be registered with torch from Python, so every device storage is built
here: a block wrapped by a non-owning ``c10::Storage``; the block hangs on the storage's
Python object, which torch preserves for as long as the ``StorageImpl`` lives, so the
block returns to its allocator exactly when the last tensor or view using it is gone. A
tensor is an empty ``TensorImpl`` of the device's dispatch key pointed at such a storage
(``set_`` run by the CPU kernel, which only writes metadata).

Two kinds of memory, chosen with the backend (:func:`use_memory`, before the first
device tensor):

* **host memory** (the cpu and interp backends): blocks of a Hologram pool
  (:meth:`hologram.backends.hostmem.Pool.lease`); the host reads and writes them in
  place, so :func:`cpu_alias` is a CPU tensor on the same memory;
* **device memory** (cuda, webgpu): blocks of the backend's allocator, whose data
  pointers are device addresses (webgpu's made up: a buffer's id and an offset) the host
  never dereferences. The host reaches them by copies only (:func:`read`,
  :func:`write`): :func:`cpu_alias` is then a CPU *copy* of the whole storage (a
  shadow), and code that writes through it calls :func:`write_back`.

On host memory there may be several devices (:func:`set_devices`,
``HOLOGRAM_TORCH_DEVICES``), all on the one pool: a storage is made on the thread's
current device (:func:`on`, :func:`current`), and a tensor on a storage of a device other
than hologram:0 is placed on it natively first (torch's Python API makes hologram:0
tensors, and ``set_`` keeps a tensor's device).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing.queues

import numpy as np
import torch

from hologram.errors import DeviceError, OutOfMemoryError
from hologram.isa.ir import IndexMap
from hologram.runtime import Pool
from hologram_torch import lazy, native
from hologram_torch.constants import CPU_KEYS, NAME

DEVICE = torch.device(NAME, 0)  # memory is imported after the device is registered
_CPU_DEVICE = torch.device("cpu")
#: The devices (``HOLOGRAM_TORCH_DEVICES``, :func:`set_devices`): hologram:0 alone, or
#: several sharing the host's memory, new tensors going to this thread's current one
#: (:func:`current`, :func:`on`: the native device guard's, which torch's own code sets).
DEVICES = [DEVICE]
_construct = torch._C._construct_storage_from_data_pointer
_create = torch._C._acc.create_empty_tensor
_set = torch.ops.aten.set_.source_Storage_storage_offset._handle.redispatch_boxed

_pool = Pool()
#: The device's memory when it is not host memory: ``allocator`` (a backend's
#: :class:`~hologram.backends.base.Allocator` whose handles are device addresses);
#: ``used``: whether a device storage was made yet (the kind of memory is fixed from then
#: on); ``hold``: what keeps let-go blocks from other streams' work (:func:`hold_released`);
#: ``resolve``: the choice of memory deferred to its first use (:func:`defer`).
_device: dict = {"allocator": None, "used": False, "hold": None, "resolve": None}
SPARSE_UNSUPPORTED = (
    f"sparse tensors are not supported on the {NAME} device (its storages are dense "
    "memory blocks); keep sparse tensors and sparse ops on the CPU: x.cpu().to_sparse()")
QUANTIZED_UNSUPPORTED = (
    f"quantized tensors are not supported on the {NAME} device (it has no quantizer "
    "and no quantized kernels); quantize on the CPU: torch.quantize_per_tensor(x.cpu(), ...)")
# torch 2.13's storages can exchange their data pointers and sizes (StorageBase.
# _swap_data_ptr_, undocumented): feature-checked, with set_ as the fallback.
_SWAP = hasattr(torch.UntypedStorage, "_swap_data_ptr_")


def pool() -> Pool:
    """The pool every device tensor's memory comes from on host memory."""
    return _pool


def allocator():
    """The allocator of the device's memory: the pool, or the backend's device memory."""
    if _device["resolve"] is not None:
        _resolve()
    return _device["allocator"] or _pool


def host_memory() -> bool:
    """Is the device's memory host memory (the host reads and writes it in place)?"""
    if _device["resolve"] is not None:
        _resolve()
    return _device["allocator"] is None


def defer(resolve) -> None:
    """Choose the device's memory when it is first needed, by calling ``resolve()`` (which
    calls :func:`use_memory`); None: nothing deferred."""
    _device["resolve"] = resolve


def _resolve() -> None:
    resolve, _device["resolve"] = _device["resolve"], None
    resolve()


def use_memory(device_allocator, name: str) -> None:
    """Make device tensors from now on in host memory (``device_allocator`` None) or in
    ``device_allocator``'s memory (backend ``name``'s). Refused once a device tensor has
    been made in another kind of memory: tensors cannot move under torch's feet."""
    if device_allocator is _device["allocator"]:
        return
    if _device["used"]:
        where = "host memory" if _device["allocator"] is None else "device memory"
        raise DeviceError(
            f"{NAME}: cannot switch the device to backend {name!r}: device tensors already "
            f"live in {where}; choose the backend before the first {NAME} tensor "
            f"(HOLOGRAM_TORCH_BACKEND={name}, or hologram_torch.set_backend({name!r}) "
            "first thing)")
    _device["allocator"] = device_allocator


def stats() -> dict:
    """The memory's counters (the pool's, or the backend allocator's)."""
    return allocator().stats()


def empty_cache() -> None:
    allocator().empty_cache()


def synchronize() -> None:
    """Wait for every kernel and copy queued on the device's memory."""
    if _device["allocator"] is not None:
        _device["allocator"].synchronize()


def read(address: int, nbytes: int) -> np.ndarray:
    """``nbytes`` of device memory from ``address`` (a data pointer), as a new host array
    of bytes: a copy that waits for the kernels queued before it."""
    out = np.empty(nbytes, np.uint8)
    if nbytes:
        allocator().read(address, out)
    return out


def write(address: int, data: np.ndarray) -> None:
    """Copy the C-contiguous host array ``data`` to device memory at ``address``."""
    if data.nbytes:
        allocator().write(address, np.ascontiguousarray(data))


def copy(destination: int, source: int, nbytes: int) -> None:
    """Copy ``nbytes`` of device memory between two addresses, in order with the
    kernels queued before (on host memory: a ``memmove``)."""
    allocator().copy(destination, source, nbytes)


class DeviceOutOfMemoryError(OutOfMemoryError, torch.OutOfMemoryError):
    """The device's pool cannot give a block: PyTorch's ``torch.OutOfMemoryError`` (what
    code written for CUDA catches) and Hologram's :class:`OutOfMemoryError`."""


class _DeviceLease:
    """A block of a backend's device memory, as the storages hold it: ``address`` (the
    device address) and the allocation, which returns to its allocator when this goes."""

    __slots__ = ("address", "block")

    def __init__(self, block, address: int):
        self.block, self.address = block, address

    def __del__(self) -> None:
        hold = _device["hold"]
        if hold is not None:  # side streams may still use it (hologram_torch.streams)
            # (a finalizer: at exit the driver may be gone, and with it every stream's work)
            with contextlib.suppress(Exception):
                hold(self.block)


def hold_released(hold) -> None:
    """From now on, hand each device block its tensors let go to ``hold(block)``, which
    keeps it until no stream's queued work can use it (:mod:`.streams`)."""
    _device["hold"] = hold


def _lease(nbytes: int):
    if _device["resolve"] is not None:
        _resolve()
    _device["used"] = True
    try:
        device = _device["allocator"]
        if device is None:
            return _pool.lease(nbytes)
        block = device.alloc((nbytes,), np.uint8)
        return _DeviceLease(block, device.handle(block))
    except OutOfMemoryError as e:
        raise DeviceOutOfMemoryError(f"{NAME}:0 is out of memory. {e}") from None


# --- several devices ----------------------------------------------------------------------

def set_devices(count: int) -> None:
    """Make ``count`` devices, hologram:0 to hologram:<count - 1>, all on the host pool's
    memory (the caller checks that the memory is host memory and tells torch's guard)."""
    DEVICES[:] = [torch.device(NAME, i) for i in range(count)]


def device_count() -> int:
    return len(DEVICES)


def current() -> int:
    """The device new tensors of this thread go to."""
    return native.current_device() if len(DEVICES) > 1 else 0


@contextlib.contextmanager
def on(index: int):
    """New tensors of this thread go to hologram:``index`` in the block (a kernel's
    results go to its operands' device, as under CUDA's device guards)."""
    before = native.current_device()
    native.set_current_device(index)
    try:
        yield
    finally:
        native.set_current_device(before)


#: Ops whose tensors may be on different devices: copies between them.
CROSS_DEVICE = frozenset({"aten::copy_", "aten::_to_copy", "aten::_copy_from",
                          "aten::_copy_from_and_resize", "aten::to"})


def operands_device(name: str, args: tuple, kwargs: dict) -> int:
    """The device a call of op ``name`` runs on, where several devices exist: its
    ``device`` argument (a factory's, a copy's target), else its device tensors' (which
    must all be on one device: PyTorch's error otherwise), else the current one."""
    target = kwargs.get("device")
    if target is not None:
        target = torch.device(target)
        if target.type == NAME:
            return current() if target.index is None else target.index
    index = None
    for x in (*args, *kwargs.values()):
        for t in (x if isinstance(x, (list, tuple)) else (x,)):
            if isinstance(t, torch.Tensor) and t.device.type == NAME:
                if index is None:
                    index = t.device.index
                elif t.device.index != index and name not in CROSS_DEVICE:
                    raise RuntimeError(
                        "Expected all tensors to be on the same device, but found at least "
                        f"two devices, {NAME}:{index} and {NAME}:{t.device.index}!")
    return current() if index is None else index


def _target() -> torch.device:
    return DEVICES[native.current_device()] if len(DEVICES) > 1 else DEVICE


def storage(nbytes: int) -> torch.UntypedStorage:
    """A new device storage of ``nbytes`` uninitialized bytes, on the current device."""
    if nbytes == 0:
        return _construct(0, _target(), 0)
    lease = _lease(nbytes)
    st = _construct(lease.address, _target(), nbytes)
    st._hologram = lease  # the block returns to the pool when the storage dies
    return st


def shared_storage(address: int, nbytes: int, owner: object) -> torch.UntypedStorage:
    """A device storage of ``nbytes`` at ``address``, memory another library owns
    (:mod:`.dlpack`): ``owner`` (its tensor; on GPU memory, the allocator's block of it)
    is kept alive by the storage."""
    _device["used"] = True
    st = _construct(address, DEVICE, nbytes)
    st._hologram = owner if _device["allocator"] is None else _DeviceLease(owner, address)
    return st


def contiguous_strides(size) -> list[int]:
    strides, step = [], 1
    for n in reversed(size):
        strides.append(step)
        step *= n if n > 1 else 1
    strides.reverse()
    return strides


def dense(size, stride) -> bool:
    """Does the layout address each of ``numel`` consecutive elements exactly once
    (PyTorch's ``is_non_overlapping_and_dense``)?"""
    step = 1
    for n, s in sorted(((n, s) for n, s in zip(size, stride) if n != 1), key=lambda d: d[1]):
        if n == 0:
            return True
        if s != step:
            return False
        step *= n
    return True


def span(size, stride) -> int:
    """Elements from the first to one past the last element a layout addresses."""
    if 0 in size:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(size, stride))


def point_at(t: torch.Tensor, st: torch.UntypedStorage, offset: int, size, stride
             ) -> torch.Tensor:
    """Make device tensor ``t`` view ``st`` (metadata only, like ``t.set_``)."""
    _set(CPU_KEYS, t, st, offset, size, stride)
    return t


def on_storage(st: torch.UntypedStorage, dtype: torch.dtype, size, stride,
               offset: int = 0) -> torch.Tensor:
    """A device tensor viewing ``st``."""
    t = _create([0], dtype)  # (on hologram:0: another device's storage is placed first)
    if st.device.index:
        native.place(t, st)
    _set(CPU_KEYS, t, st, offset, size, stride)
    return t


def new(size: list[int], stride: list[int] | None, nbytes: int, dtype: torch.dtype
        ) -> torch.Tensor:
    """A new device tensor of ``nbytes``, contiguous (``stride`` None) or with the dense
    ``stride`` (a permutation of the dimensions: channels_last, a transposed result): the
    kernels' hot path. ``create_empty_tensor(size)`` already has the contiguous metadata,
    on a null storage; swapping our block's pointer into that storage costs half of a
    ``set_`` (which goes through the dispatcher)."""
    if stride is not None or not _SWAP or not nbytes or len(DEVICES) > 1:
        # (create_empty_tensor's strides of (0, 1) are (0, 1))
        return on_storage(storage(nbytes), dtype, size,
                          contiguous_strides(size) if stride is None else stride)
    t = _create(size, dtype)
    # storage()'s steps, inlined: this is every op's allocation
    lease = _lease(nbytes)
    st = t.untyped_storage()
    st._swap_data_ptr_(_construct(lease.address, DEVICE, nbytes))
    st._hologram = lease
    return t


def empty(size, dtype: torch.dtype | None = None, stride=None) -> torch.Tensor:
    """A new device tensor (contiguous unless ``stride`` is given)."""
    dtype = dtype or torch.get_default_dtype()
    if stride is None:
        if _SWAP and len(DEVICES) == 1:  # new()'s path: no set_ through the dispatcher
            return new(size, None, math.prod(size) * dtype.itemsize, dtype)
        stride = contiguous_strides(size)
        nbytes = math.prod(size) * dtype.itemsize
    else:
        nbytes = span(size, stride) * dtype.itemsize
    return on_storage(storage(nbytes), dtype, size, stride)


def cpu_alias(t: torch.Tensor, storages: dict | None = None, *,
              read_only: bool = False) -> torch.Tensor:
    """An ordinary CPU tensor standing for ``t``, with ``t``'s layout; it keeps ``t``'s
    storage alive and is not resizable. On host memory it shares ``t``'s memory (no copy);
    on device memory it views a CPU copy of ``t``'s whole storage (a shadow), and the
    caller that writes through it makes the writes land with :func:`write_back`.
    ``storages``: CPU storages made so far, by device storage address; aliases of one
    device storage made with the same dict share one CPU storage, so CPU kernels see that
    they overlap. Pending recorded ops that read or write the memory run first
    (:mod:`.lazy`): the host is about to read or write it; ``read_only``: the host only
    reads it, and only pending writes run."""
    if not (lazy.unwritten(t) if read_only else lazy.untouched(t)):
        lazy.sync("host")
    st = t.untyped_storage()
    key = st.data_ptr()
    cst = None if storages is None else storages.get(key)
    if cst is None:
        cst = _host_storage(st)
        if storages is not None:
            storages[key] = cst
    return torch.empty(0, dtype=t.dtype).set_(cst, t.storage_offset(), t.shape, t.stride())


def _host_storage(st: torch.UntypedStorage) -> torch.UntypedStorage:
    """A CPU storage of device storage ``st``'s bytes: the same memory (host memory), or
    a copy of them (device memory; a shadow that :func:`write_back` copies back)."""
    if _device["allocator"] is None:
        cst = _construct(st.data_ptr(), _CPU_DEVICE, st.nbytes())
        cst._hologram_storage = st
        return cst
    # (a storage made by torch from the bytes: not resizable, as the host alias is not)
    host = read(st.data_ptr(), st.nbytes())
    cst = _construct(host.ctypes.data, _CPU_DEVICE, host.nbytes)
    cst._hologram_storage, cst._hologram_shadow = st, host
    return cst


def write_back(*aliases: torch.Tensor | torch.UntypedStorage) -> None:
    """Make what the host wrote through :func:`cpu_alias` or :func:`cpu_alias_bytes`
    tensors (or their storages) land in device memory: their shadows are copied back.
    Nothing to do on host memory, where the aliases are the memory."""
    if _device["allocator"] is None:
        return
    done = set()
    for c in aliases:
        cst = c if isinstance(c, torch.UntypedStorage) else c.untyped_storage()
        host = getattr(cst, "_hologram_shadow", None)
        if host is not None and id(host) not in done:
            done.add(id(host))
            write(cst._hologram_storage.data_ptr(), host)


def upload(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> None:
    """``dst.copy_(src)`` from the CPU tensor ``src`` into the device tensor ``dst`` (cast
    and broadcast as ``copy_`` does): one copy of the bytes where both are contiguous
    with one shape and dtype (on device memory: no shadow), else through
    :func:`cpu_view`. ``non_blocking`` from pinned memory (``src.pin_memory()``): the
    copy is queued on the current stream and the host returns at once (on GPU memory;
    elsewhere copies are synchronous), as with CUDA."""
    if (_device["allocator"] is not None and dst.is_contiguous() and src.is_contiguous()
            and src.shape == dst.shape and src.dtype == dst.dtype
            and not _bits(src) and not _bits(dst)):
        if not lazy.untouched(dst):
            lazy.sync("host")
        if non_blocking and src.is_pinned():
            _device["allocator"].write_async(dst.data_ptr(), host_bytes(src), src)
        else:
            write(dst.data_ptr(), host_bytes(src))
        return
    alias = cpu_view(dst)
    alias.copy_(src)
    write_back(alias)


def _bits(t: torch.Tensor) -> bool:
    """Is ``t`` a conjugate or negative view, or a zero tensor (autograd's zeros without
    memory), which its raw memory does not show?"""
    return t.is_conj() or t.is_neg() or t._is_zerotensor()


def cpu_view(x: torch.Tensor, storages: dict | None = None) -> torch.Tensor:
    """:func:`cpu_alias` of ``x`` that means what ``x`` means: with ``x``'s lazy conjugate
    and negative bits (``z.conj()``, ``z.conj().imag`` are views that only set a bit),
    which CPU kernels and copies honour and the raw alias lacks."""
    c = cpu_alias(x, storages)
    if x.is_conj():
        c = c.conj()
    if x.is_neg():
        c = c._neg_view()
    return c


def download(src: torch.Tensor) -> torch.Tensor:
    """A CPU tensor holding the device tensor ``src``'s values, in its layout (read-only
    use: on host memory it is an alias)."""
    if _device["allocator"] is not None and src.is_contiguous() and not _bits(src):
        if not src.numel():
            return torch.empty(src.shape, dtype=src.dtype)
        if not lazy.unwritten(src):
            lazy.sync("host")
        host = read(src.data_ptr(), src.numel() * src.element_size())
        return torch.from_numpy(host).view(src.dtype).view(src.shape)
    return cpu_view(src)


def host_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of the contiguous CPU tensor ``t`` (any dtype, 0-d included)."""
    if not t.numel():
        return np.empty(0, np.uint8)
    flat = t.reshape(-1)
    if flat.numel() == 1:  # contiguous whatever its stride: 0 where a scalar was expanded
        flat = flat.as_strided((1,), (1,))
    return flat.view(torch.uint8).numpy()


def from_cpu(t: torch.Tensor) -> torch.Tensor:
    """A device copy of the CPU tensor ``t``, in ``t``'s layout when that is dense (a
    channels_last or transposed result of a CPU kernel stays so), else contiguous."""
    stride = list(t.stride())
    keep = t.dim() > 1 and stride != contiguous_strides(t.shape) and dense(t.shape, stride)
    out = empty(t.shape, t.dtype, stride if keep else None)
    if out.numel():
        upload(out, t)
    return out


def resize(t: torch.Tensor, size, memory_format: torch.memory_format | None = None
           ) -> torch.Tensor:
    """``t.resize_(size, memory_format=...)``, keeping the data that fits (torch's
    semantics for a tensor that owns its storage; views of the old storage keep the old
    memory). A tensor resized to its own size keeps its strides; a new size is contiguous;
    then a ``memory_format`` restrides it to that format (``preserve_format`` is refused,
    as PyTorch refuses it)."""
    size = list(size)
    stride = list(t.stride()) if size == list(t.shape) else contiguous_strides(size)
    if memory_format is torch.preserve_format:
        raise RuntimeError("Unsupported memory formatPreserve")  # PyTorch's words
    if memory_format is not None:
        # PyTorch's restride: the format's strides for this size (meta: no memory)
        stride = list(torch.empty(size, device="meta", memory_format=memory_format).stride())
    need = (t.storage_offset() + span(size, stride)) * t.element_size()
    st = t.untyped_storage()
    if need > st.nbytes():
        with on(t.device.index or 0):  # (the tensor's device, where several exist)
            new = storage(need)
        if st.nbytes():
            if not (lazy.untouched(st) and lazy.untouched(new)):  # (new: a dead temporary's
                lazy.sync("host")                                 # block a region writes)
            copy(new.data_ptr(), st.data_ptr(), st.nbytes())
        st = new
    _set(CPU_KEYS, t, st, t.storage_offset(), size, stride)
    return t


def cpu_alias_bytes(st: torch.UntypedStorage) -> torch.Tensor:
    """The bytes of a device storage as a CPU uint8 tensor (as :func:`cpu_alias`: the
    memory itself, or a shadow that :func:`write_back` writes), after the pending
    recorded ops that read or write it."""
    if not lazy.untouched(st):
        lazy.sync("host")
    return torch.empty(0, dtype=torch.uint8).set_(_host_storage(st))


def internal_overlap(t: torch.Tensor) -> bool:
    """May several elements of ``t`` share one memory location (an expanded tensor, an
    overlapping ``as_strided`` view)? The ISA's test of a store
    (:meth:`~hologram.isa.ir.IndexMap.is_injective`), which is sufficient, not necessary:
    some layouts it refuses (a diagonal view) are written by the CPU kernel instead."""
    return not t.is_contiguous() and not IndexMap(0, tuple(t.stride())).is_injective(
        tuple(t.shape))


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``t`` spans: [first, one past the last)."""
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + t.nbytes
    return start, start + span(t.shape, t.stride()) * t.element_size()


def unsafe_write(out: torch.Tensor, inputs) -> bool:
    """Is writing ``out`` element by element, while reading ``inputs`` (tensors and
    anything else), more than a program can do? Yes when ``out`` overlaps itself, or
    shares memory with an input other than element for element (an in-place op on its
    own operand). PyTorch raises for most such writes and computes some; the caller runs
    the CPU kernel on aliases of the memory, which does whichever PyTorch does. (On every
    in-place and ``out=`` call: kept to a few cheap tensor queries per input.)"""
    start = out.data_ptr()
    if out.is_contiguous():
        end = start + out.nbytes
    elif internal_overlap(out):
        return True
    else:
        end = start + span(out.shape, out.stride()) * out.element_size()
    if start == end:
        return False
    for t in inputs:
        if t is out or not isinstance(t, torch.Tensor) or t.is_cpu:
            continue
        t_start, t_end = _extent(t)
        if t_start < end and start < t_end and not (
                t_start == start and t.stride() == out.stride() and t.shape == out.shape):
            return True
    return False


# --- device tensors and other processes ------------------------------------------------

def holds_device_tensor(obj: object, depth: int = 6) -> bool:
    """Does ``obj`` hold a device tensor or storage: itself, inside containers, or in an
    object's attributes (a module's parameters), ``depth`` levels down?"""
    seen: set[int] = set()

    def walk(x: object, level: int) -> bool:
        if isinstance(x, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
            return x.device.type == NAME
        if level == 0 or id(x) in seen or isinstance(x, (str, bytes, int, float)):
            return False
        seen.add(id(x))
        if isinstance(x, dict):
            return any(walk(k, level - 1) or walk(v, level - 1) for k, v in x.items())
        if isinstance(x, (list, tuple, set, frozenset)):
            return any(walk(v, level - 1) for v in x)
        attributes = getattr(x, "__dict__", None)
        return isinstance(attributes, dict) and walk(attributes, level - 1)

    return walk(obj, depth)


_queue_put = multiprocessing.queues.Queue.put


def _put(self, obj, block=True, timeout=None):
    # A Queue pickles in a feeder thread: a device tensor there (whose pool memory cannot
    # be shared with another process) would be dropped with a traceback and never arrive.
    if holds_device_tensor(obj):
        raise RuntimeError(
            f"multiprocessing: a {NAME} tensor cannot be sent to another process (its "
            f"memory is a block of this process's pool and cannot be shared); put a CPU "
            f"copy (t.cpu()) and move it back with .to('{NAME}') in the receiver")
    return _queue_put(self, obj, block, timeout)


# torch.multiprocessing.Queue is this class too (torch only registers its pickling)
multiprocessing.queues.Queue.put = _put
