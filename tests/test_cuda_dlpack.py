"""DLPack with the CUDA device type (:mod:`hologram.backends.cuda.dlpack`): the ctypes
structs against NumPy's and PyTorch's own capsules (kDLCPU: their C code is the other
side), then kDLCUDA export and import through :class:`DeviceMemory` and cuda executors on
the recording fake driver of tests/test_cuda_runtime.py. No GPU: the pointers are fake
device addresses, so this proves the capsules' contents and ownership, not a CUDA
consumer's reads (docs/cuda.md)."""

from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest
from test_cuda_runtime import FakeDriver, fake_gpu, needs_triton  # noqa: F401 (a fixture)

import hologram as hg
from hologram.backends.cuda import dlpack
from hologram.backends.cuda.runtime import DeviceMemory
from hologram.errors import DeviceError, DTypeError, ShapeError

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def test_the_structs_have_the_abis_layout():
    assert ctypes.sizeof(dlpack.DLTensor) == 48
    assert ctypes.sizeof(dlpack.DLManagedTensor) == 64
    assert ctypes.sizeof(dlpack.DLManagedTensorVersioned) == 80
    assert dlpack.DLManagedTensorVersioned.dl_tensor.offset == 32


@pytest.mark.parametrize("versioned", [False, True])
def test_numpys_capsules_read_back_exactly(versioned):
    base = np.arange(24, dtype=np.int16).reshape(4, 6)
    view = base[1:, 2:]  # an offset and strides
    capsule = view.__dlpack__(max_version=(1, 0)) if versioned else view.__dlpack__()
    tensor = dlpack.unpack(capsule, "test")
    assert tensor.data == view.ctypes.data and tensor.device == (1, 0)
    assert tensor.shape == (3, 4) and tensor.strides == (6, 1) and not tensor.c_contiguous
    assert tensor.dtype == np.int16 and not tensor.read_only
    with pytest.raises(DTypeError, match="already consumed"):
        dlpack.unpack(capsule, "test")
    tensor.release()
    frozen = np.ones(3, bool)
    frozen.flags.writeable = False
    tensor = dlpack.unpack(frozen.__dlpack__(max_version=(1, 0)), "test")
    assert tensor.read_only and tensor.dtype == np.bool_ and tensor.c_contiguous
    tensor.release()


@pytest.mark.parametrize("version", [None, (1, 0)])
@pytest.mark.parametrize("consumer", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.bool_, np.float16])
def test_exported_capsules_are_read_by_numpy_and_torch(consumer, dtype, version):
    """Host memory exported with kDLCPU (what export writes for kDLCUDA but a device
    type NumPy and CPU torch read), legacy and versioned: the consumer sees the values,
    and the deleter runs once, when the consumer's array goes."""
    consumer = (np if consumer == "numpy" else pytest.importorskip("torch")).from_dlpack
    host = np.arange(12).astype(dtype)
    owner = _Owner()
    alive = weakref.ref(owner)
    before = dlpack.live_exports()
    capsule = dlpack.export(host.ctypes.data, (3, 4), host.dtype, (1, 0), owner, version)
    del owner
    out = consumer(_Producer(capsule, (1, 0)))
    del capsule
    gc.collect(0)  # young objects only: a full collection in a big process takes a second
    assert alive() is not None and dlpack.live_exports() == before + 1
    np.testing.assert_array_equal(np.asarray(out), host.reshape(3, 4))
    del out
    gc.collect(0)
    assert alive() is None and dlpack.live_exports() == before


@pytest.mark.parametrize("version", [None, (1, 0)])
def test_an_unconsumed_capsule_releases_its_owner(version):
    owner = _Owner()
    alive = weakref.ref(owner)
    capsule = dlpack.export(0x1000, (2,), np.dtype(np.float32), (2, 0), owner, version)
    del owner, capsule
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("version", [None, (1, 0), (1, 3)])
def test_a_device_block_exports_a_kdlcuda_capsule_that_reimports_exactly(version):
    driver = FakeDriver()
    memory = DeviceMemory(driver)
    block = memory.alloc((12,), np.float32)
    pointer = block.pointer
    capsule = memory.export_dlpack(block, (3, 4), np.dtype(np.float32), version)
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    assert name(capsule) == (b"dltensor_versioned" if version else b"dltensor")
    # no stream named: the legacy default stream waits for the work queued on ours
    assert driver.calls == [("record", "event", driver.stream), ("wait", 1, "event")]
    del block
    gc.collect()
    assert memory.stats()["allocated_bytes"] == 256  # the capsule holds the block
    tensor = dlpack.unpack(capsule, "test")
    assert (tensor.data, tensor.device, tensor.shape, tensor.strides) == (
        pointer, (2, 0), (3, 4), None)
    assert tensor.dtype == np.float32 and tensor.byte_offset == 0 and not tensor.read_only
    tensor.release()
    tensor.release()  # the consumer's duty is once: a second call does nothing
    gc.collect()
    assert [c[:2] for c in driver.calls[2:]] == [("event on", 1)]  # its reads, then reuse
    driver.finish(1)
    memory.synchronize()
    assert memory.stats()["allocated_bytes"] == 0 and memory.stats()["cached_bytes"] == 256


