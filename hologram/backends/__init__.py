"""The registry of backends: the one place backend names are declared. A backend is
imported only when first asked for, so ``import hologram`` does not load LLVM, CUDA or
WebGPU libraries.

:data:`BUILTIN` maps each implemented backend to its class, in order of preference for
``"auto"``; :data:`PLANNED` lists names reserved for backends not written yet (asking for
one says "not implemented", not "unknown"). The SDK's :class:`~hologram.sdk.backend.BackendType`
is derived from both.

Backends outside this package join with :func:`register` (and leave with
:func:`unregister`), or, for an installed package, by declaring an entry point in the
group :data:`ENTRY_POINT_GROUP` (``name = "module:Class"``), loaded the first time the
registry is asked for its names. They then work everywhere a name is taken
(``hg.Executor("name")``, ``hologram.compile(p, "name")``), after the built-in ones in
the order ``"auto"`` tries.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
import warnings

from hologram import config
from hologram.backends.base import Backend, Executable
from hologram.errors import DeviceError

#: name -> "module:Class", in order of preference for "auto" (each class's
#: ``auto_available`` decides whether "auto" may take it here).
BUILTIN: dict[str, str] = {
    # First: "auto" takes it on a real NVIDIA GPU only, never emulated (docs/cuda.md).
    "cuda": "hologram.backends.cuda.backend:CudaBackend",
    # Then a GPU adapter through wgpu, never a CPU-emulated one (docs/webgpu.md, "Names").
    "webgpu": "hologram.backends.webgpu.backend:WebGpuBackend",
    "metal": "hologram.backends.webgpu.backend:MetalBackend",
    "vulkan": "hologram.backends.webgpu.backend:VulkanBackend",
    "cpu": "hologram.backends.cpu.backend:CpuBackend",
    "c": "hologram.backends.c.backend:CBackend",
    "interp": "hologram.backends.interp.backend:InterpBackend",
}
#: Names reserved for backends that are not implemented yet.
PLANNED: tuple[str, ...] = ()
#: Every name a user may ask for: "auto", the implemented backends, the planned ones.
KNOWN: tuple[str, ...] = ("auto", *BUILTIN, *PLANNED)

_instances: dict[str, Backend] = {}
# Reentrant: get() holds it while backend_class() loads the plug-ins, which takes it too.
_lock = threading.RLock()
#: Installed packages declare backends as entry points of this group.
ENTRY_POINT_GROUP = "hologram.backends"

#: Backends added with register() or by entry points: name -> class (an entry point until
#: first used), in registration order.
_registered: dict[str, type[Backend] | importlib.metadata.EntryPoint] = {}
_plugins_loaded = False


def _load_plugins() -> None:
    """Register the installed packages' backends, once. An entry point whose name is
    taken is skipped with a warning (a plug-in cannot replace a built-in backend)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    with _lock:
        _plugins_loaded = True
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if entry.name in KNOWN or entry.name in _registered:
                warnings.warn(f"backend entry point {entry.name!r} ({entry.value}) ignored: "
                              "the name is taken", stacklevel=3)
                continue
            _registered[entry.name] = entry


def register(name: str, cls: type[Backend]) -> None:
    """Add backend ``cls`` (a :class:`Backend` subclass) under ``name`` (lower case, not
    a built-in or planned name, nor one registered already). Its programs are cached on
    disk under its name and target, like a built-in backend's."""
    _load_plugins()
    if not (isinstance(name, str) and name.isidentifier() and name == name.lower()):
        raise DeviceError(f"register: backend name must be a lower-case identifier, got "
                          f"{name!r}")
    if name in KNOWN or name in _registered:
        raise DeviceError(f"register: backend name {name!r} is taken; choose another (or "
                          "unregister the one registered)")
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise DeviceError(f"register: {cls!r} is not a hologram.backends.base.Backend "
                          "subclass")
    with _lock:
        _registered[name] = cls


