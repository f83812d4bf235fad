"""The backend contract.

A backend is one folder under ``hologram/backends/`` with a :class:`Backend` subclass,
named in :data:`hologram.backends.BUILTIN`. It has four parts:

- **build** — :meth:`Backend.compile`: a scheduled Atlas program (the pipeline's output)
  to an artifact (bytes: object code, PTX, WGSL, ...) for a named target of the backend
  (``None``: the one this process runs). Pure: it never touches a device, and the same
  program and target give the same artifact, so artifacts can be cached on disk and built
  for machines other than this one (:func:`hologram.build`). :meth:`Backend.describe`
  reads an artifact's metadata (kernels, launch plan, resources) back.
- **load** — :meth:`Backend.load`: an artifact to an :class:`Executable`, which launches on
  device memory: one handle per program parameter.
- **memory** — :meth:`Backend.allocator`: an :class:`Allocator` (allocate, free, copy in
  and out, synchronize). The host backends (cpu, interp) use the host memory pool
  (:class:`hologram.backends.hostmem.Pool`); their handles are host addresses. The SDK's
  executors get their memory only through this (``hologram.runtime.executor``), so a
  backend whose memory the host cannot see (``host_visible = False``) works unchanged:
  buffers are copied in and out through :meth:`Allocator.copy_in` / ``copy_out``.
  Allocators whose handles are byte addresses (host memory, CUDA memory and its
  emulation) also copy at a handle plus an offset (:meth:`Allocator.write` / ``read``).
- **identity** — :meth:`Backend.target`: everything about the target machine that changes
  the artifact (CPU name and features, GPU architecture). It is part of every cache key, so
  an artifact never runs on a machine it was not built for.
- **capabilities** — :meth:`Backend.capabilities`: what a target's generated code can use
  (f64, i64, narrow storage, gather, scatter, ...), which chooses the compiler's numeric
  decompositions and the loop plan, and tells the conformance suite what to expect;
  :meth:`Backend.supports` says which (opcode, dtype) pairs it runs at all.
"""

from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from hologram.compiler.capabilities import Capabilities
from hologram.errors import DeviceError, DTypeError, ShapeError
from hologram.isa import dtypes
from hologram.isa.dtypes import DType
from hologram.isa.ir import BufferDecl, Program