@pytest.mark.parametrize("stream,waits", [
    (None, 1),  # the consumer did not say: the legacy default stream (the protocol)
    (1, 1),  # the legacy default stream (CU_STREAM_LEGACY)
    (2, 2),  # the consumer thread's default stream (CU_STREAM_PER_THREAD)
    (0x7E57AB1E, 0x7E57AB1E),  # a stream handle (torch: current_stream().cuda_stream)
    (np.int64(0x7E57AB1E), 0x7E57AB1E),
    (-1, None),  # the consumer asked for no synchronization
    (FakeDriver.stream, None),  # our own stream: already in order
])
def test_export_orders_our_stream_before_the_consumers_with_an_event(stream, waits):
    """DLPack's stream semantics: the work queued on our stream is ordered before the
    consumer's stream by an event recorded on ours that the consumer's waits for (no host
    synchronization), none for -1 or for our own stream."""
    driver = FakeDriver()
    memory = DeviceMemory(driver)
    block = memory.alloc((4,), np.float32)
    capsule = memory.export_dlpack(block, (4,), np.dtype(np.float32), (1, 0), stream=stream)
    expected = [] if waits is None else [("record", "event", driver.stream),
                                         ("wait", waits, "event")]
    assert driver.calls == expected
    dlpack.unpack(capsule, "test").release()


@pytest.mark.parametrize("stream,held", [(0x7E57AB1E, True), (2, True), (None, True),
                                         (-1, False), (FakeDriver.stream, False)])
def test_a_consumers_reads_after_its_deleter_call_hold_the_block_until_they_complete(
        stream, held):
    """The consumer's deleter call may come before the reads it queued on its stream have
    run: the block is held (an event recorded on the consumer's stream) and reused only
    once they have, as PyTorch's record_stream would. Nothing is held for -1 (the consumer
    synchronizes itself) or for our own stream (in order already)."""
    driver = FakeDriver()
    memory = DeviceMemory(driver)
    block = memory.alloc((64,), np.float32)
    pointer = block.pointer
    capsule = memory.export_dlpack(block, (64,), np.dtype(np.float32), (1, 0), stream=stream)
    del block
    gc.collect()
    driver.calls.clear()
    dlpack.unpack(capsule, "test").release()  # the consumer is done with it, on the host
    consumer = dlpack.consumer_stream(stream)
    if not held:
        assert driver.calls == [] and memory.stats()["allocated_bytes"] == 0
        assert memory.alloc((64,), np.float32).pointer == pointer
        return
    assert [c[:2] for c in driver.calls] == [("event on", consumer)]
    assert memory.stats()["allocated_bytes"] == 256
    other = memory.alloc((64,), np.float32)  # not the held block
    assert other.pointer != pointer
    memory.synchronize()  # our stream's work is not the consumer's
    assert memory.stats()["allocated_bytes"] == 512
    driver.finish(consumer)
    assert memory.alloc((64,), np.float32).pointer == pointer  # its reads have completed
    assert memory.stats()["num_driver_allocs"] == 2


def test_running_out_of_memory_waits_for_held_blocks_before_giving_up():
    driver = FakeDriver(capacity=1024)
    memory = DeviceMemory(driver)
    block = memory.alloc((200,), np.float32)  # 800 bytes: the 832-byte class
    capsule = memory.export_dlpack(block, (200,), np.dtype(np.float32), None, stream=0x7E57)
    del block
    gc.collect()
    dlpack.unpack(capsule, "test").release()
    big = memory.alloc((240,), np.float32)  # another class: the driver has no room left
    assert memory.stats()["num_oom_retries"] == 1 and big.size == 1024
    assert memory.stats()["reserved_bytes"] == 1024  # the held block went back to the driver


@pytest.mark.parametrize("stream", [0, -2, 1.5, "1", True])
def test_streams_outside_the_protocol_are_refused_before_anything_is_exported(stream):
    driver = FakeDriver()
    memory = DeviceMemory(driver)
    block = memory.alloc((4,), np.float32)
    before = dlpack.live_exports()
    with pytest.raises(DeviceError, match=r"not a CUDA stream of the DLPack protocol.*-1 "
                                          r"\(no synchronization\); 0 is ambiguous"):
        memory.export_dlpack(block, (4,), np.dtype(np.float32), None, stream=stream)
    assert driver.calls == [] and dlpack.live_exports() == before