def unregister(name: str) -> None:
    """Remove a backend added with :func:`register` (built-in backends stay)."""
    if name not in _registered:
        raise DeviceError(f"unregister: no backend {name!r} was registered; registered: "
                          f"{', '.join(_registered) or 'none'}")
    with _lock:
        del _registered[name]
        _instances.pop(name, None)


def names() -> list[str]:
    """Every implemented backend's name: the built-in ones, then the registered ones."""
    _load_plugins()
    return [*BUILTIN, *_registered]


def backend_class(name: str) -> type[Backend]:
    _load_plugins()
    cls = _registered.get(name)
    if isinstance(cls, importlib.metadata.EntryPoint):
        loaded = cls.load()
        if not (isinstance(loaded, type) and issubclass(loaded, Backend)):
            raise DeviceError(f"backend entry point {name!r} ({cls.value}) is not a "
                              "hologram.backends.base.Backend subclass")
        with _lock:
            _registered[name] = cls = loaded
    if cls is not None:
        return cls
    if name not in BUILTIN:
        raise DeviceError(f"unknown backend {name!r}; known backends: {', '.join(names())}")
    module, _, cls = BUILTIN[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def builder(name: str) -> Backend:
    """The shared instance of backend ``name`` for building only (:func:`hologram.build`):
    building needs the backend's compiler, not its device."""
    with _lock:
        if name not in _instances:
            _instances[name] = backend_class(name)()
        return _instances[name]


def available() -> list[str]:
    """Names of the backends that can run here."""
    return [name for name in names() if backend_class(name).is_available()]


def resolve(name: str) -> str:
    """A backend name, with ``"auto"`` (and ``HOLOGRAM_BACKEND``'s default) resolved to the
    first available backend in order of preference."""
    if name == "auto":
        configured = config.get().backend
        if configured != "auto":
            return configured
        # The first that "auto" may take here: later ones are not even asked.
        return next(n for n in names() if backend_class(n).auto_available())
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


def validate_backend(name: str) -> str:
    """The canonical name of backend ``name`` (case-insensitive; ``"auto"`` resolved; an
    enum member of :class:`~hologram.sdk.backend.BackendType` is its value).

    Raises :class:`~hologram.errors.DeviceError` naming the available backends when
    ``name`` is unknown or cannot run on this machine.
    """
    if not isinstance(name, str):
        raise DeviceError(f"backend must be a string or BackendType, got {type(name).__name__}; "
                          f"pass one of {', '.join(available())} or 'auto'")
    canonical = str.strip(getattr(name, "value", name)).lower()
    known = (*KNOWN, *names()[len(BUILTIN):])
    # available() probes every backend (GPU adapters and drivers included): only the
    # error messages list them.
    if canonical not in known:
        raise DeviceError(f"unknown backend {name!r}; known backends: {', '.join(known)}; "
                          f"available here: {', '.join(available())} (pass one of those, "
                          "or 'auto' to pick the best)")
    if canonical == "auto":
        canonical = resolve("auto")
        if canonical not in known:
            raise DeviceError(f"HOLOGRAM_BACKEND={canonical!r} is not a known backend; known "
                              f"backends: {', '.join(known)}; available here: "
                              f"{', '.join(available())} (set it to one of those, or unset "
                              "it)")
    if canonical in PLANNED or not backend_class(canonical).is_available():
        why = "is not implemented yet" if canonical in PLANNED else "cannot run on this machine"
        # A backend may say why and what to install (unavailable_reason, optional).
        reason = None if canonical in PLANNED else getattr(backend_class(canonical),
                                                           "unavailable_reason", None)
        if reason is not None:
            why += f" ({reason()})"
        raise DeviceError(f"backend {canonical!r} {why}; available backends: "
                          f"{', '.join(available())} (use backend='auto' to pick the best)")
    return canonical


__all__ = [
    "BUILTIN", "ENTRY_POINT_GROUP", "KNOWN", "PLANNED", "Backend", "Executable", "available",
    "backend_class", "builder", "get", "names", "register", "resolve", "unregister",
    "validate_backend",
]
