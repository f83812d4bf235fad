"""DLPack capsules of device memory, built and read with ctypes structs of the DLPack ABI
(``dlpack.h``: ``DLTensor``, ``DLManagedTensor`` and, from DLPack 1.0,
``DLManagedTensorVersioned``).

Host memory never comes here: NumPy exports and imports it. Device memory has no NumPy
array, so :class:`~hologram.backends.cuda.runtime.DeviceMemory` exports its blocks with
:func:`export` (a ``"dltensor_versioned"`` capsule for a consumer that asks for DLPack
1.x with ``max_version``, else a legacy ``"dltensor"`` one) and reads a producer's capsule
with :func:`unpack` (either kind). The layouts are checked against NumPy's own capsules and
against NumPy and torch as consumers (tests/test_cuda_dlpack.py).

Streams follow the protocol too (:func:`consumer_stream`): a consumer names the CUDA
stream it will use the tensor on with ``__dlpack__(stream=...)``, and the producer orders
its queued work before that stream (:meth:`DeviceMemory.export_dlpack
<hologram.backends.cuda.runtime.DeviceMemory.export_dlpack>`: an event recorded on the
producer's stream, waited on by the consumer's), or does nothing for ``stream=-1``. An
importer passes its own stream (:func:`stream_argument`), so the producer orders its work
before it.

Ownership follows the protocol: a capsule still named ``"dltensor"`` (or
``"dltensor_versioned"``) when it is collected was never consumed, so its destructor
calls the tensor's deleter; a consumer renames it (``"used_..."``) and calls the deleter
itself when done, exactly once.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hologram.errors import DeviceError, DTypeError, HologramError

KDL_CPU, KDL_CUDA = 1, 2
#: ``__dlpack__``'s ``stream`` values with a meaning of their own for CUDA (DLPack, the
#: Python array API): no synchronization; the legacy default stream; the calling thread's
#: default stream. The driver takes 1 and 2 as the same streams' handles
#: (``CU_STREAM_LEGACY``, ``CU_STREAM_PER_THREAD``).
NO_SYNC, LEGACY_STREAM, PER_THREAD_STREAM = -1, 1, 2
#: Device type codes by name, for messages.
DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
                10: "rocm", 13: "cuda_managed", 14: "oneapi", 15: "webgpu"}
_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
# DLDataTypeCode: kDLInt, kDLUInt, kDLFloat, kDLComplex, kDLBool, by NumPy's dtype kind
# (kDLBfloat, 4, has no NumPy dtype: :class:`Tensor` keeps its code and bits).
_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_KINDS = {code: kind for kind, code in _CODES.items()}
_BFLOAT = 4


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


_VERSIONED_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion),
                                     ("manager_ctx", ctypes.c_void_p),
                                     ("deleter", _VERSIONED_DELETER),
                                     ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

# The capsule API, called with the GIL held (pythonapi is a PyDLL).
_api = ctypes.pythonapi
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# The destructor gets the capsule as a raw pointer: these take it as one.
_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api))
_pointer_of = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))

# What an exported tensor needs until its deleter runs (its struct, shape, owner), by the
# struct's address.
_exported: dict[int, tuple[Any, ...]] = {}
_exported_lock = threading.Lock()


def _delete(managed: Any) -> None:
    address = ctypes.cast(managed, ctypes.c_void_p).value
    with _exported_lock:
        entry = _exported.pop(address, None)
    if entry is not None and entry[3] is not None:
        try:
            entry[3](entry[2])
        except HologramError as err:  # a C caller cannot take an exception
            warnings.warn(f"DLPack deleter: the block is released at once: {err}",
                          stacklevel=1)


def _destroy_capsule(capsule: int) -> None:
    # Still under its first name: no consumer took it, so the producer's deleter runs here.
    for name, kind in ((b"dltensor", DLManagedTensor),
                       (b"dltensor_versioned", DLManagedTensorVersioned)):
        if _is_valid(capsule, name):
            managed = ctypes.cast(_pointer_of(capsule, name), ctypes.POINTER(kind))
            managed.contents.deleter(managed)


# Kept for the life of the process: C holds these function pointers.
_deleter = _DELETER(_delete)
_versioned_deleter = _VERSIONED_DELETER(_delete)
_capsule_destructor = _CAPSULE_DESTRUCTOR(_destroy_capsule)


def consumer_stream(stream: object) -> int | None:
    """The CUDA stream a consumer's ``__dlpack__(stream=...)`` names, as a driver handle,
    or None where it asks for no synchronization.

    Per the protocol: None (the consumer did not say) and 1 are the legacy default stream
    (handle 1); 2 is the per-thread default stream (handle 2); a larger integer is a
    stream's handle; -1 means no synchronization. 0 is refused (the protocol disallows
    it: it could mean any of the default streams), and so are other values."""
    if stream is None:
        return LEGACY_STREAM
    if isinstance(stream, bool) or not isinstance(stream, (int, np.integer)) or stream == 0 \
            or stream < NO_SYNC:
        raise DeviceError(f"__dlpack__: stream={stream!r} is not a CUDA stream of the DLPack "
                          "protocol; pass None or 1 (the legacy default stream), 2 (the "
                          "per-thread default stream), a stream handle (an int above 2, "
                          "e.g. torch.cuda.current_stream().cuda_stream) or -1 (no "
                          "synchronization); 0 is ambiguous")
    return None if stream == NO_SYNC else int(stream)


def stream_argument(handle: int) -> int:
    """What an importer passes as ``__dlpack__(stream=...)`` for its stream ``handle``:
    the handle, except that the NULL stream (0) is the legacy default stream, which the
    protocol names 1."""
    return LEGACY_STREAM if handle == 0 else handle


def dtype_code(dtype: np.dtype) -> tuple[int, int]:
    """``(DLDataTypeCode, bits)`` of a buffer dtype."""
    return _CODES[dtype.kind], dtype.itemsize * 8


def export(pointer: int, shape: tuple[int, ...], dtype: np.dtype | tuple[int, int],
           device: tuple[int, int], owner: object, max_version: tuple[int, int] | None = None,
           on_delete: Callable[[object], None] | None = None,
           strides: tuple[int, ...] | None = None) -> Any:
    """A capsule of the ``shape`` elements of ``dtype`` (a NumPy dtype, or DLPack's
    ``(code, bits)``) at ``pointer`` on ``device`` (``(device type, id)``), C-contiguous
    or with ``strides`` (in elements): ``"dltensor_versioned"`` (DLPack 1.0, writable)
    when ``max_version`` is 1.x or later, else ``"dltensor"``. ``owner`` (the allocation)
    stays alive until the consumer calls the deleter, or the capsule goes unconsumed;
    ``on_delete(owner)`` is then called, if given (to hold it longer)."""
    versioned = max_version is not None and max_version[0] >= 1
    managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    steps = None if strides is None else (ctypes.c_int64 * max(len(shape), 1))(*strides)
    tensor = managed.dl_tensor
    tensor.data = pointer
    tensor.device = DLDevice(*device)
    tensor.ndim = len(shape)
    code, bits = dtype if isinstance(dtype, tuple) else dtype_code(np.dtype(dtype))
    tensor.dtype = DLDataType(code, bits, 1)
    tensor.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
    # NULL: compact row-major
    tensor.strides = None if steps is None else ctypes.cast(steps, ctypes.POINTER(ctypes.c_int64))
    tensor.byte_offset = 0
    managed.manager_ctx = None
    if versioned:
        managed.version = DLPackVersion(1, 0)
        managed.flags = 0  # writable, not a copy
        managed.deleter = _versioned_deleter
    else:
        managed.deleter = _deleter
    address = ctypes.addressof(managed)
    with _exported_lock:
        _exported[address] = (managed, (dims, steps), owner, on_delete)
    name = b"dltensor_versioned" if versioned else b"dltensor"
    return _api.PyCapsule_New(address, name, _capsule_destructor)


def live_exports() -> int:
    """How many exported tensors are still waiting for their deleter."""
    with _exported_lock:
        return len(_exported)


@dataclass
class Tensor:
    """What a producer's capsule describes; :attr:`release` calls its deleter once (the
    consumer's duty, taken by :func:`unpack`)."""

    data: int  # the first element's address: the tensor's data plus its byte offset
    device: tuple[int, int]
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None  # in elements; None: compact row-major
    dtype: np.dtype | None  # None: a DLPack type NumPy lacks (bfloat16); see code, bits
    byte_offset: int
    read_only: bool
    release: Callable[[], None]
    code: int = 2  # DLPack's DLDataTypeCode and bits
    bits: int = 32

    @property
    def c_contiguous(self) -> bool:
        if self.strides is None:
            return True
        expected = 1
        for n, stride in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and stride != expected:
                return False
            expected *= n
        return True


