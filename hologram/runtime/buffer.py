"""SDK buffers: typed, shaped, C-contiguous memory owned by an :class:`~hologram.Executor`.

    buf = ex.from_numpy(x)          # a copy of x in the executor's memory
    y = buf.to_numpy()              # zero-copy view on host memory (cpu, interp); else a copy
    t = torch.from_dlpack(buf)      # zero-copy; so is np.from_dlpack(buf) (host memory)
    b = hg.from_dlpack(t)           # zero-copy from NumPy arrays and torch CPU tensors

Memory. A buffer made by its executor (``allocate``, ``empty``, ``from_numpy``, every op
output) holds one *allocation* of the executor's allocator, which its backend provides
(:meth:`hologram.backends.base.Backend.allocator`). On the host backends (cpu, interp)
that is a block of a 96-class pool in host memory (``allocator.host_visible``): the
buffer's data is a NumPy array, ``to_numpy()`` is a zero-copy view of it, DLPack exports
it zero-copy, and the block returns to the pool when the buffer, and every NumPy view or
DLPack consumer of it, is gone. ``free()`` and ``Executor.close()`` end the *buffer* at
once: using it afterwards raises :class:`~hologram.errors.InvalidBufferError`. Arrays
already taken from it by ``to_numpy`` or DLPack keep the memory alive and stay valid, so
no path reads freed memory.

Memory the host cannot see (a device backend, ``host_visible`` False) is reached only
through the allocator: ``to_numpy()`` always returns a copy (``allocator.copy_out``),
``from_numpy``, ``Executor.from_numpy`` and ``allocate`` copy in (``allocator.copy_in``),
ops launch on the allocation's handle, and ``__dlpack__`` exports CUDA memory as a kDLCUDA
capsule (an allocator with ``export_dlpack``) and raises
:class:`~hologram.errors.DeviceError` for other device memory (export to host memory with
``to_numpy()`` first); ``__dlpack_device__`` names the device. The allocation is released
when the last buffer viewing it (or DLPack consumer of it) ends.

A buffer from ``from_dlpack`` shares the producer's memory (and keeps the producer alive):
host memory on host executors, memory of the executor's own CUDA device on a cuda one.
A read-only producer gives a read-only buffer: ops may read it but not write to it.
"""

from __future__ import annotations

import math

import numpy as np

from hologram._native import set_buffer_type
from hologram.errors import DeviceError, DTypeError, InvalidBufferError, ShapeError
from hologram.frontend.mixin import SdkOperators, reshaped, sdk_operator
from hologram.isa.dtypes import NUMPY_DTYPES

#: NumPy dtypes a buffer may have: the Atlas dtypes NumPy has (bf16 is not one).
DTYPES = NUMPY_DTYPES


