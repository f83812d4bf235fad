"""Backend selection for SDK users (the seeds' ``hologram.backend`` module).

    hg.backend.list_available_backends()      # ['cpu', 'interp'] on a machine without GPUs
    hg.backend.get_default_backend()          # what Executor(backend="auto") picks
    hg.Executor(hg.backend.BackendType.CPU)

The names a user may ask for are :class:`BackendType`'s values. A name is *known* when it
is one of them and *available* when its backend is implemented and can run on this machine
(:mod:`hologram.backends` holds the implementations). ``cuda``, ``metal`` and ``webgpu``
are known names whose backends are not implemented yet, so they report unavailable on
every machine, GPU or not.
"""

from __future__ import annotations

from enum import Enum

from hologram import backends
from hologram.errors import DeviceError


class BackendType(str, Enum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"
    METAL = "metal"
    WEBGPU = "webgpu"
    INTERP = "interp"

    def __str__(self) -> str:
        return self.value


_KNOWN = tuple(t.value for t in BackendType)


def _available(name: str) -> bool:
    return name in backends.BUILTIN and backends.backend_class(name).is_available()


def is_cuda_available() -> bool:
    """Can ``Executor("cuda")`` run here?"""
    return _available("cuda")


def is_metal_available() -> bool:
    """Can ``Executor("metal")`` run here?"""
    return _available("metal")


def list_available_backends() -> list[str]:
    """Backends that can run on this machine, best first (the order ``"auto"`` tries)."""
    return backends.available()


def get_default_backend() -> str:
    """The backend ``"auto"`` selects: ``HOLOGRAM_BACKEND`` if set, else the best available."""
    return validate_backend("auto")


def validate_backend(name: str | BackendType) -> str:
    """The canonical name of backend ``name`` (case-insensitive; ``"auto"`` resolved).

    Raises :class:`~hologram.errors.DeviceError` naming the available backends when
    ``name`` is unknown or cannot run on this machine.
    """
    if not isinstance(name, str):
        raise DeviceError(f"backend must be a string or BackendType, got {type(name).__name__}; "
                          f"pass one of {', '.join(list_available_backends())} or 'auto'")
    canonical = (name.value if isinstance(name, BackendType) else name).strip().lower()
    available = list_available_backends()
    if canonical not in _KNOWN:
        raise DeviceError(f"unknown backend {name!r}; known backends: {', '.join(_KNOWN)}; "
                          f"available here: {', '.join(available)} (pass one of those, or "
                          "'auto' to pick the best)")
    if canonical == "auto":
        canonical = backends.resolve("auto")
        if canonical not in _KNOWN:
            raise DeviceError(f"HOLOGRAM_BACKEND={canonical!r} is not a known backend; known "
                              f"backends: {', '.join(_KNOWN)}; available here: "
                              f"{', '.join(available)} (set it to one of those, or unset it)")
    if canonical not in available:
        why = ("is not implemented yet" if canonical not in backends.BUILTIN
               else "cannot run on this machine")
        raise DeviceError(f"backend {canonical!r} {why}; available backends: "
                          f"{', '.join(available)} (use backend='auto' to pick the best)")
    return canonical


__all__ = [
    "BackendType", "get_default_backend", "is_cuda_available", "is_metal_available",
    "list_available_backends", "validate_backend",
]
