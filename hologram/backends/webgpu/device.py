"""The WebGPU device: one adapter and one logical device per process and adapter kind.

``wgpu`` (wgpu-native underneath) is imported only here and only when a device is first
asked for, so ``import hologram`` never loads it. Which adapter a backend name means:

- ``webgpu``: wgpu's own choice for ``power_preference="high-performance"`` (on a machine
  without a GPU but with Mesa's lavapipe, the CPU Vulkan driver);
- ``metal`` / ``vulkan``: the first adapter whose backend is Metal / Vulkan.

:func:`is_hardware` tells whether an adapter is a real GPU: CPU-emulated adapters
(lavapipe and llvmpipe, SwiftShader) report ``adapter_type == "CPU"``; ``"auto"`` never
picks them.

When a device is opened, :func:`probe_subnormals` runs a tiny shader on it to learn
whether the driver flushes f32 subnormals to zero (WGSL allows it; NVIDIA's Vulkan
driver does, lavapipe does not): :attr:`Device.flushes_subnormals`.
"""

from __future__ import annotations

import glob
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from hologram.errors import DeviceError

#: Backend name -> the wgpu backend type its adapter must have (None: any).
BACKEND_TYPES = {"webgpu": None, "metal": "Metal", "vulkan": "Vulkan"}

_INSTALL = ("install a Vulkan driver (Debian/Ubuntu: apt-get install mesa-vulkan-drivers "
            "libvulkan1, a CPU driver; or your GPU's driver) and the wgpu package "
            "(pip install 'hologram-tensor[webgpu]')")


@dataclass
class Device:
    """An open device and what was learnt about its adapter."""

    kind: str  # the backend name that asked for it
    adapter: Any
    device: Any
    queue: Any
    info: dict
    limits: dict
    features: frozenset
    #: Whether the driver flushes f32 subnormals to zero in float arithmetic and
    #: comparisons (:func:`probe_subnormals`, run when the device was opened).
    flushes_subnormals: bool = False

    @property
    def summary(self) -> str:
        """Which adapter runs the kernels, e.g. ``llvmpipe (LLVM 15.0.6) (CPU) via
        Vulkan``."""
        return self.adapter.summary

    @property
    def is_hardware(self) -> bool:
        return is_hardware(self.info)


_devices: dict[str, Device] = {}
_instance_set = False
_adapters: dict[str, Any] = {}
_lock = threading.Lock()


def wgpu_module():
    """The ``wgpu`` module, or :class:`DeviceError` naming what to install."""
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # Mesa warns without one; harmless
    global _instance_set
    try:
        import wgpu
    except Exception as err:  # ImportError, or a missing native library
        raise DeviceError(f"webgpu: the wgpu package cannot be imported ({err}); {_INSTALL}"
                          ) from err
    if not _instance_set:
        _instance_set = True
        try:
            from wgpu.backends.wgpu_native.extras import set_instance_extras

            # No OpenGL backend (compute needs Vulkan, Metal or D3D12 anyway): probing it
            # loads Mesa's libGL/EGL, whose LLVM then crashes any later import of a
            # library with its own LLVM (measured: `import triton` segfaulted).
            set_instance_extras(backends=["Vulkan", "Metal", "DX12"])
        except Exception:  # an instance exists already (the user's): keep it
            pass
    return wgpu


def is_hardware(info: dict) -> bool:
    """Whether an adapter is a GPU rather than a CPU emulation (lavapipe, SwiftShader)."""
    return str(info.get("adapter_type", "")).upper() not in ("CPU", "UNKNOWN", "")


def gpu_may_exist() -> bool:
    """False where there can be no GPU adapter, known without loading a driver: a Linux
    machine with no GPU device node (``/dev/dri/renderD*``, ``/dev/nvidia[0-9]*``,
    ``/dev/kfd``, WSL's ``/dev/dxg``), where wgpu could find only a CPU emulation. True
    elsewhere."""
    if not sys.platform.startswith("linux"):
        return True
    return any(glob.glob(pattern) for pattern in ("/dev/dri/renderD*", "/dev/nvidia[0-9]*",
                                                  "/dev/kfd", "/dev/dxg"))