class _Exporter:
    """A producer of a block of another driver's memory (another stream), through its
    :meth:`DeviceMemory.export_dlpack`."""

    def __init__(self, memory, block):
        self.memory, self.block, self.streams = memory, block, []

    def __dlpack__(self, stream=None, max_version=None):
        self.streams.append(stream)
        return self.memory.export_dlpack(self.block, (4,), np.dtype(np.float32), max_version,
                                         stream=stream)

    def __dlpack_device__(self):
        return (2, 0)


def test_an_import_orders_our_stream_after_the_producers():
    """The importer passes its own stream, the producer records an event on its stream
    and makes the importer's wait for it; the importer calls nothing itself. An importer
    on the NULL stream (handle 0) names it 1, the legacy default stream."""
    theirs, ours = FakeDriver(), FakeDriver()
    theirs.stream = 0xB0B
    memory = DeviceMemory(theirs)
    producer = _Exporter(memory, memory.alloc((4,), np.float32))
    block, shape, dtype = DeviceMemory(ours).import_dlpack(producer)
    assert producer.streams == [ours.stream]
    assert theirs.calls == [("record", "event", 0xB0B), ("wait", ours.stream, "event")]
    assert ours.calls == [] and (block.pointer, shape, dtype) == (producer.block.pointer, (4,),
                                                                  np.float32)
    on_null = FakeDriver()
    on_null.stream = 0
    theirs.calls.clear()
    DeviceMemory(on_null).import_dlpack(producer)
    assert producer.streams[-1] == 1 and theirs.calls[-1] == ("wait", 1, "event")


class _Owner:
    pass


class _Producer:
    """Hands out one capsule, records the stream it was asked for."""

    def __init__(self, capsule, device):
        self.capsule, self.device, self.streams = capsule, device, []

    def __dlpack__(self, stream=None, **kwargs):
        self.streams.append(stream)
        return self.capsule

    def __dlpack_device__(self):
        return self.device


class _Handmade:
    """A producer of kDLCUDA memory written against dlpack.h alone: its own struct, its
    own deleter counting calls (stands in for a CUDA torch tensor)."""

    def __init__(self, pointer, shape, dtype=(2, 32), device=(2, 0), strides=None,
                 byte_offset=0, versioned=False, flags=0):
        self.deleted = 0
        kind = dlpack.DLManagedTensorVersioned if versioned else dlpack.DLManagedTensor
        self.managed = managed = kind()
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = (ctypes.c_int64 * len(shape))(*strides) if strides else None
        t = managed.dl_tensor
        t.data, t.ndim, t.byte_offset = pointer, len(shape), byte_offset
        t.device = dlpack.DLDevice(*device)
        t.dtype = dlpack.DLDataType(dtype[0], dtype[1], 1)
        t.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        if self.strides is not None:
            t.strides = ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64))
        if versioned:
            managed.version = dlpack.DLPackVersion(1, 0)
            managed.flags = flags
        self.deleter = type(managed.deleter)(self._delete)
        managed.deleter = self.deleter
        self.name = b"dltensor_versioned" if versioned else b"dltensor"
        self.device, self.streams = device, []

    def _delete(self, managed):
        self.deleted += 1

    def __dlpack__(self, stream=None):  # a producer from before DLPack 1.0's max_version
        self.streams.append(stream)
        return _new_capsule(ctypes.addressof(self.managed), self.name, None)

    def __dlpack_device__(self):
        return self.device


def test_a_handmade_kdlcuda_producer_is_imported_zero_copy_and_deleted_once():
    driver = FakeDriver()
    memory = DeviceMemory(driver)
    producer = _Handmade(0x7E0000001000, (2, 5), dtype=(0, 64), byte_offset=64)
    alive = weakref.ref(producer)
    block, shape, dtype = memory.import_dlpack(producer)
    assert (block.pointer, shape, dtype) == (0x7E0000001000 + 64, (2, 5), np.int64)
    assert memory.handle(block) == block.pointer and block.nbytes == 80
    assert producer.streams == [driver.stream]  # asked to order its work before ours
    assert memory.stats()["allocated_bytes"] == 0  # not the pool's memory
    del producer
    gc.collect()
    assert alive() is not None and alive().deleted == 0  # the block keeps it alive
    held = alive()
    memory.free(block)
    # our kernels may still use it: the deleter waits for an event on our stream
    assert driver.calls[-1][:2] == ("event on", None) and held.deleted == 0
    memory.synchronize()
    assert held.deleted == 1
    del block
    gc.collect()
    memory.synchronize()
    assert held.deleted == 1


@pytest.mark.parametrize("device,named", [((2, 1), "cuda:1"), ((1, 0), "cpu:0"),
                                          ((8, 0), "metal:0")])
