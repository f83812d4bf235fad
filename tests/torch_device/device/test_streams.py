"""Streams and events of the device (hologram_torch/streams.py): their semantics on host
memory, where kernels run when launched; their calls into a CUDA driver (a fake one that
records them); and the allocator's stream safety against a driver whose work completes
only when the test says so (kernels slow on purpose)."""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_runtime import FakeDriver

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402  (registers the device)
from hologram.backends.cuda.runtime import DeviceMemory  # noqa: E402
from hologram_torch import lazy, streams  # noqa: E402

H = torch.hologram


def test_streams_are_torch_streams_and_nest():
    s, t = H.Stream(), H.Stream("hologram:0")
    assert isinstance(s, torch.Stream) and s.device == torch.device("hologram", 0)
    assert s != t and s.stream_id != t.stream_id != 0
    default = H.default_stream()
    assert H.current_stream() == default and default.stream_id == 0
    with H.stream(s):
        assert H.current_stream() == s
        with H.stream(t):
            assert H.current_stream() == t
        with H.stream(None):  # None leaves the current stream
            assert H.current_stream() == s
        assert H.current_stream() == s
    assert H.current_stream() == default
    H.set_stream(t)
    try:
        assert H.current_stream() == t
    finally:
        H.set_stream(default)
    with pytest.raises(ValueError, match="expected a hologram stream"):
        H.set_stream(torch.Stream(device="cpu"))


def test_work_on_side_streams_and_events_on_host_memory():
    """Kernels run when launched: streams are always complete, events complete when
    recorded, waits return at once, elapsed_time is the host's clock."""
    s = H.Stream()
    x = torch.arange(6.0, device="hologram")
    start, end = H.Event(enable_timing=True), H.Event(enable_timing=True)
    assert start.query()  # not recorded yet: complete, as CUDA's
    start.record()
    with H.stream(s):
        y = x * 2
        s.wait_event(start)
        done = s.record_event()
    H.current_stream().wait_stream(s)
    end.record()
    assert s.query() and done.query() and end.query()
    assert end.elapsed_time(end) == 0.0 and start.elapsed_time(end) >= 0.0
    s.synchronize()
    H.synchronize()
    y.record_stream(s)
    assert y.cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        H.Event().elapsed_time(end)
    with pytest.raises(RuntimeError, match="must be recorded"):
        H.Event(enable_timing=True).elapsed_time(end)
    with pytest.raises(NotImplementedError, match="interprocess"):
        H.Event(interprocess=True)
    with pytest.raises(RuntimeError, match="record_stream"):
        y.record_stream(torch.Stream(device="cpu"))


def test_a_recorded_region_is_cut_when_the_stream_changes():
    s = H.Stream()
    x = torch.ones(8, device="hologram")
    with hologram_torch.set_lazy(True):
        lazy.reset_stats()
        y = x + 1
        with H.stream(s):  # y's op was issued on the default stream: it runs there
            assert lazy.stats()["cuts"].get("stream") == 1
            z = y * 3
        assert lazy.stats()["cuts"].get("stream") == 2  # and z's on s
        assert z.cpu().tolist() == [6.0] * 8


class Handle(str):
    """A fake stream handle: int() of it is its number, as a CUstream's is its address."""

    def __int__(self) -> int:
        return int(self.rsplit("-", 1)[1])


class StreamDriver(FakeDriver):
    """The fake driver, with streams and events (names, recorded in ``calls``)."""

    def __init__(self) -> None:
        super().__init__()
        self.default_stream = Handle("stream-0")
        self.made = 0

    def new_stream(self):
        self.made += 1
        return Handle(f"stream-{self.made}")

    def use_stream(self, stream) -> None:
        self.calls.append(("use", stream))

    def stream_done(self, stream, wait=False) -> bool:
        self.calls.append(("stream done", stream, wait))
        return True

    def new_event(self, timing=False):
        self.calls.append(("new event", timing))
        return f"event-{len(self.calls)}"

    def record(self, event, stream) -> None:
        self.calls.append(("record", event, stream))

    def event_finished(self, event, wait=False) -> bool:
        return True

    def wait_event(self, stream, event) -> None:
        self.calls.append(("wait", stream, event))

    def elapsed_ms(self, start, end) -> float:
        return 1.5

    def synchronize_all(self) -> None:
        self.calls.append(("synchronize all",))


def test_driver_streams_route_launches_and_order_work_by_events(monkeypatch):
    driver = StreamDriver()
    memory = DeviceMemory(driver)
    held = []
    monkeypatch.setattr(streams.memory, "hold_released", held.append)
    backend = streams._DriverStreams(memory)
    side = backend.new_stream()
    assert side == 1 and held == [backend.hold]  # blocks now wait for every stream
    backend.make_current(side)
    backend.make_current(0)
    assert driver.calls[-2:] == [("use", "stream-1"), ("use", None)]
    start, end = streams.Event(enable_timing=True), streams.Event()
    backend.record(start, side)
    assert driver.calls[-2:] == [("new event", True), ("record", start._event, "stream-1")]
    backend.record(end, 0)
    assert driver.calls[-2:] == [("new event", False), ("record", end._event, "stream-0")]
    backend.wait(start, 0)
    assert driver.calls[-1] == ("wait", 0, start._event)
    assert backend.elapsed_ms(start, end) == 1.5
    assert backend.stream_done(side, wait=True)
    assert driver.calls[-1] == ("stream done", "stream-1", True)
    block = memory.alloc((10,), np.uint8)
    backend.hold(block)  # held until both streams' queued work completes
    assert [c[1] for c in driver.calls[-2:]] == [0, 1] and driver.calls[-1][0] == "event on"


def test_a_block_let_go_waits_for_every_streams_queued_work():
    """The allocator's stream safety, with kernels slow on purpose: the fake driver's
    events complete only when the test finishes their stream. A block let go while two
    streams have work queued is not handed out again until both have completed it."""
    driver = FakeDriver()
    memory = DeviceMemory(driver)
    block = memory.alloc((1000,), np.uint8)
    pointer = block.pointer
    memory.release_after(block, [0x5EED, 0xBEEF])
    del block  # its tensors let it go; the kernels reading it have not completed
    other = memory.alloc((1000,), np.uint8)
    assert other.pointer != pointer  # still in use on both streams
    driver.finish(0xBEEF)
    again = memory.alloc((1000,), np.uint8)
    assert again.pointer not in (pointer, other.pointer)  # 0x5EED's work still queued
    driver.finish(0x5EED)
    assert memory.alloc((1000,), np.uint8).pointer == pointer  # both done: reused