class Allocator(ABC):
    """The memory of one device: allocations, copies between host and device, and
    synchronization.

    An *allocation* is whatever the device's memory object is (a NumPy array for host
    memory, a device buffer elsewhere); :meth:`handle` is what an :class:`Executable`
    launches on (a host address for host memory). Copies are synchronous unless a backend
    documents otherwise; :meth:`synchronize` waits for everything queued on the device.
    """

    #: The DLPack/PyTorch device type of the memory ("cpu" for host memory).
    device: ClassVar[str] = "cpu"
    #: The DLPack device type code of the memory (``kDLCPU`` = 1, ``kDLCUDA`` = 2,
    #: ``kDLMetal`` = 8, ``kDLWebGPU`` = 15, ``kDLExtDev`` = 12 for others).
    dlpack_device_type: ClassVar[int] = 1
    #: True when the host can read and write the memory in place (:meth:`view` works).
    host_visible: ClassVar[bool] = True

    @abstractmethod
    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """An uninitialized allocation for ``shape`` elements of ``dtype`` (storage dtype).
        Raises :class:`~hologram.errors.OutOfMemoryError` past the device's or the
        allocator's limit."""

    def free(self, allocation: Any) -> None:  # noqa: B027 (host memory frees itself)
        """Give ``allocation`` back now, for owners that end one explicitly. The SDK never
        calls it: buffers share allocations (views), and an allocation must release its
        memory itself when the last reference to it goes (host allocations do when the
        last array viewing them goes; a device allocation object when it is collected)."""

    @abstractmethod
    def handle(self, allocation: Any) -> int:
        """What an :class:`Executable` takes for ``allocation``."""

    def view(self, allocation: Any) -> np.ndarray:
        """The allocation as a NumPy array, zero-copy (host-visible memory only)."""
        raise DeviceError(f"{type(self).__name__}: {self.device} memory cannot be viewed "
                          "from the host; copy it out with copy_out")

    @abstractmethod
    def copy_in(self, allocation: Any, source: np.ndarray) -> None:
        """Copy the C-contiguous host array ``source`` into the first ``source.nbytes``
        bytes of ``allocation`` (at most its size: buffers over the first elements of an
        allocation copy only those)."""

    @abstractmethod
    def copy_out(self, allocation: Any, destination: np.ndarray) -> None:
        """Copy the first ``destination.nbytes`` bytes of ``allocation`` into the
        C-contiguous host array ``destination``."""

    # --- copies at addresses (allocators whose handles are byte addresses) -------------
    def write(self, handle: int, source: np.ndarray) -> None:
        """Copy the C-contiguous host array ``source`` to the device memory at ``handle``:
        a :meth:`handle`, or one plus a byte offset into its allocation (the caller vouches
        that ``source.nbytes`` bytes fit there). A copy of 0 bytes does nothing. Only for
        allocators whose handles are byte addresses (host memory, CUDA memory): the
        default raises :class:`~hologram.errors.DeviceError`."""
        raise DeviceError(f"{type(self).__name__}: write at a handle is not supported: its "
                          "handles are not addresses; copy into an allocation with copy_in")

    def write_async(self, handle: int, source: np.ndarray, keep: object) -> None:
        """:meth:`write`, queued after the launches before it where the device runs
        asynchronously: the host may return before the copy is done, so ``keep`` (what
        owns ``source``'s memory) is held until it is. The default is :meth:`write`."""
        self.write(handle, source)

    def read(self, handle: int, destination: np.ndarray) -> None:
        """Copy ``destination.nbytes`` bytes of device memory at ``handle`` (as in
        :meth:`write`) into the C-contiguous host array ``destination``. A copy of 0 bytes
        does nothing. The default raises :class:`~hologram.errors.DeviceError`."""
        raise DeviceError(f"{type(self).__name__}: read at a handle is not supported: its "
                          "handles are not addresses; copy an allocation out with copy_out")

    def copy(self, destination: int, source: int, nbytes: int) -> None:
        """Copy ``nbytes`` of device memory from handle ``source`` to handle
        ``destination`` (as in :meth:`write`; the ranges do not overlap), in order with
        the launches queued before it. A copy of 0 bytes does nothing. The default reads
        to the host and writes back."""
        if nbytes:
            staged = np.empty(nbytes, np.uint8)
            self.read(source, staged)
            self.write(destination, staged)

    def synchronize(self) -> None:  # noqa: B027 (host work is done when launch returns)
        """Wait until every launch and copy queued on the device has finished."""

    # --- accounting (optional: defaults for allocators that keep none) -----------------
    def stats(self) -> dict[str, Any]:
        """Counters (``allocated_bytes``, ``reserved_bytes``, ...); empty if none kept."""
        return {}

    def empty_cache(self) -> int:
        """Give cached, unused memory back to the device; returns the bytes released."""
        return 0

    @property
    def memory_limit(self) -> int | None:
        """Bytes of live allocations beyond which :meth:`alloc` raises (None: no limit)."""
        return None

    def set_memory_limit(self, limit: int | None) -> None:
        """Change :attr:`memory_limit`."""
        raise DeviceError(f"{type(self).__name__}: {self.device} memory has no settable "
                          "memory limit")


class Executable(ABC):
    """A loaded program: :meth:`launch` runs it on device memory.

    ``handles`` holds one :meth:`Allocator.handle` per program parameter, in order; the
    caller vouches for sizes and dtypes (:class:`hologram.runtime.launch.CompiledProgram`
    checks them for users). Outputs are written in place; scratch memory is the
    executable's business.
    """

    @abstractmethod
    def launch(self, handles: tuple[int, ...]) -> None:
        """Run the program on the parameters at ``handles``."""

    def resized(self, length: int) -> Executable | None:
        """This program, compiled at a template length (:mod:`hologram.compiler.generic`),
        run at ``length`` elements instead, sharing the code; None where the code depends on
        the length (the default: backends opt in with :attr:`Backend.generic_lengths`)."""
        return None


