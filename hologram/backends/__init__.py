"""The registry of backends. A backend is imported only when first asked for, so
``import hologram`` does not load LLVM, CUDA or WebGPU libraries."""

from __future__ import annotations

import importlib
import threading

from hologram import config
from hologram.backends.base import Backend, Executable
from hologram.errors import DeviceError

# name -> "module:Class", in order of preference for "auto".
BUILTIN: dict[str, str] = {
    "cpu": "hologram.backends.cpu.backend:CpuBackend",
    "interp": "hologram.backends.interp.backend:InterpBackend",
}

_instances: dict[str, Backend] = {}
_lock = threading.Lock()


def backend_class(name: str) -> type[Backend]:
    if name not in BUILTIN:
        raise DeviceError(f"unknown backend {name!r}; known backends: {', '.join(BUILTIN)}")
    module, _, cls = BUILTIN[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def available() -> list[str]:
    """Names of the backends that can run here."""
    return [name for name in BUILTIN if backend_class(name).is_available()]


def resolve(name: str) -> str:
    """A backend name, with ``"auto"`` (and ``HOLOGRAM_BACKEND``'s default) resolved to the
    first available backend in order of preference."""
    if name == "auto":
        configured = config.get().backend
        if configured != "auto":
            return configured
        return available()[0]
    return name


def get(name: str) -> Backend:
    """The shared instance of backend ``name`` (``"auto"`` allowed); :class:`DeviceError`
    if it cannot run here."""
    name = resolve(name)
    with _lock:
        if name not in _instances:
            cls = backend_class(name)
            if not cls.is_available():
                raise DeviceError(f"backend {name!r} is not available on this machine; "
                                  f"available backends: {', '.join(available())}")
            _instances[name] = cls()
        return _instances[name]


__all__ = ["BUILTIN", "Backend", "Executable", "available", "backend_class", "get", "resolve"]