def as_dtype(dtype: object, where: str) -> np.dtype:
    """``dtype`` as one of :data:`DTYPES`, or a :class:`DTypeError` naming them."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        dt = None
    # ``dt in DTYPES`` alone is not enough: NumPy compares None equal to float64.
    if dt is None or dt not in DTYPES:
        names = ", ".join(str(d) for d in DTYPES)
        raise DTypeError(f"{where}: unsupported dtype {dtype!r}; supported: {names}. Convert "
                         "the data first (e.g. x.astype(np.float32)) or pass one of these")
    return dt


#: The most elements a shape's non-zero extents may multiply to: what an array of 8-byte
#: values can address (NumPy's limit for the widest types Hologram computes in).
MAX_EXTENT = np.iinfo(np.intp).max // 8


def check_extent(shape: tuple[int, ...], where: str) -> None:
    """Refuse a shape whose non-zero extents multiply to more than :data:`MAX_EXTENT`, even
    when another extent is 0 (NumPy refuses ``(2**62, 2**62, 0)``, and so does PyTorch's
    ``torch.empty``): a :class:`ShapeError` naming the shape."""
    extent = math.prod(n for n in shape if n)
    if extent > MAX_EXTENT:
        raise ShapeError(f"{where}: shape {list(shape)}: its non-zero extents multiply to "
                         f"{extent} elements, more than the {MAX_EXTENT} an array of 8-byte "
                         "values can address, so the shape cannot be represented even "
                         "though it holds no elements (np.empty and torch.empty refuse "
                         "(2**62, 2**62, 0) too); use smaller extents")


def _asarray(data: object, where: str) -> np.ndarray:
    """``np.asarray(data)``, with NumPy's refusals (ragged lists, ...) as DTypeError."""
    try:
        return np.asarray(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise DTypeError(f"{where}: cannot read {type(data).__name__} as an array ({exc}); "
                         "pass a NumPy array or a rectangular list of numbers") from None


class Buffer(SdkOperators):
    """A typed, shaped, C-contiguous block of memory of one executor.

    Attributes (read-only): ``shape``, ``dtype`` (a NumPy dtype), ``size`` (elements),
    ``nbytes``, ``ndim``, ``device`` (where the memory is, from the executor's allocator:
    ``"cpu"`` for host backends), ``executor``.
    Arithmetic operators (``+ - * / ** @``, unary ``-`` and ``abs``) call :mod:`hologram.ops`,
    eagerly or, inside :func:`hologram.jit`, traced (see :mod:`hologram.frontend.mixin`).

    Internal API, for the SDK's ops, ``hg.jit`` and the runtime (read-only; users have the
    properties above). These are plain attributes, not properties: the ops' fast path reads
    them on every call.

    - ``handle``: what a compiled program launches on for this buffer (the allocator's
      handle of its allocation: the host address of its first element on host backends;
      views start at their allocation's first element, so they share its handle);
    - ``signature``: ``(shape, dtype)``, what a compiled kernel depends on;
    - ``launch_key``: the key under which an op remembers a validated launch for this
      buffer (see ``__init__``); ``None`` once the buffer is freed, so a freed buffer never
      matches;
    - ``allocation``: the allocator's allocation this buffer views (on host memory, the
      pool array); buffers of one allocation may overlap, buffers of different allocations
      never do (unless foreign); ``None`` once the buffer is freed;
    - :meth:`check_live`, :meth:`check_writable`, :meth:`prefix`, :meth:`write`,
      :attr:`writable`, :attr:`host_visible`.
    """

    __slots__ = ("__weakref__", "_array", "allocation", "executor", "handle", "launch_key",
                 "signature")

    def __init__(self, array: np.ndarray | None, executor, *, foreign: bool = False,
                 allocation: object = None, signature: tuple | None = None,
                 handle: int | None = None):
        # Internal: executors make buffers (Executor.new_buffer and friends).
        # Host memory: ``array`` is the buffer's data (a view of ``allocation``, the pool
        # array, when given). Memory the host cannot see: ``array`` is None and
        # ``allocation``, ``signature`` and ``handle`` say where and what the data is.
        # ``foreign``: the memory came from DLPack and may alias any other buffer.
        self._array = array
        self.executor = executor
        if array is not None:
            self.handle = executor.allocator.handle(array) if handle is None else handle
            self.signature = (array.shape, array.dtype)
            self.allocation = array if allocation is None else allocation
        else:
            self.handle = handle
            self.signature = signature
            self.allocation = allocation
        shape, dtype = self.signature
        # Allocations never partially overlap, so shape, dtype and executor decide a
        # launch. Foreign memory may alias anything and may be read-only: its key adds the
        # address (with the shape, the exact byte range) and writability, so a launch
        # validated for one foreign buffer is reused only for memory with the same extent
        # and access.
        self.launch_key = (shape, dtype, executor.token) if not foreign else (
            shape, dtype, executor.token, self.handle,
            array is None or array.flags.writeable)

    # --- metadata -----------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.signature[0]

    @property
    def dtype(self) -> np.dtype:
        return self.signature[1]

    @property
    def ndim(self) -> int:
        return len(self.signature[0])

    @property
    def size(self) -> int:
        return math.prod(self.signature[0])

    @property
    def nbytes(self) -> int:
        return self.size * self.signature[1].itemsize

    @property
    def device(self) -> str:
        """The device type of the memory (the executor's allocator's, e.g. ``"cpu"``)."""
        return self.executor.device

    @property
    def host_visible(self) -> bool:
        """True when the memory is host memory (``to_numpy()`` is then a zero-copy view)."""
        return self.executor.allocator.host_visible

    @property
    def freed(self) -> bool:
        """True once ``free()`` or the executor's ``close()`` ended this buffer."""
        return self.allocation is None

    @property
    def foreign(self) -> bool:
        """True for memory imported with DLPack (it may alias any other buffer)."""
        return len(self.launch_key) > 3 if self.launch_key is not None else False

    @property
    def writable(self) -> bool:
        """False for a read-only foreign buffer (ops may read it, not write it)."""
        if self.allocation is None:
            return False
        return self._array is None or self._array.flags.writeable

    def __len__(self) -> int:
        if not self.signature[0]:
            raise TypeError("len() of a 0-d buffer")
        return self.signature[0][0]

    def __repr__(self) -> str:
        state = " freed" if self.allocation is None else ""
        return (f"<hologram.Buffer shape={list(self.shape)} dtype={self.dtype} "
                f"device={self.executor.device!r} backend={self.executor.backend!r}{state}>")

    # --- data in and out ----------------------------------------------------------------
    def array(self, where: str = "buffer") -> np.ndarray:
        """The NumPy array holding the data (shares memory; host memory only), or
        InvalidBufferError (an ended buffer) or DeviceError (memory the host cannot see:
        use :meth:`to_numpy`)."""
        if self._array is None:
            self.check_live(where)
            raise DeviceError(self._not_host(where, "to_numpy() copies the data out"))
        return self._array

    def to_numpy(self, copy: bool = False) -> np.ndarray:
        """The contents as a NumPy array. On host memory (the cpu and interp backends,
        ``host_visible``) a zero-copy view: later writes to the buffer show through it,
        and it keeps the memory alive after ``free()``; a copy when ``copy=True``. On
        memory the host cannot see, always a copy (``allocator.copy_out``)."""
        array = self._array
        if array is None:
            self.check_live("to_numpy")
            shape, dtype = self.signature
            out = np.empty(shape, dtype)
            if out.size:
                self.executor.allocator.copy_out(self.allocation, out)
            return out
        return array.copy() if copy else array

    numpy = to_numpy

    def from_numpy(self, data: object) -> Buffer:
        """Copy ``data`` (any array-like with this buffer's number of elements, read in
        row-major order) into the buffer and return the buffer. Values are converted to the
        buffer's dtype when NumPy's ``same_kind`` rule allows it (float64 -> float32 yes,
        float -> int no)."""
        self.check_live("from_numpy")
        source = _asarray(data, "from_numpy")
        shape, dtype = self.signature
        size = math.prod(shape)
        if source.size != size:
            raise ShapeError(f"from_numpy: buffer {list(shape)} holds {size} elements, "
                             f"data {list(source.shape)} has {source.size}; reshape or "
                             "allocate a buffer of the data's shape")
        if not np.can_cast(source.dtype, dtype, "same_kind"):
            raise DTypeError(f"from_numpy: cannot write {source.dtype} data into a {dtype} "
                             f"buffer {list(shape)}; convert with data.astype(...) first")
        self.check_writable("from_numpy")
        self.write(source, "same_kind")
        return self

    def fill(self, value: bool | int | float) -> Buffer:
        """Set every element to ``value``; returns the buffer."""
        return sdk_operator("fill")(self, value)

    def copy_from(self, other: Buffer) -> Buffer:
        """Copy ``other`` (same number of elements; converted to this dtype) into this
        buffer; returns the buffer."""
        return sdk_operator("copy")(other, self)

    def reshape(self, *shape: int) -> Buffer:
        """A buffer of another shape viewing the same memory (no copy)."""
        self.check_live("reshape")
        dims = reshaped(shape, self.size, self.shape)
        check_extent(dims, "reshape")
        return self.executor.register(self._view(dims))  # close() ends views

    def free(self) -> None:
        """End this buffer now (idempotent). Its memory returns to the allocator once no
        buffer, NumPy view or DLPack consumer still holds it."""
        # The allocation too: holding the pool array would keep the block from the pool.
        self._array = self.launch_key = self.allocation = None

    # --- interchange --------------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        if self._array is None:  # device memory: only a copy exists on the host
            if copy is False:
                self.check_live("__array__")
                raise ValueError(self._not_host("__array__", "a copy is needed"))
            array = self.to_numpy()
            return array if dtype is None else array.astype(dtype, copy=False)
        array = self.array("__array__")
        if dtype is not None and np.dtype(dtype) != array.dtype:
            if copy is False:  # NumPy 2's protocol: copy=False forbids a copy
                raise ValueError(f"__array__: buffer {list(self.shape)} {self.dtype} cannot "
                                 f"be viewed as {np.dtype(dtype)} without a copy")
            return array.astype(dtype)
        return array.copy() if copy else array

    def __dlpack__(self, **kwargs):
        """DLPack export, zero-copy; accepts the standard keyword arguments (``stream``,
        ``max_version``, ``dl_device``, ``copy``). Host memory is exported by NumPy. CUDA
        memory (the cuda backend on a GPU) is exported as a kDLCUDA capsule of this
        device, which a CUDA consumer (``torch.from_dlpack`` on a CUDA build) takes; work
        queued on the executor is ordered before the consumer's ``stream`` (DLPack's
        values: None or 1 the legacy default stream, 2 the per-thread one, a stream
        handle, -1 no synchronization). Other memory the host cannot see raises
        :class:`~hologram.errors.DeviceError` (copy it to the host with ``to_numpy()`` and
        export that)."""
        if self._array is not None:
            return self._array.__dlpack__(**kwargs)
        self.check_live("__dlpack__")
        export = getattr(self.executor.allocator, "export_dlpack", None)
        if export is None:
            raise DeviceError(self._not_host(
                "__dlpack__", "DLPack export of it is not supported; export "
                "buf.to_numpy() (a host copy) instead"))
        device = self.__dlpack_device__()
        wanted = kwargs.get("dl_device")
        if kwargs.get("copy") or (wanted is not None and tuple(wanted) != device):
            raise DeviceError(self._not_host(
                "__dlpack__", f"a copy{f' to device {tuple(wanted)}' if wanted else ''} is "
                f"not made by export; it is shared in place on device {device}, or copied "
                "out with buf.to_numpy()"))
        return export(self.allocation, *self.signature, kwargs.get("max_version"),
                      stream=kwargs.get("stream"))

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(DLPack device type, device index)`` of the memory (``(1, 0)``: host;
        ``(2, n)``: CUDA device n)."""
        if self._array is None:
            self.check_live("__dlpack_device__")
            allocator = self.executor.allocator
            return (allocator.dlpack_device_type, getattr(allocator, "device_id", 0))
        return self._array.__dlpack_device__()

    # --- internal API (see the class docstring) -------------------------------------------
    def check_live(self, where: str) -> None:
        """Raise :class:`InvalidBufferError` (naming ``where``) if the buffer has ended."""
        if self.allocation is None:
            raise InvalidBufferError(self._dead(where))

    def check_writable(self, where: str) -> None:
        """Raise :class:`InvalidBufferError` (naming ``where``) if the buffer is read-only."""
        if self._array is not None and not self._array.flags.writeable:
            raise InvalidBufferError(f"{where}: buffer {list(self.shape)} {self.dtype} is "
                                     "read-only (it shares a read-only array's memory); copy it "
                                     "with ex.from_numpy(...) to write")

    def write(self, source: np.ndarray, casting: str = "unsafe") -> None:
        """Copy ``source`` (this buffer's number of elements, any layout) into the buffer,
        converted to its dtype with NumPy's ``casting`` rule: a NumPy copy on host memory,
        ``allocator.copy_in`` of a contiguous converted copy elsewhere."""
        if self._array is not None:
            np.copyto(self._array.reshape(-1), source.reshape(-1), casting=casting)
            return
        data = np.ascontiguousarray(source.reshape(-1), dtype=None)
        if data.dtype != self.signature[1]:
            data = data.astype(self.signature[1], casting=casting)
        if data.size:
            self.executor.allocator.copy_in(self.allocation, data)

    def prefix(self, n: int, shape: tuple[int, ...] | None = None) -> Buffer:
        """A buffer over the first ``n`` elements (read flat), as ``shape`` (default
        ``(n,)``), sharing this buffer's memory. Not tracked by the executor: for an op's
        duration only."""
        return self._view((n,) if shape is None else shape, n)

    def _view(self, shape: tuple[int, ...], n: int | None = None) -> Buffer:
        """A buffer of ``shape`` over this buffer's first elements (all of them, or
        ``n``), sharing its memory and handle."""
        array = self._array
        if array is not None:
            flat = array.reshape(-1)
            view = (flat if n is None else flat[:n]).reshape(shape)
            # A view of foreign memory is foreign (its key carries an address).
            return Buffer(view, self.executor, foreign=self.foreign,
                          allocation=self.allocation, handle=self.handle)
        return Buffer(None, self.executor, foreign=self.foreign, allocation=self.allocation,
                      signature=(tuple(shape), self.signature[1]), handle=self.handle)

    def _not_host(self, where: str, what: str) -> str:
        ex = self.executor
        return (f"{where}: buffer {list(self.shape)} {self.dtype} is in {ex.device} memory, "
                f"which the host cannot see ({ex.backend} backend); {what}")

    def _dead(self, where: str) -> str:
        why = ("its executor was closed" if self.executor.closed
               else "it was freed with free()")
        return (f"{where}: buffer {list(self.shape)} {self.dtype} can no longer be used: {why}; "
                "allocate a new buffer")


# The SDK ops' native allocating path makes result buffers itself (hologram/csrc/fastop.c):
# it fills this class's slots, read from their descriptors, and views memory as ndarrays.
set_buffer_type(Buffer, np.ndarray)
