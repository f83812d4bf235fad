"""Paths of torch that need help from a Python device: serialization, storage copies,
deep copies, pinned memory, autocast and ``torch.accelerator``.

PyTorch's C++ core asks ``c10::GetAllocator(PrivateUse1)`` (and, for pinning and device
generators, hooks the Python device interface cannot provide) on a few paths. No
allocator can be registered from Python, so those paths dereference a null allocator and
*segfault*. Each such path has a Python-level entry point; :func:`install` patches exactly
those, sending hologram cases to our pool (:mod:`hologram_torch.memory`) and everything
else to the original. It is idempotent and runs when the package is imported.

What each patch gives (and what stays unsupported, with a clear error):

* ``torch.UntypedStorage(n, device='hologram')`` (and ``TypedStorage``, ``.new()``)
  allocate from the pool; so ``storage.clone()``, ``copy.copy``/``copy.deepcopy`` of
  tensors, parameters and modules, ``torch.load`` and ``pickle`` work.
* ``torch.save``/``torch.load``: a tagger and deserializer for ``hologram`` locations.
* ``storage.resize_()`` and ``share_memory_()`` of device storages raise
  :class:`UnsupportedError` (pool blocks cannot grow in place, nor be shared with other
  processes).
* Pinned memory comes from the native hooks (:mod:`hologram_torch.native`): on host
  memory, ordinary host memory that ``is_pinned()`` recognizes; on a GPU's memory, the
  driver's page-locked memory (``pin_memory()`` starts the device's memory first).
  Without them (no C++ compiler), ``Tensor.pin_memory()`` (so
  ``DataLoader(pin_memory=True)``) returns an ordinary CPU copy, warning once, and
  ``torch.empty(..., pin_memory=True)`` (a C++ factory) raises torch's
  ``NotImplementedError``. ``x.to('cpu', non_blocking=True)`` copies synchronously.
* ``torch.autocast('hologram')`` follows PyTorch's CPU autocast policy
  (:mod:`hologram_torch.autocast`); ops on none of its lists run as they are.
* ``torch.accelerator.synchronize()`` and the ``torch.accelerator`` memory queries answer
  for the hologram device.
* ``torch.Generator(device='hologram')`` raises torch's ``NotImplementedError`` (no
  device generators; random ops draw from the CPU generator, see
  :func:`torch.hologram.manual_seed`).
"""

from __future__ import annotations

import functools
import threading
import warnings

import torch

from hologram.errors import DeviceError
from hologram_torch import memory, native
from hologram_torch.constants import NAME
from hologram_torch.device import _index

_installed = False
_install_lock = threading.Lock()
_libraries: list[torch.library.Library] = []  # registrations live as long as these do
_pin_warned = False


class UnsupportedError(DeviceError, RuntimeError):
    """The operation cannot be supported on the hologram device (a ``RuntimeError`` too,
    so code written for torch's own errors still catches it)."""


def _is_ours(device: object) -> bool:
    """Does ``device`` (a ``torch.device``, string or index) name the hologram device?
    A bare index means the current accelerator, as it does for torch."""
    if device is None:
        return False
    try:
        return torch.device(device).type == NAME
    except (RuntimeError, TypeError, ValueError):
        return False  # not a device at all: let torch's own code raise its error


def _accelerator_is_ours() -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == NAME


# --- storages ---------------------------------------------------------------------------

def _new_storage(*args, device, allocator=None):
    """``torch.UntypedStorage(...)`` for the device: its C++ constructor would call the
    missing PrivateUse1 allocator (a segfault), so allocate from the pool instead."""
    index = _index(device)  # hologram:2 does not exist: a clear error
    with memory.on(index):
        return _new_device_storage(*args, allocator=allocator)


def _new_device_storage(*args, allocator=None):
    if allocator is not None:
        raise UnsupportedError("hologram storages come from the Hologram pool; a custom "
                               "allocator cannot be used for them")
    if len(args) > 1:
        raise TypeError(f"UntypedStorage() takes at most 1 positional argument "
                        f"({len(args)} given)")
    if not args:
        return memory.storage(0)
    if isinstance(args[0], int):
        if args[0] < 0:
            raise RuntimeError(f"UntypedStorage: size must be non-negative, got {args[0]}")
        return memory.storage(args[0])
    # A sequence of byte values: build it on the CPU (torch's own parsing and errors),
    # then copy the bytes into device memory.
    host = _original["storage_new"](torch.UntypedStorage, args[0])
    st = memory.storage(host.nbytes())
    if host.nbytes():
        alias = memory.cpu_alias_bytes(st)
        alias.copy_(torch.empty(0, dtype=torch.uint8).set_(host))
        memory.write_back(alias)
    return st


def _storage_new(cls, *args, **kwargs):
    if _is_ours(kwargs.get("device")):
        return _new_storage(*args, **kwargs)
    return _original["storage_new"](cls, *args, **kwargs)


def _storage_new_empty(self):
    # UntypedStorage.new() (an empty storage on the same device) is C++ that allocates.
    if self.device.type == NAME:
        with memory.on(self.device.index or 0):
            return memory.storage(0)
    return _original["storage_new_empty"](self)


def _storage_resize_(self, size):
    # The C++ resize asks the device interface for resizePrivateUse1Bytes, which the
    # Python hooks cannot provide; a pool block cannot grow in place either.
    if self.device.type == NAME:
        raise UnsupportedError(
            "a hologram storage cannot be resized in place; resize the tensor instead "
            "(t.resize_(...) reallocates its storage) or allocate a new one")
    return _original["storage_resize_"](self, size)


