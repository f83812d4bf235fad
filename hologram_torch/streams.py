"""Streams and events of the device, as ``torch.cuda``'s: ``torch.hologram.Stream``,
``Event``, ``current_stream``, ``default_stream``, ``set_stream``, ``stream`` and
``synchronize``, and ``Tensor.record_stream``.

On the cuda backend (a GPU) they are the backend driver's CUDA streams and events: the
kernels and device-to-device copies a thread launches are queued on its current stream,
events order streams without the host waiting, and ``elapsed_time`` is the GPU's. Copies
to and from the host wait for every stream (they run on the legacy stream, which the
device's blocking streams synchronize with). A recorded region (:mod:`.lazy`) is cut
when the current stream changes, so each runs on the stream its ops were issued on.

The caching allocator never hands a block to a request while work queued on another
stream may still use it: once side streams exist, a block that its tensors let go is
held until the work queued so far on every stream has completed
(:meth:`hologram.backends.cuda.runtime.DeviceMemory.release_after`). That is more
conservative than PyTorch's per-stream pools, and it makes ``record_stream`` a no-op.

On host memory (the cpu backend, the interpreter) and on the cuda emulation kernels run
when they are launched: streams exist, nest and compare as on a GPU, but every stream is
always complete, an event completes when it is recorded, a wait returns at once, and
``elapsed_time`` measures the host's clock between two records. On webgpu, whose work
runs in order on the device's one queue, the same holds once a record or a stream's
query has waited for the queue: events order nothing the queue does not, and
``elapsed_time`` is the host's clock between two such waits.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from hologram_torch import lazy, memory
from hologram_torch.constants import NAME

_TYPE = torch.Stream(device=NAME).device_type  # PrivateUse1's c10 device type code
_local = threading.local()  # .stream_id: this thread's current stream
_streams: dict[int, Stream] = {}  # every stream made, by id (0: the default stream)


class _HostStreams:
    """Streams of a device whose kernels run when launched, or run in order on one queue
    (webgpu): there, a query or a record waits for the queue (see the module
    docstring)."""

    def __init__(self) -> None:
        self.count = 1

    def new_stream(self) -> int:
        self.count += 1
        return self.count - 1

    def make_current(self, stream_id: int) -> None:
        pass

    def stream_done(self, stream_id: int, wait: bool = False) -> bool:
        memory.synchronize()  # (nothing to wait for on host memory)
        return True

    def record(self, event: Event, stream_id: int) -> None:
        memory.synchronize()
        event._time = time.perf_counter()

    def event_done(self, event: Event, wait: bool = False) -> bool:
        return True

    def wait(self, event: Event, stream_id: int) -> None:
        pass

    def elapsed_ms(self, start: Event, end: Event) -> float:
        return (end._time - start._time) * 1e3

    def synchronize(self) -> None:
        memory.synchronize()


class _DriverStreams:
    """CUDA streams and events of the driver of ``allocator`` (the device's GPU memory)."""

    def __init__(self, allocator: Any) -> None:
        self.memory, self.driver = allocator, allocator.driver
        self.handles: list[Any] = [self.driver.default_stream]

    def new_stream(self) -> int:
        self.handles.append(self.driver.new_stream())
        # From now on a block let go waits for every stream's queued work.
        memory.hold_released(self.hold)
        return len(self.handles) - 1

    def hold(self, block: Any) -> None:
        self.memory.release_after(block, [int(h) for h in self.handles])

    def make_current(self, stream_id: int) -> None:
        self.driver.use_stream(None if stream_id == 0 else self.handles[stream_id])

    def stream_done(self, stream_id: int, wait: bool = False) -> bool:
        return self.driver.stream_done(self.handles[stream_id], wait)

    def record(self, event: Event, stream_id: int) -> None:
        if event._event is None:
            event._event = self.driver.new_event(event.enable_timing)
        self.driver.record(event._event, self.handles[stream_id])

    def event_done(self, event: Event, wait: bool = False) -> bool:
        return event._event is None or self.driver.event_finished(event._event, wait)

    def wait(self, event: Event, stream_id: int) -> None:
        if event._event is not None:
            self.driver.wait_event(int(self.handles[stream_id]), event._event)

    def elapsed_ms(self, start: Event, end: Event) -> float:
        return self.driver.elapsed_ms(start._event, end._event)

    def synchronize(self) -> None:
        self.driver.synchronize_all()
        memory.synchronize()  # (and the allocator's releases that waited for it)


_backend_of: dict[int, Any] = {}


def _backend():
    """The streams of the device's memory as it is now (chosen with the backend)."""
    allocator = memory.allocator()
    found = _backend_of.get(id(allocator))
    if found is None:
        found = _backend_of[id(allocator)] = (
            _DriverStreams(allocator) if hasattr(allocator, "driver") else _HostStreams())
    return found


def _check_device(device: object) -> None:
    from hologram_torch.device import _index  # (device imports this module)

    _index(device)


class Stream(torch.Stream):
    """A stream of ``hologram:0`` (a ``torch.Stream``). ``Stream()`` makes a new one; the
    device's default stream is :func:`default_stream`. ``priority`` is accepted and
    ignored (one priority)."""

    def __new__(cls, device: object = None, priority: int = 0, **kwargs: Any) -> Stream:
        if kwargs:  # torch rebuilding a stream from (stream_id, device_index, device_type)
            return super().__new__(cls, **kwargs)
        _check_device(device)
        stream_id = _backend().new_stream()
        made = _streams[stream_id] = super().__new__(cls, stream_id=stream_id,
                                                     device_index=0, device_type=_TYPE)
        return made

    def __init__(self, device: object = None, priority: int = 0, **kwargs: Any) -> None:
        pass

    def query(self) -> bool:
        """Has every kernel queued on this stream completed?"""
        return _backend().stream_done(self.stream_id)

    def synchronize(self) -> None:
        """Wait for the kernels queued on this stream (and run pending recorded ops)."""
        lazy.sync("synchronize")
        _backend().stream_done(self.stream_id, wait=True)

    def wait_event(self, event: Event) -> None:
        """Make this stream's later work wait for ``event``'s (without the host waiting)."""
        event.wait(self)

    def wait_stream(self, stream: Stream) -> None:
        """Make this stream's later work wait for the work queued on ``stream`` so far."""
        self.wait_event(stream.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<torch.hologram.Stream device={NAME}:0 stream_id={self.stream_id}>"


class Event:
    """An event of ``hologram:0``, as ``torch.cuda.Event``: recorded on a stream, it
    completes when the work queued there before it has; ``enable_timing`` lets
    :meth:`elapsed_time` measure between two. ``blocking`` and ``interprocess`` are
    accepted; interprocess events are refused."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        if interprocess:
            raise NotImplementedError(f"{NAME}: interprocess events are not supported")
        self.enable_timing = enable_timing
        self._event: Any = None  # the driver's, on a GPU
        self._time: float | None = None  # the host's clock at the record, on host memory
        self._recorded = False

    def record(self, stream: Stream | None = None) -> None:
        """Record the event on ``stream`` (default: the current one). Pending recorded
        ops run first: they were issued before it."""
        lazy.sync("event")
        stream = stream if stream is not None else current_stream()
        _backend().record(self, stream.stream_id)
        self._recorded = True

    def wait(self, stream: Stream | None = None) -> None:
        """Make ``stream``'s (default: the current one's) later work wait for this
        event."""
        lazy.sync("event")
        stream = stream if stream is not None else current_stream()
        _backend().wait(self, stream.stream_id)

    def query(self) -> bool:
        return not self._recorded or _backend().event_done(self)

    def synchronize(self) -> None:
        if self._recorded:
            _backend().event_done(self, wait=True)

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds between this event's record and ``end_event``'s (both recorded,
        both made with ``enable_timing=True``; waits for ``end_event``)."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument "
                               "'enable_timing=True'.")  # PyTorch's words
        if not (self._recorded and end_event._recorded):
            raise RuntimeError("Both events must be recorded before calculating elapsed "
                               "time.")
        end_event.synchronize()
        return _backend().elapsed_ms(self, end_event)

    def __repr__(self) -> str:
        return f"<torch.hologram.Event enable_timing={self.enable_timing}>"


def default_stream(device: object = None) -> Stream:
    """The device's default stream (id 0)."""
    _check_device(device)
    found = _streams.get(0)
    if found is None:
        found = _streams[0] = torch.Stream.__new__(Stream, stream_id=0, device_index=0,
                                                   device_type=_TYPE)
    return found


def current_stream(device: object = None) -> Stream:
    """This thread's current stream (the default one unless :func:`stream` or
    :func:`set_stream` chose another)."""
    _check_device(device)
    return _streams.get(getattr(_local, "stream_id", 0)) or default_stream()


def set_stream(stream: Stream) -> None:
    """Make ``stream`` this thread's current stream. Pending recorded ops run first, on
    the stream they were issued on."""
    if stream is None:
        return
    if stream.device_type != _TYPE:
        raise ValueError(f"set_stream: expected a {NAME} stream, got one of {stream.device}")
    if getattr(_local, "stream_id", 0) != stream.stream_id:
        lazy.sync("stream")
        _backend().make_current(stream.stream_id)
        _local.stream_id = stream.stream_id


@contextlib.contextmanager
def stream(s: Stream | None) -> Iterator[None]:
    """``with torch.hologram.stream(s):`` issues the block's work on ``s`` (None: leaves
    the current stream as it is), then makes the previous stream current again."""
    if s is None:
        yield
        return
    previous = current_stream()
    set_stream(s)
    try:
        yield
    finally:
        set_stream(previous)


def synchronize() -> None:
    """Run the recorded ops still pending, and wait for every stream's work."""
    lazy.sync("synchronize")
    _backend().synchronize()


__all__ = ["Event", "Stream", "current_stream", "default_stream", "set_stream", "stream",
           "synchronize"]
