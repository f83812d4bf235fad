"""DLPack for device tensors: their memory shared with other libraries, no copy.

    c = torch.from_dlpack(t)            # t on the device: c shares its memory
    a = np.from_dlpack(t)               # (host memory)
    t = hologram_torch.from_dlpack(c)   # also torch.hologram.from_dlpack

What a device tensor exports is the memory it lives in (:mod:`.memory`):

* **host memory** (cpu, interp): a kDLCPU tensor, which NumPy, torch's CPU tensors and any
  host consumer take; :func:`from_dlpack` takes host producers (NumPy arrays, CPU tensors).
* **GPU memory** (cuda): a kDLCUDA tensor on the GPU, which torch's CUDA tensors, CuPy or
  JAX take; :func:`from_dlpack` takes producers of memory on the same GPU. Streams follow
  the protocol both ways: the consumer's stream waits for the work queued on the
  device's current stream (an event, not a host wait), and an import hands the producer
  our current stream, so it orders its work before ours; memory taken from a producer
  goes back to it only once our queued work is done.
* **emulated GPU memory** (``HOLOGRAM_CUDA_EMULATE=1``) and webgpu's buffers: refused
  both ways (no other library can address them, and the host may not read them).

Exporting is a cut of the recorded ops (:mod:`.lazy`): those that read or write the
tensor run first. Device ops after the export may run later, as on a GPU: a host
consumer reads their results after ``torch.hologram.synchronize()``. As with torch's own
tensors, tensors that require grad or carry a conjugate or negative bit are refused
(``BufferError``), and ``dl_device``/``copy`` ask for a copy on the host or on the
device.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.dlpack import DLDeviceType

from hologram.backends.cuda import dlpack as cuda_dlpack
from hologram.errors import DeviceError
from hologram_torch import lazy, memory
from hologram_torch.constants import NAME

#: DLPack's ``(DLDataTypeCode, bits)`` of each dtype the device takes.
CODES = {torch.bool: (6, 8), torch.uint8: (1, 8), torch.uint16: (1, 16),
         torch.uint32: (1, 32), torch.uint64: (1, 64), torch.int8: (0, 8),
         torch.int16: (0, 16), torch.int32: (0, 32), torch.int64: (0, 64),
         torch.float16: (2, 16), torch.bfloat16: (4, 16), torch.float32: (2, 32),
         torch.float64: (2, 64), torch.complex64: (5, 64), torch.complex128: (5, 128)}
_DTYPES = {code: dtype for dtype, code in CODES.items()}


def _gpu():
    """The GPU allocator of the device's memory, or None on host memory; memory no other
    library can address (the emulated GPU's, webgpu's buffers) is refused."""
    if memory.host_memory():
        return None
    allocator = memory.allocator()
    if not hasattr(allocator, "take_dlpack"):
        whose = ("the emulated GPU's (HOLOGRAM_CUDA_EMULATE=1)" if allocator.device == "cuda"
                 else f"{allocator.device} buffers, which have no addresses")
        raise DeviceError(f"DLPack: the {NAME} device's memory is {whose}, which no other "
                          "library can read; share a CPU copy (t.cpu()) instead")
    return allocator


def dlpack_device(t: torch.Tensor) -> tuple[DLDeviceType, int]:
    """``t.__dlpack_device__()`` of a device tensor: kDLCPU on host memory, kDLCUDA and the
    GPU's ordinal on GPU memory, kDLExtDev on the emulated GPU's."""
    if memory.host_memory():
        return DLDeviceType.kDLCPU, 0
    allocator = memory.allocator()
    if not hasattr(allocator, "take_dlpack"):
        return DLDeviceType.kDLExtDev, 0
    return DLDeviceType.kDLCUDA, allocator.device_id


def export(t: torch.Tensor, stream: object = None, max_version: tuple[int, int] | None = None,
           dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
    """``t.__dlpack__(...)`` of a device tensor (the protocol's arguments)."""
    if t.requires_grad:  # torch's own checks and words
        raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
    if t.is_conj():
        raise BufferError("Can't export tensors with the conjugate bit set")
    if t.layout != torch.strided:
        raise BufferError("Can't export tensors with layout other than torch.strided")
    if t.is_neg():
        raise BufferError("Can't export tensors with the negative bit set; use "
                          "tensor.resolve_neg() first")
    here = tuple(map(int, dlpack_device(t)))
    wanted = here if dl_device is None else tuple(map(int, dl_device))
    if wanted != here:
        if wanted != (int(DLDeviceType.kDLCPU), 0):
            raise BufferError(f"{NAME} tensors export to DLPack on {here} or as a CPU copy "
                              f"(dl_device=(kDLCPU, 0)), not on {tuple(dl_device)}")
        if copy is False:
            raise BufferError(f"a {NAME} tensor in GPU memory reaches the CPU only as a "
                              "copy; pass copy=None or True")
        return t.cpu().__dlpack__(max_version=max_version)
    if copy:
        t = t.clone()
    gpu = _gpu()
    if gpu is None:
        # The memory is host memory: torch exports its CPU alias (which keeps the
        # device storage alive), with torch's own checks of the stream.
        alias = memory.cpu_alias(t)
        return _ORIGINAL["__dlpack__"](alias, stream=None if stream == -1 else stream,
                                       max_version=max_version)
    if not lazy.untouched(t):
        lazy.sync("host")
    code = CODES.get(t.dtype)
    if code is None:
        raise BufferError(f"{t.dtype} has no DLPack type")
    lease = getattr(t.untyped_storage(), "_hologram", None)
    if lease is None:  # no memory at all (an empty storage): nothing to order or hold
        return cuda_dlpack.export(0, tuple(t.shape), code, (cuda_dlpack.KDL_CUDA,
                                  gpu.device_id), None, max_version,
                                  strides=tuple(t.stride()))
    # (the capsule holds the block: it returns to the pool once both are done with it)
    return gpu.export_dlpack(lease.block, tuple(t.shape), code, max_version, stream,
                             offset=t.data_ptr() - lease.address, strides=tuple(t.stride()))


def from_dlpack(producer: Any) -> torch.Tensor:
    """A device tensor sharing the memory of ``producer`` (an object with ``__dlpack__``,
    or a capsule), no copy; it keeps the producer alive. On host memory: a host producer
    (NumPy, a CPU tensor); on GPU memory: a producer of memory on the device's GPU (a torch
    CUDA tensor). Another device's memory is refused with an error naming the copy to
    make."""
    if isinstance(producer, torch.Tensor) and producer.device.type == NAME:
        return producer.detach()
    gpu = _gpu()
    if gpu is None:
        if hasattr(producer, "__dlpack_device__"):
            kind, _ = producer.__dlpack_device__()
            if int(kind) not in (DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost):
                raise DeviceError(
                    f"from_dlpack: {type(producer).__name__} holds {DLDeviceType(kind).name} "
                    f"memory and the {NAME} device's memory is host memory (backend "
                    f"{_backend()}); copy it to the host first (t.cpu())")
        host = torch.from_dlpack(producer)  # torch reads every dtype and layout
        st = memory.shared_storage(host.untyped_storage().data_ptr(),
                                   host.untyped_storage().nbytes(), host)
        return memory.on_storage(st, host.dtype, host.shape, host.stride(),
                                 host.storage_offset())
    if not hasattr(producer, "__dlpack__"):
        raise DeviceError(f"from_dlpack: the {NAME} device's memory is a GPU's, which takes "
                          "producers (objects with __dlpack__ and __dlpack_device__), not "
                          "capsules: pass the tensor itself")
    tensor = gpu.take_dlpack(producer)
    dtype = _DTYPES.get((tensor.code, tensor.bits))
    if dtype is None or tensor.read_only:
        tensor.release()
        raise DeviceError(f"from_dlpack: {type(producer).__name__} is "
                          + ("read-only" if tensor.read_only else
                             f"of DLPack type (code {tensor.code}, {tensor.bits} bits)")
                          + f", which {NAME} tensors cannot hold; pass a writable copy of "
                          "a dtype torch has")
    shape = tensor.shape
    strides = tensor.strides or tuple(memory.contiguous_strides(shape))
    # The storage starts on an aligned address at or before the data (kernels take
    # 16-byte aligned storages; the tensor's offset says where its data starts).
    start = tensor.data - tensor.data % 16
    offset, rest = divmod(tensor.data - start, dtype.itemsize)
    if rest:
        start, offset = tensor.data, 0
    nbytes = (offset + memory.span(shape, strides)) * dtype.itemsize
    block = gpu.foreign_block(tensor, producer, start, nbytes)
    st = memory.shared_storage(start, nbytes, block)
    return memory.on_storage(st, dtype, shape, strides, offset)


def _backend() -> str:
    from hologram_torch.aten import runner

    return runner.backend()


# --- torch.Tensor's protocol methods, for device tensors -------------------------------

_ORIGINAL: dict[str, Any] = {}


def _dlpack_method(self, *args, **kwargs):
    if self.device.type != NAME or args:
        return _ORIGINAL["__dlpack__"](self, *args, **kwargs)
    return export(self, **kwargs)


def _dlpack_device_method(self):
    if self.device.type != NAME:
        return _ORIGINAL["__dlpack_device__"](self)
    return dlpack_device(self)


def _to_dlpack(tensor):
    if isinstance(tensor, torch.Tensor) and tensor.device.type == NAME:
        return export(tensor)
    return _ORIGINAL["to_dlpack"](tensor)


def install() -> None:
    """Serve ``__dlpack__`` and ``__dlpack_device__`` of device tensors, and
    ``torch.utils.dlpack.to_dlpack`` (the legacy capsule; torch's own would say kDLExtDev,
    which no consumer takes) (idempotent)."""
    if _ORIGINAL:
        return
    for name, method in (("__dlpack__", _dlpack_method),
                         ("__dlpack_device__", _dlpack_device_method)):
        _ORIGINAL[name] = getattr(torch.Tensor, name)
        setattr(torch.Tensor, name, functools.wraps(_ORIGINAL[name])(method))
    _ORIGINAL["to_dlpack"] = torch.utils.dlpack.to_dlpack
    torch.utils.dlpack.to_dlpack = _to_dlpack


install()

__all__ = ["CODES", "dlpack_device", "export", "from_dlpack", "install"]
