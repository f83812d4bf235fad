"""Tensor creation, copies between devices, views, resizing, ``fill_``/``zero_``,
``clone`` and ``item()``.

Copies between the host and the device are memory transfers: the device's memory is host
memory, so torch's CPU copy on an aliasing CPU view moves the bytes (as ``cudaMemcpy``
would). Copies within the device are Hologram programs (broadcast and dtype conversion
included).
"""

from __future__ import annotations

import ctypes
import math
import warnings

import torch

from hologram_torch import lazy, memory, native
from hologram_torch.aten import layout, runner
from hologram_torch.aten.registry import NATIVE, aten, composed, impl, overload
from hologram_torch.aten.runner import ISA, MAX_NDIM, Unsupported, cast
from hologram_torch.constants import CPU_KEYS
from hologram_torch.device import device_count, invalid_ordinal
from hologram_torch.fallback import cpu_view
from hologram_torch.lowering.common import check_output_shape


def _strides_for(size, dtype, memory_format) -> list[int] | None:
    if memory_format in (None, torch.contiguous_format, torch.preserve_format):
        return None
    return list(torch.empty(size, dtype=dtype, device="meta",
                            memory_format=memory_format).stride())


def check_allocation(size, layout=None, device=None) -> None:
    """PyTorch's errors for a tensor the device cannot make: a negative size, a sparse
    layout (device storages are dense), a device index past the devices."""
    if any(n < 0 for n in size):
        raise RuntimeError(f"Trying to create tensor with negative dimension "
                           f"{min(size)}: {list(size)}")
    if layout is not None and layout is not torch.strided:
        raise NotImplementedError(memory.SPARSE_UNSUPPORTED)
    if device is not None and device.index not in (None, 0) and not (
            0 <= device.index < device_count()):
        raise invalid_ordinal(device)


_complex_half_warned = False


def _warn_complex_half(dtype) -> None:
    """PyTorch's once-per-process warning for new ComplexHalf memory (its allocator's)."""
    global _complex_half_warned
    if dtype is torch.complex32 and (not _complex_half_warned
                                     or torch.is_warn_always_enabled()):
        _complex_half_warned = True
        warnings.warn("ComplexHalf support is experimental and many operators don't support "
                      "it yet.", UserWarning, stacklevel=3)


def fills_uninitialized_memory() -> bool:
    """Does PyTorch fill new memory now (``torch.use_deterministic_algorithms(True)`` with
    ``torch.utils.deterministic.fill_uninitialized_memory``, its default)?"""
    return (torch._C._get_deterministic_algorithms()
            and torch._C._get_deterministic_fill_uninitialized_memory())


def fill_uninitialized(t: torch.Tensor) -> torch.Tensor:
    """PyTorch's deterministic fill of new memory: NaN for float and complex dtypes (a
    complex NaN + 0j), the largest value for integers, True for bool. Through a CPU view
    (every dtype, and layouts whose elements share memory)."""
    dtype = t.dtype
    if dtype.is_floating_point or dtype.is_complex:
        value = math.nan
    elif dtype is torch.bool:
        value = True
    else:
        value = torch.iinfo(dtype).max
    if t.numel():
        alias = cpu_view(t)
        alias.fill_(value)
        memory.write_back(alias)
    return t


@impl("empty.memory_format")
def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    check_allocation(size, layout, device)
    _warn_complex_half(dtype)
    t = memory.empty(size, dtype, _strides_for(size, dtype, memory_format))
    return fill_uninitialized(t) if fills_uninitialized_memory() else t


@impl("empty_strided")
def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    check_allocation(size, layout, device)
    _warn_complex_half(dtype)
    t = memory.empty(size, dtype, stride)
    return fill_uninitialized(t) if fills_uninitialized_memory() else t


# --- metadata-only ops: the CPU kernels build a TensorImpl sharing our storage ----------

def _metadata(name: str) -> None:
    if native.register_metadata(name):  # the same redispatch, from native code
        NATIVE.add(name if "." in name else f"{name}.default")
        return
    handle = overload(name)._handle

    def kernel(*args, **kwargs):
        return handle.redispatch_boxed(CPU_KEYS, *args, **kwargs)

    impl(name)(kernel)


for _name in ("as_strided", "view", "_reshape_alias", "unfold", "alias", "_unsafe_view",
              "view_as_real", "view_as_complex", "set_.source_Storage",
              "set_.source_Storage_storage_offset", "set_.source_Tensor"):
    _metadata(_name)


