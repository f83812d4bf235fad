"""Hologram: a tensor compiler and runtime.

The SDK: :class:`Executor` (a backend and a memory pool), :class:`Buffer`,
:mod:`hologram.ops`, :func:`jit` (trace and fuse), :mod:`hologram.backend` (selection).

Programs in the Atlas ISA (:mod:`hologram.isa`) are canonicalized, fused and scheduled by
:mod:`hologram.compiler`, then compiled by a backend (:mod:`hologram.backends`) and cached
in memory and on disk (:mod:`hologram.cache`).
"""

__version__ = "0.1.0"

from hologram import backend, config, errors, isa, ops  # config first: hologram.cache imports it
from hologram.buffer import Buffer
from hologram.cache import default_cache
from hologram.compiler import CompiledProgram, CompileOptions, compile
from hologram.compiler.driver import clear_memo
from hologram.errors import (
    CacheError,
    CompileError,
    DeviceError,
    DTypeError,
    HologramError,
    InvalidBufferError,
    IRError,
    OutOfMemoryError,
    ShapeError,
)
from hologram.executor import Executor, default_executor, from_dlpack
from hologram.jit import jit


def set_num_threads(n: int | None) -> None:
    """Threads the CPU backend runs kernels on (the calling thread included); ``None``
    returns to ``HOLOGRAM_NUM_THREADS``, else every core available to this process."""
    from hologram.backends.cpu import threads

    threads.set_num_threads(n)


def get_num_threads() -> int:
    """The number of threads the CPU backend currently uses."""
    from hologram.backends.cpu import threads

    return threads.num_threads()


def cache_info() -> dict:
    """Program cache statistics: hits, disk_hits, misses, corrupt, entries, disk_entries,
    disk_bytes, directory, last_disk_error."""
    return default_cache().info()


def clear_cache(disk: bool = True) -> None:
    """Forget every compiled program (and delete the on-disk entries unless disk=False)."""
    clear_memo()
    default_cache().clear(disk=disk)


__all__ = [
    "Buffer", "CacheError", "CompileError", "CompileOptions", "CompiledProgram", "DTypeError",
    "DeviceError", "Executor", "HologramError", "IRError", "InvalidBufferError",
    "OutOfMemoryError", "ShapeError", "__version__", "backend", "cache_info", "clear_cache",
    "compile", "config", "default_executor", "errors", "from_dlpack", "get_num_threads", "isa",
    "jit", "ops", "set_num_threads",
]