def adapter(kind: str = "webgpu") -> Any:
    """The adapter backend ``kind`` runs on (cached), or :class:`DeviceError`."""
    with _lock:
        if kind in _adapters:
            return _adapters[kind]
        wgpu = wgpu_module()
        wanted = BACKEND_TYPES[kind]
        found = None
        try:
            if wanted is None:
                found = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
            else:
                found = next((a for a in wgpu.gpu.enumerate_adapters_sync()
                              if a.info.get("backend_type") == wanted), None)
        except Exception as err:  # no driver at all: wgpu-native raises
            raise DeviceError(f"{kind}: no WebGPU adapter ({err}); {_INSTALL}") from err
        if found is None:
            if wanted == "Metal":
                raise DeviceError("metal: no adapter with a Metal backend on this machine "
                                  "(Metal is macOS's; elsewhere use backend='webgpu')")
            why = "no WebGPU adapter" if wanted is None else f"no adapter with a {wanted} backend"
            raise DeviceError(f"{kind}: {why} on this machine; {_INSTALL}")
        _adapters[kind] = found
        return found


def get(kind: str = "webgpu") -> Device:
    """The process's device for backend ``kind`` (opened on first use)."""
    with _lock:
        if kind in _devices:
            return _devices[kind]
    found = adapter(kind)
    with _lock:
        if kind in _devices:
            return _devices[kind]
        try:
            # No required limits: wgpu-py then asks for the adapter's own (larger storage
            # bindings, more buffers per stage than WebGPU's defaults). No optional
            # features: the shaders use core WGSL only, so what runs on lavapipe runs on
            # Metal too.
            dev = found.request_device_sync()
        except Exception as err:
            raise DeviceError(f"{kind}: the adapter {found.summary} refused a device ({err})"
                              ) from err
        opened = Device(kind, found, dev, dev.queue, dict(found.info), dict(dev.limits),
                        frozenset(dev.features))
        opened.flushes_subnormals = probe_subnormals(opened)
        _devices[kind] = opened
        return opened


#: The probe's shader: subnormals (and the operands that make or keep them) come from the
#: buffer, so no compiler can fold them; every result is stored as bits.
_PROBE = """\
@group(0) @binding(0) var<storage, read_write> io: array<u32>;
@compute @workgroup_size(1)
fn main() {
  let sub = bitcast<f32>(io[0]);
  let zero = bitcast<f32>(io[1]);
  let one = bitcast<f32>(io[2]);
  let tiny = bitcast<f32>(io[3]);
  let half = bitcast<f32>(io[4]);
  io[5] = bitcast<u32>(sub + zero);
  io[6] = bitcast<u32>(sub * one);
  io[7] = bitcast<u32>(tiny * half);
  io[8] = select(0u, 1u, sub > zero);
}
"""
#: The probe's input words (2^-127, +0, 1, 2^-126, 1/2) and the results of a driver that
#: keeps subnormals: 2^-127 three times, and true.
_PROBE_IN = (0x00400000, 0, 0x3F800000, 0x00800000, 0x3F000000)
_PROBE_KEPT = (0x00400000, 0x00400000, 0x00400000, 1)


def flushes(results: tuple[int, ...]) -> bool:
    """Whether the probe's results (:data:`_PROBE`'s words 5 to 8) show a driver that
    flushes subnormals: any of them differs from IEEE's."""
    return tuple(results) != _PROBE_KEPT


def probe_subnormals(dev: Device) -> bool:
    """Run the probe shader on ``dev``: does its driver flush f32 subnormals to zero (in
    an addition, a multiplication, a product that underflows, a comparison)?"""
    wgpu = wgpu_module()
    try:
        data = np.zeros(16, np.uint32)
        data[: len(_PROBE_IN)] = _PROBE_IN
        buffer = dev.device.create_buffer_with_data(
            data=data.tobytes(), usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        module = dev.device.create_shader_module(code=_PROBE)
        pipeline = dev.device.create_compute_pipeline(
            layout="auto", compute={"module": module, "entry_point": "main"})
        group = dev.device.create_bind_group(
            layout=pipeline.get_bind_group_layout(0),
            entries=[{"binding": 0, "resource": {"buffer": buffer, "offset": 0,
                                                 "size": buffer.size}}])
        encoder = dev.device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(1, 1, 1)
        compute.end()
        dev.queue.submit([encoder.finish()])
        words = np.frombuffer(dev.queue.read_buffer(buffer), np.uint32)
    except Exception as err:
        raise DeviceError(f"{dev.kind}: the adapter {dev.summary} failed to run a probe "
                          f"shader ({err})") from err
    return flushes(tuple(int(w) for w in words[5:9]))