@impl("set_")
def set_empty_(self):
    """``x.set_()``: an empty storage of the device (the CPU kernel would make a CPU one)."""
    return memory.point_at(self, memory.storage(0), 0, [0], [1])


# --- sparse compressed layouts: refused where they would be built -----------------------

def _refuse_sparse(name: str):
    def kernel(*args, **kwargs):
        raise NotImplementedError(f"aten.{name}: {memory.SPARSE_UNSUPPORTED}")
    return kernel


# Sparse tensors are refused by the sparse dispatch keys' fallback (fallback.refuse_sparse),
# which serves only the ops with no kernel of their own for the key: for SparseCsr*, most
# ops have a composite one (CompositeExplicitAutograd, and NonFunctional), so ops on a
# compressed (CSR, CSC, BSR, BSC) device tensor ran those and failed inside with
# RuntimeErrors ("unsupported tensor layout: SparseCsr"). Such tensors are built by the
# constructors below (from ``csr.to(device)``, ``torch.sparse_csr_tensor``,
# ``torch.zeros(layout=torch.sparse_csr)``), which dispatch on the layout and device of
# their result, SparseCsrPrivateUse1: refusing them there, no compressed tensor reaches
# the device.
_sparse = torch.library.Library("aten", "IMPL")
for _name in ("_sparse_compressed_tensor_unsafe", "_sparse_compressed_tensor_with_dims",
              "sparse_compressed_tensor.comp_plain_value",
              "sparse_compressed_tensor.comp_plain_value_size",
              *(f"_sparse_{f}_tensor_unsafe" for f in ("csr", "csc", "bsr", "bsc")),
              "sparse_csr_tensor.crow_col_value", "sparse_csr_tensor.crow_col_value_size",
              "sparse_csc_tensor.ccol_row_value", "sparse_csc_tensor.ccol_row_value_size",
              "sparse_bsr_tensor.crow_col_value", "sparse_bsr_tensor.crow_col_value_size",
              "sparse_bsc_tensor.ccol_row_value", "sparse_bsc_tensor.ccol_row_value_size"):
    _sparse.impl(_name, _refuse_sparse(_name), "SparseCsrPrivateUse1")


# --- copies -----------------------------------------------------------------------------

