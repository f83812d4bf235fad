"""Backend selection for SDK users (``hologram.backend``).

    hg.backend.list_available_backends()      # ['cpu', 'interp'] on a machine without GPUs
    hg.backend.get_default_backend()          # what Executor(backend="auto") picks
    hg.Executor(hg.backend.BackendType.CPU)

The names a user may ask for are :class:`BackendType`'s values, declared once in the
registry (:mod:`hologram.backends`). A name is *known* when it is one of them and
*available* when its backend can run on this machine: ``webgpu`` where wgpu finds an
adapter (Mesa's lavapipe included), ``metal`` and ``vulkan`` only on a GPU adapter of that
kind, ``cuda`` on an NVIDIA GPU (8.x or 9.0) or emulated (``HOLOGRAM_CUDA_EMULATE=1``:
its Triton kernels in Triton's interpreter on the CPU; docs/cuda.md).
"""

from __future__ import annotations

from enum import Enum

from hologram import backends
from hologram.backends import validate_backend


class _BackendName(str, Enum):
    def __str__(self) -> str:
        return self.value


#: The names a user may ask for, as an enum (``BackendType.CPU == "cpu"``), derived from
#: the registry (:data:`hologram.backends.KNOWN`): AUTO, CUDA, CPU, INTERP, WEBGPU, METAL, VULKAN.
BackendType = _BackendName("BackendType", [(name.upper(), name) for name in backends.KNOWN],
                           module=__name__)


def _available(name: str) -> bool:
    return name in backends.BUILTIN and backends.backend_class(name).is_available()


def is_cuda_available() -> bool:
    """Is there an NVIDIA GPU ``Executor("cuda")`` runs on: the driver loads, a device of
    compute capability 8.x or 9.0 is found, ``cuda-bindings`` and Triton are installed (a
    path not yet run on hardware, docs/cuda.md)? Never true for the emulation
    (``HOLOGRAM_CUDA_EMULATE=1``, Triton's interpreter on the CPU), with which
    ``Executor("cuda")`` runs all the same: ``"cuda" in list_available_backends()`` says
    that."""
    return "cuda" in backends.BUILTIN and backends.backend_class("cuda").auto_available()


def is_metal_available() -> bool:
    """Can ``Executor("metal")`` run here?"""
    return _available("metal")


def list_available_backends() -> list[str]:
    """Backends that can run on this machine, best first (the order ``"auto"`` tries)."""
    return backends.available()


def get_default_backend() -> str:
    """The backend ``"auto"`` selects: ``HOLOGRAM_BACKEND`` if set, else the best available."""
    return validate_backend("auto")


__all__ = [
    "BackendType", "get_default_backend", "is_cuda_available", "is_metal_available",
    "list_available_backends", "validate_backend",
]