def unpack(capsule: Any, where: str) -> Tensor:
    """Take ownership of a producer's capsule (renamed ``"used_..."``, as the protocol
    asks of a consumer) and read its tensor. The caller must call ``release()`` once it no
    longer uses the memory. ``where`` names the caller in errors."""
    name = _api.PyCapsule_GetName(capsule)
    if name not in (b"dltensor", b"dltensor_versioned"):
        raise DTypeError(f"{where}: the producer's capsule is named {name!r}, not "
                         "'dltensor' or 'dltensor_versioned' (already consumed?)")
    versioned = name == b"dltensor_versioned"
    kind = DLManagedTensorVersioned if versioned else DLManagedTensor
    address = _api.PyCapsule_GetPointer(capsule, name)
    managed = kind.from_address(address)
    if versioned and managed.version.major != 1:
        raise DTypeError(f"{where}: the producer speaks DLPack {managed.version.major}."
                         f"{managed.version.minor}; only 1.x is understood here")
    tensor = managed.dl_tensor
    dt = tensor.dtype
    kind_code = _KINDS.get(dt.code)
    if (kind_code is None and dt.code != _BFLOAT) or dt.lanes != 1 or dt.bits % 8:
        raise DTypeError(f"{where}: DLPack dtype (code {dt.code}, {dt.bits} bits, {dt.lanes} "
                         "lanes) has no buffer dtype; convert the tensor first (e.g. to "
                         "float32)")
    dtype = (None if kind_code is None else np.dtype(bool) if kind_code == "b"
             else np.dtype(f"{kind_code}{dt.bits // 8}"))
    _api.PyCapsule_SetName(capsule, b"used_dltensor_versioned" if versioned
                           else b"used_dltensor")
    ndim = tensor.ndim
    shape = tuple(tensor.shape[i] for i in range(ndim))
    strides = tuple(tensor.strides[i] for i in range(ndim)) if tensor.strides else None
    deleter = managed.deleter
    pointer = ctypes.cast(address, ctypes.POINTER(kind))
    done = []

    def release() -> None:
        if not done and deleter:
            done.append(True)
            deleter(pointer)

    return Tensor((tensor.data or 0) + tensor.byte_offset,
                  (tensor.device.device_type, tensor.device.device_id), shape, strides, dtype,
                  tensor.byte_offset, versioned and bool(managed.flags & _READ_ONLY), release,
                  dt.code, dt.bits)