def host_arrays(params: Sequence[BufferDecl], addresses: Sequence[int]) -> list[np.ndarray]:
    """Flat NumPy views of host memory at ``addresses``, one per parameter declaration
    (for executables that compute on arrays, like the interpreter)."""
    arrays = []
    for param, address in zip(params, addresses):
        dtype = param.dtype.storage
        if param.size == 0 or not address:
            arrays.append(np.empty(param.size, dtype))
            continue
        raw = (ctypes.c_char * param.nbytes).from_address(address)
        arrays.append(np.frombuffer(raw, dtype, param.size))
    return arrays


def contiguous(array: np.ndarray, where: str, writable: bool = False) -> np.ndarray:
    """``array`` itself, checked to be C-contiguous (and writable, with ``writable``): the
    host side of :meth:`Allocator.read` and :meth:`Allocator.write`.
    :class:`~hologram.errors.ShapeError` otherwise."""
    flags = array.flags
    if not flags.c_contiguous or (writable and not flags.writeable):
        what = "C-contiguous (np.ascontiguousarray)" if not flags.c_contiguous else "writable"
        raise ShapeError(f"{where}: the host array {list(array.shape)} {array.dtype} must be "
                         f"{what}")
    return array


def check_arrays(program: Program, arrays: Sequence[object], where: str) -> list[np.ndarray]:
    """Check one array per parameter of ``program`` (count, dtype, size, contiguity,
    writability of outputs) and return flat views of them (stores land in the caller's
    arrays). Errors name ``where`` (the program and backend), the parameter, and what was
    expected and given."""
    params = program.params
    if len(arrays) != len(params):
        names = ", ".join(f"{p.kind} {p.name}" for p in params)
        raise ShapeError(f"{where}: takes {len(params)} arrays ({names}), got {len(arrays)}")
    return [_check(param, array, where) for param, array in zip(params, arrays)]


def _check(param: BufferDecl, array: object, where: str) -> np.ndarray:
    where = f"{where}, parameter {param.name} ({param.kind} {param.dtype.name}{list(param.shape)})"
    if not isinstance(array, np.ndarray):
        raise DTypeError(f"{where}: expected a NumPy array, got {type(array).__name__}")
    if array.dtype != param.dtype.storage:
        bits = " (bf16 bit patterns)" if param.dtype.name == "bf16" else ""
        raise DTypeError(f"{where}: expected {param.dtype.name} (NumPy "
                         f"{param.dtype.storage}{bits}), got {array.dtype}")
    if array.size != param.size:
        raise ShapeError(f"{where}: expected {param.size} elements, got shape "
                         f"{list(array.shape)}")
    if not array.flags.c_contiguous:
        raise ShapeError(f"{where}: the array must be C-contiguous "
                         "(pass np.ascontiguousarray(a) and copy results back)")
    if param.kind != "in" and not array.flags.writeable:
        raise ShapeError(f"{where}: output array is read-only")
    return array.reshape(-1)


