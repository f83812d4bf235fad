"""The one module that calls the CUDA driver (``cuda-bindings``: ``cuda.bindings.driver``).

Everything above it (:mod:`.runtime`) takes a driver object with these methods, so its
logic is unit-tested with a fake one; this module's calls ran on an H100 once (docs/cuda.md,
"On an H100"), and a fake ``cuda.bindings.driver`` tests them in CI.

Every call checks its ``CUresult``: out of memory raises :class:`OutOfMemoryError`, any
other failure :class:`DeviceError` naming the call and the driver's error name.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from hologram.errors import DeviceError, OutOfMemoryError

_OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY
_NOT_READY = 600  # CUDA_ERROR_NOT_READY: cuEventQuery's "not yet"
_DEFAULT_SHARED = 48 * 1024  # dynamic shared memory a kernel gets without opting in


class Driver:
    """The CUDA driver API, as :mod:`.runtime` uses it (one context on one device)."""

    def __init__(self, device: int = 0, cu: Any = None):
        """Start ``device`` (its primary context, one stream). ``cu`` stands for
        ``cuda.bindings.driver`` (tests pass a fake module to check the probing logic)."""
        if cu is None:
            try:
                # Imported on first use: a machine without the package never loads it.
                from cuda.bindings import driver as cu
            except ImportError as err:
                raise DeviceError("cuda: the cuda-bindings package is not installed (pip "
                                  "install cuda-bindings); it needs an NVIDIA driver") from err
        self.cu = cu
        #: The device ordinal (DLPack's device id).
        self.ordinal = device
        try:
            initialized = cu.cuInit(0)
        except Exception as err:  # cuda-bindings loads libcuda here; without a driver it
            # raises its own error (cuda.pathfinder's DynamicLibNotFoundError), not a code
            raise DeviceError(f"cuda: no NVIDIA driver library (libcuda) could be loaded: "
                              f"{err}") from err
        self.check("cuInit", initialized)
        count = self.check("cuDeviceGetCount", cu.cuDeviceGetCount())
        if count <= device:
            raise DeviceError(f"cuda: no CUDA device {device} (the driver sees {count}); "
                              "check nvidia-smi and CUDA_VISIBLE_DEVICES")
        self.device = self.check("cuDeviceGet", cu.cuDeviceGet(device))
        self.context = self.check("cuDevicePrimaryCtxRetain",
                                  cu.cuDevicePrimaryCtxRetain(self.device))
        self.check("cuCtxSetCurrent", cu.cuCtxSetCurrent(self.context))
        self._thread = threading.local()  # .bound: this thread has the context current
        self._thread.bound = True
        #: The driver's own stream; created blocking (flag 0), as every stream here, so the
        #: legacy stream's copies (cuMemcpyHtoD, DtoH) wait for its work and it for theirs.
        self.default_stream = self.check("cuStreamCreate", cu.cuStreamCreate(0))
        self._event: Any = None  # record_event's, created on first use
        self._spare_events: list[Any] = []  # event_on's, back from event_done
        # launch's parameter blocks by parameter count: (values, their addresses)
        self._packed: dict[int, tuple[Any, Any]] = {}
        self._launch_lock = threading.Lock()

    def _bind(self) -> None:
        """Make this driver's context current on a thread calling it for the first time
        (a driver context is current per thread; another thread's calls would fail with
        CUDA_ERROR_INVALID_CONTEXT), as the CUDA runtime does for a thread's first call."""
        if not getattr(self._thread, "bound", False):
            self.check("cuCtxSetCurrent", self.cu.cuCtxSetCurrent(self.context))
            self._thread.bound = True

    def check(self, call: str, result: Any) -> Any:
        """The value(s) of a ``cuda.bindings`` call, or the error it reports."""
        err, *values = result if isinstance(result, tuple) else (result,)
        code = int(err)
        if code:
            name = self.cu.cuGetErrorName(err)[1]
            message = f"cuda: {call} failed: {name.decode() if name else code}"
            if code == _OUT_OF_MEMORY:
                raise OutOfMemoryError(message)
            raise DeviceError(message)
        return values[0] if len(values) == 1 else tuple(values) or None

    def capability(self) -> tuple[int, int]:
        cu = self.cu
        attr = cu.CUdevice_attribute
        major = self.check("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device))
        minor = self.check("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device))
        return major, minor

    def properties(self) -> dict[str, Any]:
        """``name``, ``total_memory`` (bytes) and ``multi_processor_count`` of the device
        (``cuDeviceGetName``, ``cuDeviceTotalMem``, ``cuDeviceGetAttribute``)."""
        cu = self.cu
        name = self.check("cuDeviceGetName", cu.cuDeviceGetName(256, self.device))
        total = self.check("cuDeviceTotalMem", cu.cuDeviceTotalMem(self.device))
        sms = self.check("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.device))
        name = name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
        return {"name": name, "total_memory": int(total), "multi_processor_count": int(sms)}

    def version(self) -> int:
        """The driver's CUDA version (``cuDriverGetVersion``: 12040 for 12.4)."""
        return int(self.check("cuDriverGetVersion", self.cu.cuDriverGetVersion()))

    @property
    def stream(self) -> Any:
        """The stream this thread's launches and device copies are queued on: the one
        :meth:`use_stream` made current on it, else :attr:`default_stream`."""
        current = getattr(self._thread, "stream", None)
        return self.default_stream if current is None else current

    def use_stream(self, stream: Any | None) -> None:
        """Queue this thread's work on ``stream`` from now on (None: the default one)."""
        self._thread.stream = stream

    def new_stream(self) -> Any:
        """A new stream (``cuStreamCreate``, blocking as the default one)."""
        self._bind()
        return self.check("cuStreamCreate", self.cu.cuStreamCreate(0))

    def stream_done(self, stream: Any, wait: bool = False) -> bool:
        """Has the work queued on ``stream`` completed (``cuStreamQuery``)? With ``wait``,
        once it has (``cuStreamSynchronize``)."""
        self._bind()
        if wait:
            self.check("cuStreamSynchronize", self.cu.cuStreamSynchronize(stream))
            return True
        return self._query("cuStreamQuery", self.cu.cuStreamQuery(stream))

    def new_event(self, timing: bool = False) -> Any:
        """A new event (``cuEventCreate``); ``timing``: it records a time."""
        self._bind()
        flags = self.cu.CUevent_flags
        return self.check("cuEventCreate", self.cu.cuEventCreate(
            flags.CU_EVENT_DEFAULT if timing else flags.CU_EVENT_DISABLE_TIMING))

    def record(self, event: Any, stream: Any) -> None:
        """Record ``event`` on ``stream`` (``cuEventRecord``)."""
        self._bind()
        self.check("cuEventRecord", self.cu.cuEventRecord(event, stream))

    def event_finished(self, event: Any, wait: bool = False) -> bool:
        """Has the work ``event`` was recorded after completed (``cuEventQuery``)? With
        ``wait``, once it has (``cuEventSynchronize``)."""
        self._bind()
        if wait:
            self.check("cuEventSynchronize", self.cu.cuEventSynchronize(event))
            return True
        return self._query("cuEventQuery", self.cu.cuEventQuery(event))

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two timed events' records (``cuEventElapsedTime``)."""
        self._bind()
        return float(self.check("cuEventElapsedTime", self.cu.cuEventElapsedTime(start, end)))

    def synchronize_all(self) -> None:
        """Wait for the work of every stream of the context (``cuCtxSynchronize``)."""
        self._bind()
        self.check("cuCtxSynchronize", self.cu.cuCtxSynchronize())

    def _query(self, call: str, result: Any) -> bool:
        code = int(result[0] if isinstance(result, tuple) else result)
        if code == _NOT_READY:
            return False
        self.check(call, result)
        return True

    def stream_handle(self) -> int:
        """This driver's stream as an integer (``CUstream``), the ``stream`` a DLPack
        producer is asked to make its work visible to."""
        return int(self.stream)

    def record_event(self) -> Any:
        """Record this driver's event on its stream (``cuEventRecord``) and return it: the
        event completes when the work queued on the stream so far has. One event, created
        on first use without timing (``CU_EVENT_DISABLE_TIMING``), is recorded again each
        time: a wait already queued on it keeps the record it was queued after."""
        self._bind()
        cu = self.cu
        if self._event is None:
            self._event = self.check("cuEventCreate", cu.cuEventCreate(
                cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))
        self.check("cuEventRecord", cu.cuEventRecord(self._event, self.stream))
        return self._event

    def wait_event(self, stream: int, event: Any) -> None:
        """Make work queued on ``stream`` from now on wait for ``event``
        (``cuStreamWaitEvent``). ``stream`` is a ``CUstream`` handle as an integer; 1 and
        2 are the driver's own names for the legacy and the calling thread's default
        streams (``CU_STREAM_LEGACY``, ``CU_STREAM_PER_THREAD``), as in DLPack."""
        self._bind()
        self.check("cuStreamWaitEvent", self.cu.cuStreamWaitEvent(self.cu.CUstream(stream),
                                                                  event, 0))

    def event_on(self, stream: int | None = None) -> Any:
        """A new event recorded on ``stream`` (a handle as in :meth:`wait_event`; None:
        ours): it completes when the work queued on that stream so far has. Events are
        untimed and reused once :meth:`event_done` has seen them complete.

        Called where a consumer gives memory back (a DLPack deleter), which may be any
        thread: the calls are made with this driver's context pushed, and the thread's own
        context (a PyTorch device's, say) is current again afterwards."""
        cu = self.cu
        with self._pushed():
            event = self._spare_events.pop() if self._spare_events else self.check(
                "cuEventCreate", cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))
            target = self.stream if stream is None else cu.CUstream(stream)
            self.check("cuEventRecord", cu.cuEventRecord(event, target))
        return event

    def event_done(self, event: Any, wait: bool = False) -> bool:
        """Whether ``event`` (from :meth:`event_on`) has completed (``cuEventQuery``), or,
        with ``wait``, once it has (``cuEventSynchronize``). A completed event goes back to
        the spares: the caller must not use it again."""
        cu = self.cu
        with self._pushed():
            if wait:
                self.check("cuEventSynchronize", cu.cuEventSynchronize(event))
            elif not self._query("cuEventQuery", cu.cuEventQuery(event)):
                return False
        self._spare_events.append(event)
        return True

    @contextlib.contextmanager
    def _pushed(self) -> Iterator[None]:
        """This driver's context current on the calling thread for the duration
        (``cuCtxPushCurrent`` / ``cuCtxPopCurrent``)."""
        self.check("cuCtxPushCurrent", self.cu.cuCtxPushCurrent(self.context))
        try:
            yield
        finally:
            self.check("cuCtxPopCurrent", self.cu.cuCtxPopCurrent())

    def mem_alloc(self, nbytes: int) -> int:
        self._bind()
        return int(self.check("cuMemAlloc", self.cu.cuMemAlloc(nbytes)))

    def mem_free(self, pointer: int) -> None:
        self._bind()
        self.check("cuMemFree", self.cu.cuMemFree(pointer))

    # Host memory is passed by address: cuda-bindings reads a 0-d NumPy array as a number
    # (its value, converted by __int__), not as a buffer. Arrays are C-contiguous here.
    def copy_in(self, pointer: int, source: np.ndarray) -> None:
        self._bind()
        source = np.ascontiguousarray(source)
        if source.nbytes:  # a copy of 0 bytes is CUDA_ERROR_INVALID_VALUE
            self.check("cuMemcpyHtoD", self.cu.cuMemcpyHtoD(pointer, source.ctypes.data,
                                                            source.nbytes))

    def copy_in_async(self, pointer: int, source: np.ndarray) -> None:
        """Host to device, queued on this thread's stream (the caller keeps ``source``
        alive until the stream passes it)."""
        self._bind()
        if source.nbytes:
            self.check("cuMemcpyHtoDAsync", self.cu.cuMemcpyHtoDAsync(
                pointer, source.ctypes.data, source.nbytes, self.stream))

    def page_locking(self) -> tuple[int, int, int, int] | None:
        """The addresses of libcuda's ``cuMemHostAlloc``, ``cuMemFreeHost`` and
        ``cuCtxSetCurrent`` and this driver's context: what native code (the torch
        device's pinned-memory allocator) calls to hand out page-locked host memory, from
        which copies run asynchronously (``cuMemcpyHtoDAsync`` from pageable memory waits
        for the copy). None where the library cannot be opened by its name."""
        self._bind()
        try:
            library = ctypes.CDLL("libcuda.so.1")  # the one cuda-bindings loaded
        except OSError:
            return None
        return (*(ctypes.cast(getattr(library, name), ctypes.c_void_p).value
                  for name in ("cuMemHostAlloc", "cuMemFreeHost", "cuCtxSetCurrent")),
                int(self.context))

    def copy_out(self, destination: np.ndarray, pointer: int) -> None:
        self._bind()
        if destination.nbytes:
            self.check("cuMemcpyDtoH", self.cu.cuMemcpyDtoH(destination.ctypes.data, pointer,
                                                            destination.nbytes))

    def copy_device(self, destination: int, source: int, nbytes: int) -> None:
        """Device to device, queued on this driver's stream after its launches."""
        self._bind()
        if nbytes:
            self.check("cuMemcpyDtoDAsync", self.cu.cuMemcpyDtoDAsync(destination, source,
                                                                      nbytes, self.stream))

    def load_module(self, cubin: bytes) -> Any:
        self._bind()
        return self.check("cuModuleLoadData", self.cu.cuModuleLoadData(cubin))

    def function(self, module: Any, name: str, shared: int = 0) -> Any:
        """The kernel ``name`` of ``module``, allowed ``shared`` bytes of dynamic shared
        memory: past the default 48 KiB a kernel must opt in
        (``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``), as Triton's launcher does."""
        self._bind()
        cu = self.cu
        function = self.check("cuModuleGetFunction", cu.cuModuleGetFunction(module,
                                                                           name.encode()))
        if shared > _DEFAULT_SHARED:
            self.check("cuFuncSetAttribute", cu.cuFuncSetAttribute(
                function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared))
        return function

    def launch(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared: int, params: list[int]) -> None:
        """Launch with one 64-bit pointer per kernel parameter (every parameter of the
        kernels we build is a pointer). ``cuLaunchKernel`` reads the parameters during the
        call, so one block of values and the array of their addresses per parameter count
        serve every launch, filled under a lock (made per launch, they cost 2.7 µs of
        Python; reused, 1.1)."""
        self._bind()
        with self._launch_lock:
            packed = self._packed.get(len(params))
            if packed is None:
                values = (ctypes.c_uint64 * len(params))()
                base = ctypes.addressof(values)
                addresses = (ctypes.c_void_p * len(params))(
                    *(base + 8 * i for i in range(len(params))))
                packed = self._packed[len(params)] = (values, addresses)
            values, addresses = packed
            values[:] = params
            self.check("cuLaunchKernel", self.cu.cuLaunchKernel(
                function, *grid, *block, shared, self.stream, ctypes.addressof(addresses), 0))

    def synchronize(self) -> None:
        self._bind()
        self.check("cuStreamSynchronize", self.cu.cuStreamSynchronize(self.stream))