def _copy_build(g, src, shape, dtype):
    return cast(src.broadcast_to(shape), dtype)


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _conj_or_neg(t: torch.Tensor) -> bool:
    """Is ``t`` a conjugate or negative view (a bit its raw memory does not show)?"""
    return t.is_conj() or t.is_neg()


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` for device tensors (src broadcast, cast to dst's dtype)."""
    if src.shape != dst.shape:
        check_output_shape(dst.shape, src.shape)  # PyTorch's errors, before any work
    if dst.numel() == 0:
        return dst
    host = src.is_cpu  # a 0-d CPU tensor (a scalar): the copy program takes its value
    if (not host and _overlap(dst, src)
            and (src.data_ptr() != dst.data_ptr() or src.stride() != dst.stride()
                 or src.shape != dst.shape)):
        # Memory shared other than element for element: PyTorch's copy on aliases of one
        # CPU storage, which raises its overlap error where PyTorch does (a partial
        # overlap of dense tensors) and computes what PyTorch computes elsewhere.
        storages: dict = {}
        alias = cpu_view(dst, storages)
        alias.copy_(cpu_view(src, storages))
        memory.write_back(alias)
        return dst
    if _conj_or_neg(dst) or (not host and _conj_or_neg(src)) or memory.internal_overlap(dst):
        # Conjugate or negative views (complex results, .imag of a conjugate): the CPU
        # copy resolves the bits; the programs read raw memory. A destination whose
        # elements share memory (expanded): the CPU copy raises PyTorch's error.
        alias = cpu_view(dst)
        alias.copy_(src if host else cpu_view(src))
        memory.write_back(alias)
        return dst
    try:
        runner.run("copy", _copy_build, (src.item() if host else src,),
                    (tuple(dst.shape), ISA[dst.dtype]), out=(dst,))
    except (Unsupported, KeyError):
        # dtypes no program takes (complex): the CPU's copy, from the scalar tensor itself
        # (its value as a Python number would become a complex64 or float32 tensor)
        alias = memory.cpu_alias(dst)
        alias.copy_(src if host else memory.cpu_alias(src, read_only=True))
        memory.write_back(alias)
    return dst


def _plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a plain Tensor over the same memory: a subclass's Python attributes are not
    the kernel's to read (an ``UninitializedParameter``'s ``shape`` raises, and a lazy
    module moved with ``.to(dtype)`` copies one)."""
    if type(t) is torch.Tensor:
        return t
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


@impl("_copy_from")
def _copy_from(src, dst, non_blocking=False):
    src, dst = _plain(src), _plain(dst)
    if dst.is_cpu:  # device -> host
        dst.copy_(memory.download(src))
    elif src.is_cpu and src.dim() != 0:  # host -> device
        if dst.numel():
            memory.upload(dst, src, non_blocking)
    else:
        copy_into(dst, src)
    return dst


@composed("copy_")
def copy_(self, src, non_blocking=False):
    # Writing into a conjugate or negative view (``z.conj().copy_(w)``, and how PyTorch
    # writes any in-place result into one: compute on a resolved clone, copy back) must
    # reach a kernel that sees the bit. copy_ is the op PyTorch lets through with it;
    # _copy_from, below it, would get a resolved clone of the destination (its schema
    # does not mark it written). Everything else is torch's own copy_.
    if not self.is_cpu and (_conj_or_neg(self) or _conj_or_neg(src)) and self.numel():
        if src.is_cpu:
            memory.upload(self, src)
        else:
            copy_into(self, src)
        return self
    return _COPY_HANDLE.redispatch_boxed(CPU_KEYS, self, src, non_blocking)


_COPY_HANDLE = aten.copy_.default._handle


@impl("_copy_from_and_resize")
def _copy_from_and_resize(src, dst):
    if tuple(dst.shape) != tuple(src.shape):
        dst.resize_(src.shape)
    return _copy_from(src, dst)


@impl("resize_")
def resize_(self, size, memory_format=None):
    old = self.untyped_storage().nbytes()
    memory.resize(self, size, memory_format)
    if fills_uninitialized_memory():
        # PyTorch fills the storage's new elements (in self's dtype), past the old ones
        st, item = self.untyped_storage(), self.element_size()
        start, end = old // item, st.nbytes() // item
        if end > start:
            fill_uninitialized(memory.on_storage(st, self.dtype, [end - start], [1], start))
    return self


@impl("record_stream")
def record_stream(self, s):
    # The allocator already holds a let-go block until every stream's queued work has
    # completed (hologram_torch/streams.py): nothing to record. A stream of another
    # device is refused, as PyTorch's CUDA allocator refuses one.
    if s.device.type != self.device.type:
        raise RuntimeError(f"record_stream: the stream is on {s.device}, the tensor on "
                           f"{self.device}")


@impl("_local_scalar_dense")
def _local_scalar_dense(self):
    return memory.download(self).item()


# c10::MemoryFormat's values, as a call the native front kernel passes on gives them
_MEMORY_FORMATS = (torch.contiguous_format, torch.preserve_format, torch.channels_last,
                   torch.channels_last_3d)


@impl("clone", hot=True)
def clone(self, memory_format=None):
    if isinstance(memory_format, int):
        memory_format = _MEMORY_FORMATS[memory_format]
    preserve = memory_format is None or memory_format is torch.preserve_format
    if ((preserve or memory_format is torch.contiguous_format) and self.dtype in ISA
            and not _conj_or_neg(self) and self.dim() <= MAX_NDIM):
        # A fresh copy laid out as empty_like(self) (or contiguous), whose launch the
        # front kernel serves from the second call on (no Python at all).
        name = "clone" if preserve else "clone.contiguous"
        static = (tuple(self.shape), ISA[self.dtype])
        out = runner.run(name, _copy_build, (self,), static,
                          layout=layout.preserved if preserve else None)
        runner.remember((name, self.dtype, self.shape, self.stride()), name, static,
                         (self,), out)
        return out
    if preserve:
        strides = None if self.is_contiguous() else list(
            torch.empty_strided(self.shape, self.stride(), dtype=self.dtype,
                                device="meta").clone().stride())
    else:
        strides = _strides_for(self.shape, self.dtype, memory_format)
    out = memory.empty(self.shape, self.dtype, strides)
    return copy_into(out, self)


@impl("_to_copy", hot=True)
def _to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking=False, memory_format=None):
    """A device tensor's copy, on the device (a dtype cast: autocast's casts of weights
    and activations, ``x.float()``) or to another device. On the device, preserving the
    layout and of dtypes the programs take, one cast program whose launch the front
    kernel serves from the second call on; anything else is torch's composite kernel,
    reached through the CPU key (which has no kernel of its own for ``_to_copy``)."""
    to = self.device if device is None else torch.device(device)
    here = to.type == self.device.type and to.index in (None, self.device.index)
    # (the front kernel passes a layout or a memory format as its enum's value)
    strided = layout is None or layout is torch.strided or layout == 0
    if isinstance(memory_format, int):
        memory_format = _MEMORY_FORMATS[memory_format]
    # (a subclass's Python attributes are not ours to read: an UninitializedParameter's
    # shape raises; the composite kernel copies it through _copy_from's plain view)
    if type(self) is torch.Tensor and here and not pin_memory and strided and (
            self.dim() <= MAX_NDIM) and (
            memory_format in (None, torch.preserve_format)) and self.dtype in ISA and (
            (dtype or self.dtype) in ISA) and not _conj_or_neg(self):
        target = dtype or self.dtype
        static = (tuple(self.shape), ISA[target])
        out = runner.run("to_copy", _copy_build, (self,), static, layout=_PRESERVED)
        runner.remember(("to_copy", self.dtype, target, self.shape, self.stride()),
                         "to_copy", static, (self,), out)
        return out
    if non_blocking and (device is None or to.type == "cpu"):
        # A non-blocking copy to the CPU would allocate a pinned destination (a hook
        # PyTorch lacks for other devices); kernels have finished by then, so a blocking
        # copy is what a non-blocking one amounts to.
        non_blocking = False
    return _TO_COPY_HANDLE.redispatch_boxed(
        CPU_KEYS, self, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory,
        non_blocking=non_blocking, memory_format=memory_format)


_TO_COPY_HANDLE = aten._to_copy.default._handle
_PRESERVED = layout.preserved  # (``layout`` is also _to_copy's argument)


# --- fills ------------------------------------------------------------------------------

def _fill_build(g, value, shape, dtype):
    return cast(value, dtype).broadcast_to(shape)


#: Contiguous zero fills up to this size are a memset on host memory:
#: one thread clears it at cache speed, and no program is compiled per shape (a first
#: training step's state buffers, zeros_like). Larger ones run the fill program, which
#: splits over the worker threads.
MEMSET_BYTES = 1 << 20


def _is_zero_bits(value) -> bool:
    """Is ``value`` stored as all-zero bits in every dtype (0, 0.0, 0j, False; not -0.0)?"""
    if isinstance(value, complex):
        return _is_zero_bits(value.real) and _is_zero_bits(value.imag)
    return value == 0 and not (isinstance(value, float) and math.copysign(1.0, value) < 0)


@impl("fill_.Scalar")
def fill_(self, value):
    if self.numel() == 0:
        return self
    nbytes = self.numel() * self.element_size()
    if (nbytes <= MEMSET_BYTES and _is_zero_bits(value) and self.is_contiguous()
            and memory.host_memory()  # (device memory: a kernel, not a host copy)
            and lazy.untouched(self)):  # (else recorded: a fill is a node like any other)
        ctypes.memset(self.data_ptr(), 0, nbytes)
        return self
    if self.dtype not in ISA or memory.internal_overlap(self):
        # an expanded tensor: PyTorch fills it (every element sharing a location gets the
        # same value), a program may not store to one location twice
        alias = cpu_view(self)
        alias.fill_(value)
        memory.write_back(alias)
        return self
    if isinstance(value, bool) or self.dtype is torch.bool:
        value = bool(value) if self.dtype is torch.bool else value
    runner.run("fill", _fill_build, (value,), (tuple(self.shape), ISA[self.dtype]),
                out=(self,))
    return self


@impl("fill_.Tensor")
def fill_tensor_(self, value):
    if value.dim() != 0:
        raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor "
                           f"with {value.dim()} dimensions.")
    return fill_(self, value.item())


@impl("zero_")
def zero_(self):
    return fill_(self, False if self.dtype is torch.bool else 0)


__all__ = ["aten", "clone", "copy_into", "empty", "fill_"]