def test_memory_of_another_device_is_refused_naming_both(device, named):
    producer = _Handmade(0x1000, (4,), device=device)
    with pytest.raises(DeviceError) as info:
        DeviceMemory(FakeDriver()).import_dlpack(producer)
    message = str(info.value)
    assert named in message and "cuda:0" in message and "t.to('cuda:0')" in message
    assert producer.streams == [] and producer.deleted == 0  # never asked for a capsule


def test_strided_read_only_and_unknown_dtypes_are_refused_and_released():
    memory = DeviceMemory(FakeDriver())
    strided = _Handmade(0x1000, (3, 4), strides=(1, 3))
    with pytest.raises(ShapeError, match=r"not C-contiguous \(strides \[1, 3\]\)"):
        memory.import_dlpack(strided)
    assert strided.deleted == 1
    frozen = _Handmade(0x1000, (3,), versioned=True, flags=1)
    with pytest.raises(ShapeError, match="read-only"):
        memory.import_dlpack(frozen)
    assert frozen.deleted == 1
    versioned = _Handmade(0x2000, (3, 1), strides=(1, 7), versioned=True)  # size-1 dim
    block, shape, dtype = memory.import_dlpack(versioned)
    assert (block.pointer, shape, dtype) == (0x2000, (3, 1), np.float32)
    bf16 = _Handmade(0x1000, (3,), dtype=(4, 16))
    with pytest.raises(DTypeError, match="code 4, 16 bits"):
        memory.import_dlpack(bf16)
    # A view 4 bytes into an allocation: the kernels are compiled for 16-byte alignment.
    view = _Handmade(0x3000, (3,), byte_offset=4)
    with pytest.raises(ShapeError, match=r"starts at 0x3004, not on a 16-byte boundary.*"
                                         r"\.clone\(\)"):
        memory.import_dlpack(view)
    assert view.deleted == 1


@needs_triton
def test_cuda_executors_share_buffers_through_dlpack(fake_gpu):  # noqa: F811 (the fixture)
    driver = fake_gpu
    with hg.Executor("cuda") as ex, hg.Executor("cuda") as other:
        data = np.arange(12, dtype=np.float32).reshape(3, 4)
        buf = ex.from_numpy(data)
        assert buf.__dlpack_device__() == (2, 0)
        driver.calls.clear()
        shared = other.from_dlpack(buf)  # exported as kDLCUDA 1.0, imported zero-copy
        # one process, one driver, one stream: in order already, nothing to wait for
        assert not [c for c in driver.calls if c[0] in ("record", "wait", "sync")]
        assert shared.handle == buf.handle and shared.shape == (3, 4)
        assert shared.dtype == np.float32 and shared.foreign
        np.testing.assert_array_equal(shared.to_numpy(), data)
        shared.from_numpy(data * 2)  # one memory: the write shows through the other
        np.testing.assert_array_equal(buf.to_numpy(), data * 2)
        assert other.memory_allocated() == 0 and ex.memory_allocated() == 256
        producer = _Handmade(buf.handle, (12,), dtype=(1, 8))
        raw = ex.from_dlpack(producer)
        assert raw.handle == buf.handle and raw.dtype == np.uint8 and raw.foreign
        assert raw.reshape(3, 4).foreign
        with pytest.raises(DeviceError, match=r"cpu:0 memory.*cuda:0"):
            ex.from_dlpack(np.zeros(3, np.float32))
        with pytest.raises(DeviceError, match=r"copied out with buf\.to_numpy"):
            buf.__dlpack__(dl_device=(1, 0))
        driver.calls.clear()
        for stream in (0x7E57AB1E, -1, None):  # a consumer's stream reaches the export
            dlpack.unpack(buf.__dlpack__(stream=stream), "test").release()
        assert [c[:3] if c[0] != "event on" else c[:2] for c in driver.calls] == [
            ("record", "event", driver.stream), ("wait", 0x7E57AB1E, "event"),
            ("event on", 0x7E57AB1E),  # the deleter: the consumer's reads come first
            ("record", "event", driver.stream), ("wait", 1, "event"), ("event on", 1)]
        driver.finish(0x7E57AB1E)
        driver.finish(1)
        with pytest.raises(DeviceError, match="stream=0 is not a CUDA stream"):
            buf.__dlpack__(stream=0)
        assert ex.from_dlpack(buf) is buf
        pointer = buf.handle
        buf.free()
        del buf
        gc.collect()
        assert pointer in driver.memory and ex.memory_allocated() == 256  # shared holds it
        shared.free()
        del shared
        gc.collect()
        other.synchronize()  # the importer's queued work is done: the capsule goes
        ex.synchronize()  # and what the consumers' streams held, now done
        assert ex.memory_allocated() == 0
        raw.free()
        del raw
        gc.collect()
        assert producer.deleted == 0  # until the work queued on our stream has run
        ex.synchronize()
        assert producer.deleted == 1