class Backend(ABC):
    name: ClassVar[str]
    #: Do this backend's executables run an elementwise program's code at other lengths
    #: (:meth:`Executable.resized`)? Then such programs compile once for every length.
    generic_lengths: ClassVar[bool] = False

    @classmethod
    def is_available(cls) -> bool:
        """Can this backend run on this machine (drivers, devices, libraries present)?"""
        return True

    @classmethod
    def auto_available(cls) -> bool:
        """May ``"auto"`` pick this backend here? By default when it is available; a
        backend that runs emulated or not yet reliably says no."""
        return cls.is_available()

    @abstractmethod
    def target(self, name: str | None = None) -> str:
        """Identity of the target called ``name`` (``None``: the one this process runs),
        for cache keys; unknown names raise :class:`~hologram.errors.HologramError`
        listing the known ones."""

    @abstractmethod
    def compile(self, program: Program, target: str | None = None) -> bytes:
        """Render and compile a scheduled, verified program into an artifact for the
        target called ``target`` (``None``: the current one). Needs no device."""

    def capabilities(self, target: str | None = None) -> Capabilities:
        """What code for the target called ``target`` (``None``: the current one) can
        use; :meth:`compile` lowers programs for it (``pipeline.for_target``), a program
        using an operation it lacks (``gather``, ``scatter``) is refused there, and the
        conformance suite expects exactly that. Default: :class:`Capabilities`' defaults
        (a 64-bit target without the data-dependent memory operations)."""
        return Capabilities()

    def describe(self, artifact: bytes) -> dict[str, Any]:
        """What an artifact holds, for people and tools: kernels, launch plan, resources."""
        return {"bytes": len(artifact)}

    @abstractmethod
    def load(self, artifact: bytes) -> Executable:
        """Turn an artifact (fresh or read back from the disk cache) into an executable
        for this machine."""

    @abstractmethod
    def allocator(self, memory_limit: int | None = None) -> Allocator:
        """A new allocator for this backend's memory (each SDK executor has its own)."""

    # --- what the backend supports (checked by check_supported; conformance suite) ----
    def supports(self, op: str, dtype: DType) -> bool:
        """Can this backend run ISA opcode ``op`` (``"add"``, ``"reduce"``, ``"cast"``, ...)
        on values of ``dtype``? An instruction needs its opcode supported on its result's
        dtype and on each operand's (a ``cast`` from f64 to f32 needs ``("cast", f64)`` and
        ``("cast", f32)``). Default: everything the ISA defines. The conformance suite
        (tests/conformance) runs every supported pair against the interpreter and expects
        :class:`~hologram.errors.DTypeError` for every other."""
        return True

    def flushes_subnormals(self) -> bool:
        """Whether this backend's device flushes f32 subnormals to zero (and so bf16's): a
        deviation from the ISA a device may impose (WGSL allows it a driver). The
        conformance suite forgives exactly the differences flushing explains. Default:
        no."""
        return False

    def delegated(self, artifact: bytes) -> list[int]:
        """Indices of the kernels that ``artifact`` runs somewhere other than this
        backend's device (e.g. on the reference interpreter): the ``"interpreted"`` entry
        of :meth:`describe`, empty by default."""
        return list(self.describe(artifact).get("interpreted", ()))


# --- support checks ---------------------------------------------------------------------
def unsupported_pairs(backend: Backend, program: Program) -> list[tuple[str, str, DType]]:
    """``(kernel, op, dtype)`` for every pair ``program`` uses that ``backend`` does not
    support (see :meth:`Backend.supports`), each once, in program order."""
    found: dict[tuple[str, str, DType], None] = {}
    for kernel in program.kernels:
        body = kernel.body
        for instr in body:
            needed = [instr.dtype, *(body[a].dtype for a in instr.args)]
            for t in needed:
                if not backend.supports(instr.op, t):
                    found.setdefault((kernel.name, instr.op, t))
    return list(found)


def check_supported(backend: Backend, program: Program,
                    alternatives: Iterable[Backend] = ()) -> None:
    """Raise :class:`~hologram.errors.DTypeError` if ``program`` uses an (op, dtype) pair
    that ``backend`` does not support, naming the backend, the op, the dtype, the kernel
    and a fix: a backend among ``alternatives`` (iterated only on error) that supports the
    pair, or a dtype to cast to. Never runs anything elsewhere."""
    missing = unsupported_pairs(backend, program)
    if not missing:
        return
    others = list(alternatives)
    lines = []
    for kernel, op, t in missing:
        fixes = [f"run it on backend {o.name!r}" for o in others if o.supports(op, t)][:1]
        cast = next((c for c in _CAST_PREFERENCE.get(t.kind, ())
                     if c is not t and backend.supports(op, c)), None)
        if cast is not None:
            fixes.append(f"cast to {cast.name}")
        fix = " or ".join(fixes) or "no backend here supports it"
        lines.append(f"  {op} on {t.name} in kernel {kernel}: {fix}")
    raise DTypeError(f"backend {backend.name!r} does not support {len(missing)} (op, dtype) "
                     f"pair(s) of program {program.name!r}:\n" + "\n".join(lines))


# The dtypes to suggest a cast to, most preferred first, by kind.
_CAST_PREFERENCE: dict[str, tuple[DType, ...]] = {
    "f": tuple(dtypes.dtype(n) for n in ("f32", "f16", "bf16", "f64")),
    "i": tuple(dtypes.dtype(n) for n in ("i32", "i64", "i16", "i8")),
    "u": tuple(dtypes.dtype(n) for n in ("u8", "i32")),
    "b": (),
}
# --- end of support checks ----------------------------------------------------------------
