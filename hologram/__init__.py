"""Hologram: a tensor compiler and runtime.

The SDK: :class:`Executor` (a backend and a memory pool), :class:`Buffer`,
:mod:`hologram.ops`, :func:`jit` (trace and fuse), :mod:`hologram.backend` (selection);
they live in :mod:`hologram.sdk` and :mod:`hologram.runtime`, and are exported here.

Programs in the Atlas ISA (:mod:`hologram.isa`), usually built with the tensor front end
(:mod:`hologram.frontend`), are canonicalized, fused and scheduled by
:mod:`hologram.compiler`, compiled by a backend (:mod:`hologram.backends`), cached in
memory and on disk (:mod:`hologram.compiler.cache`) and run by :mod:`hologram.runtime`.

Modules inside the package never import this one: it only gathers the public names.
"""

try:  # first, so that a missing build says what to do rather than where it was needed
    from hologram import _native  # noqa: F401
except ImportError as exc:
    raise ImportError(
        "hologram's native extension (hologram._native, built from hologram/csrc/*.c) "
        "is missing or was built for another Python; install the package: `pip install "
        "hologram-tensor` (a wheel carries it built), or `pip install -e .` in a checkout "
        "(`make venv` does), which compiles it with a C compiler and Python's headers "
        f"({exc})") from exc

from hologram import config, errors, isa
from hologram.about import collect as info
from hologram.compiler.cache import default_cache
from hologram.compiler.options import CompileOptions
from hologram.errors import (
    CacheError,
    CompileError,
    DeviceError,
    DTypeError,
    HologramError,
    IndexOutOfRangeError,
    InvalidBufferError,
    IRError,
    OutOfMemoryError,
    ShapeError,
)
from hologram.runtime.buffer import Buffer
from hologram.runtime.executor import Executor, default_executor, from_dlpack
from hologram.runtime.launch import Artifact, CompiledProgram, build, clear_memo, compile
from hologram.sdk import backend, ops
from hologram.sdk.jit import jit
from hologram.version import __version__


def set_num_threads(n: int | None) -> None:
    """Threads the CPU backend runs kernels on (the calling thread included); ``None``
    returns to ``HOLOGRAM_NUM_THREADS``, else every core available to this process."""
    from hologram.backends.cpu import threads  # lazy: loads LLVM, which `import hologram` avoids

    threads.set_num_threads(n)


def get_num_threads() -> int:
    """The number of threads the CPU backend currently uses."""
    from hologram.backends.cpu import threads  # lazy: loads LLVM, which `import hologram` avoids

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
    "Artifact", "Buffer", "CacheError", "CompileError", "CompileOptions", "CompiledProgram",
    "DTypeError", "DeviceError", "Executor", "HologramError", "IRError", "IndexOutOfRangeError",
    "InvalidBufferError", "OutOfMemoryError", "ShapeError", "__version__", "backend", "build",
    "cache_info", "clear_cache", "compile", "config", "default_executor", "errors",
    "from_dlpack", "get_num_threads", "info", "isa", "jit", "ops", "set_num_threads",
]
