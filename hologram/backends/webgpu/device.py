"""The WebGPU device: one adapter and one logical device per process and adapter kind.

``wgpu`` (wgpu-native underneath) is imported only here and only when a device is first
asked for, so ``import hologram`` never loads it. Which adapter a backend name means:

- ``webgpu``: wgpu's own choice for ``power_preference="high-performance"`` (on a machine
  without a GPU but with Mesa's lavapipe, the CPU Vulkan driver);
- ``metal`` / ``vulkan``: the first adapter whose backend is Metal / Vulkan.

:func:`is_hardware` tells whether an adapter is a real GPU: CPU-emulated adapters
(lavapipe and llvmpipe, SwiftShader) report ``adapter_type == "CPU"``; ``"auto"`` never
picks them.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from hologram.errors import DeviceError

#: Backend name -> the wgpu backend type its adapter must have (None: any).
BACKEND_TYPES = {"webgpu": None, "metal": "Metal", "vulkan": "Vulkan"}

_INSTALL = ("install a Vulkan driver (Debian/Ubuntu: apt-get install mesa-vulkan-drivers "
            "libvulkan1, a CPU driver; or your GPU's driver) and the wgpu package "
            "(pip install wgpu)")


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
        _devices[kind] = opened
        return opened