def _storage_share_memory_(self, *args, **kwargs):
    # torch treats non-CPU storages as already shareable (true of CUDA IPC), but pool
    # memory is private to this process: saying "shared" would be a lie.
    if self.device.type == NAME:
        raise UnsupportedError(
            "hologram tensors live in this process's Hologram pool and cannot be moved to "
            "shared memory; share a CPU copy instead (t.cpu().share_memory_())")
    return _original["storage_share_memory_"](self, *args, **kwargs)


# --- serialization ----------------------------------------------------------------------

def _tag(storage) -> str | None:
    """torch.save's location tag of a device storage (``hologram:0``)."""
    if storage.device.type == NAME:
        return f"{NAME}:{storage.device.index or 0}"
    return None


def _deserialize(storage, location: str):
    """torch.load's restore for ``hologram`` locations (stored tags, or ``map_location``
    naming the device): copy the CPU bytes read from the checkpoint into the pool."""
    if not (location == NAME or location.startswith(f"{NAME}:")):
        return None
    index = _index(location)
    if isinstance(storage, torch.TypedStorage):
        storage = storage._untyped_storage
    if storage.device.type == NAME:
        return storage
    with memory.on(index):
        st = memory.storage(storage.nbytes())
    if storage.nbytes():
        source = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        alias = memory.cpu_alias_bytes(st)
        alias.copy_(source)
        memory.write_back(alias)
    return st


# --- pinned memory and non-blocking copies ----------------------------------------------

def _pin_memory(self, device=None):
    # Pinning asks the device interface for a pinned-memory allocator, which only the
    # native hooks provide; without them DataLoader(pin_memory=True) would fail on every
    # batch. The device's memory is host memory: copies need no pinning, and an ordinary
    # copy (pin returns a new tensor too) keeps the caller's semantics.
    if not native.active() and self.device.type == "cpu" and (
            _is_ours(device) if device is not None else _accelerator_is_ours()):
        global _pin_warned
        if not _pin_warned:
            _pin_warned = True
            warnings.warn("pin_memory() with the hologram device returns an ordinary CPU "
                          "copy: the device's memory is host memory, so pinning would "
                          "not speed anything up", UserWarning, stacklevel=2)
        return self.clone()
    if device is None or _is_ours(device):
        # The device's memory starts now if its choice was deferred: on a GPU the hooks'
        # pinned memory is then the driver's page-locked memory (aten/runner.py's
        # _select), not ordinary memory that copies would stage.
        memory.allocator()
    if device is None:
        return _original["pin_memory"](self)
    return _original["pin_memory"](self, device)


# --- torch.accelerator ------------------------------------------------------------------

def _accelerator_synchronize(device=None, /):
    # torch.accelerator.synchronize() asks the device guard to synchronize, which the
    # Python device guard does not implement (a RuntimeError). Kernels are synchronous.
    if _accelerator_is_ours():
        torch.hologram.synchronize(device)
        return None
    return _original["accelerator_synchronize"](device)


def _accelerator_memory(name: str):
    # The torch.accelerator memory queries ask for a c10 DeviceAllocator, which a Python
    # device cannot register (an INTERNAL ASSERT); the device module has the answers.
    original = getattr(torch.accelerator.memory, name)

    @functools.wraps(original)
    def query(device_index=None, /):
        if _accelerator_is_ours():
            fn = getattr(torch.hologram, name)
            return fn() if name == "empty_cache" else fn(device_index)
        return original() if name == "empty_cache" else original(device_index)

    query._hologram_original = original
    return query


_ACCELERATOR_MEMORY = ("empty_cache", "memory_allocated", "max_memory_allocated",
                       "memory_reserved", "memory_stats", "reset_peak_memory_stats")


# --- installation -----------------------------------------------------------------------

_original: dict[str, object] = {}


def install() -> None:
    """Install every patch and registration above (idempotent)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        storage = torch.UntypedStorage
        _original["storage_new"] = storage.__new__
        _original["storage_new_empty"] = storage.new
        _original["storage_resize_"] = storage.resize_
        _original["storage_share_memory_"] = storage.share_memory_
        _original["pin_memory"] = torch.Tensor.pin_memory
        _original["accelerator_synchronize"] = torch.accelerator.synchronize

        storage.__new__ = staticmethod(_storage_new)
        storage.new = _storage_new_empty
        storage.resize_ = _storage_resize_
        storage.share_memory_ = _storage_share_memory_
        torch.Tensor.pin_memory = _pin_memory

        # Priority 9 runs before torch's own taggers (CPU is 10, PrivateUse1 23, whose
        # deserializer would construct the storage through C++).
        torch.serialization.register_package(9, _tag, _deserialize)

        # Without a kernel for AutocastPrivateUse1, every op inside
        # torch.autocast('hologram') fails to dispatch. A fallthrough runs each op as is;
        # the ops of the autocast policy have kernels of their own (hologram_torch.autocast).
        autocast = torch.library.Library("_", "IMPL")
        autocast.fallback(torch.library.fallthrough_kernel,
                          dispatch_key="AutocastPrivateUse1")
        _libraries.append(autocast)

        torch.accelerator.synchronize = _accelerator_synchronize
        for name in _ACCELERATOR_MEMORY:
            query = _accelerator_memory(name)
            setattr(torch.accelerator.memory, name, query)
            setattr(torch.accelerator, name, query)
        _installed = True


install()

__all__ = ["UnsupportedError", "install"]
