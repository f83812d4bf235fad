"""Building a program for a backend, loading it through the program cache, and running it.

    artifact = hologram.build(program, backend="cpu", target="x86-64-v3")  # no device needed
    compiled = hologram.compile(program, backend="interp")               # build + load
    y = compiled(x)                       # inputs only: outputs are allocated and returned
    compiled(x, y)                        # every parameter: outputs are written in place

Lookup has two levels. The exact program object seen before (same structure, names
included) maps straight to its compiled form in a small in-process memo, so a hot call
skips the passes. Otherwise the program is canonicalized and the cache key is taken from
the canonical form; different spellings of one computation therefore share one cache
entry, in memory and on disk. Only on a cache miss do the remaining passes and the
backend compiler run.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from hologram import backends, config
from hologram.backends.base import check_arrays, check_supported
from hologram.compiler import pipeline
from hologram.compiler.cache import CacheKey, compiler_version, default_cache
from hologram.compiler.options import CompileOptions
from hologram.isa.ir import Buffer, Program
from hologram.runtime.pool import default_pool

POOL_THRESHOLD = 1 << 20  # bytes


class CompiledProgram:
    """A program compiled for one backend; call it with NumPy arrays."""

    def __init__(self, program: Program, backend: str, key: CacheKey, run):
        self.program = program  # as given (parameters define the calling convention)
        self.backend = backend
        self.key = key
        self.executable = run
        #: Run on device memory: one handle (a host address, on host backends) per
        #: parameter; the caller vouches for sizes and dtypes. The launch path of the SDK
        #: ops, hg.jit and the torch device.
        self.launch = run.launch
        params = program.params
        # What each argument must be, precomputed: calls are a hot path.
        self._specs = tuple((p.dtype.storage, p.size, p.kind != "in") for p in params)
        self._inputs = tuple(i for i, p in enumerate(params) if p.kind != "out")
        self._outputs = tuple(i for i, p in enumerate(params) if p.kind != "in")
        self._shapes = tuple((p.shape, p.dtype.storage) for p in params)
        # Large outputs come from the pool: reused blocks skip the page faults a fresh
        # allocation pays (~2.5x on big elementwise ops); small ones are cheaper from NumPy.
        self._large = tuple(p.nbytes >= POOL_THRESHOLD for p in params)

    @property
    def params(self) -> tuple[Buffer, ...]:
        return self.program.params

    def __call__(self, *arrays: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...] | None:
        if len(arrays) == len(self._inputs) != len(self._specs):
            full: list = [None] * len(self._specs)
            for i, array in zip(self._inputs, arrays):
                full[i] = array
            for i in self._outputs:
                if full[i] is None:
                    shape, dtype = self._shapes[i]
                    full[i] = (default_pool().empty(shape, dtype) if self._large[i]
                               else np.empty(shape, dtype))
            arrays = tuple(full)
        if len(arrays) != len(self._specs) or not all(
            type(a) is np.ndarray and a.dtype == dtype and a.size == size
            and a.flags.c_contiguous and (a.flags.writeable or not out)
            for a, (dtype, size, out) in zip(arrays, self._specs)
        ):
            # The slow path says exactly what is wrong (or accepts ndarray subclasses).
            check_arrays(self.program, arrays, f"{self.program.name} on {self.backend}")
        self.launch(tuple(_address(a) for a in arrays))
        outputs = tuple(arrays[i] for i in self._outputs)
        return outputs[0] if len(outputs) == 1 else outputs


def _address(array: np.ndarray) -> int:
    try:  # the buffer protocol is ~3x faster than array.ctypes.data
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError):  # read-only or empty
        return array.ctypes.data


_memo: OrderedDict[tuple, CompiledProgram] = OrderedDict()
_memo_lock = threading.Lock()


@dataclass(frozen=True)
class Artifact:
    """A program built for one backend and target (:func:`build`): the bytes a backend
    loads (object code, shader or kernel source/binary), and what it holds."""

    name: str  # the program's
    backend: str
    target: str  # the target's identity (CPU name and features, GPU architecture)
    key: CacheKey
    data: bytes = field(repr=False)

    @property
    def metadata(self) -> dict:
        """Kernels, launch plan and resources, as the backend describes them."""
        return backends.builder(self.backend).describe(self.data)


def build(program: Program, backend: str = "auto", target: str | None = None,
          options: CompileOptions | None = None) -> Artifact:
    """Build ``program`` for ``backend`` and its target called ``target`` (``None``: the
    one this process runs, e.g. ``HOLOGRAM_CPU_TARGET``'s) without loading it, through the
    disk cache. Needs no device: code for other machines (``backend="cpu",
    target="neoverse-v1"``) is built here and can be inspected or shipped."""
    options = options or CompileOptions.from_env()
    backend = backends.resolve(backend)
    impl = backends.builder(backend)
    key, make = _build_plan(program, backend, impl, target, options)
    return Artifact(program.name, backend, key.target, key, default_cache().artifact(key, make))


def _build_plan(program: Program, backend: str, impl: backends.Backend, target: str | None,
                options: CompileOptions):
    """The cache key of ``program`` built for ``target``, and the function that builds it."""
    check_supported(impl, program, (backends.builder(name) for name in backends.available()
                                    if name != backend))
    canonical = pipeline.canonical_form(program, options)
    key = CacheKey(canonical.fingerprint(), backend, impl.target(target), options.key(),
                   compiler_version())
    return key, lambda: impl.compile(pipeline.lower(canonical, options), target)


def compile(program: Program, backend: str = "auto",
            options: CompileOptions | None = None) -> CompiledProgram:
    """Build ``program`` for ``backend`` (``"auto"``: the best available) and the target
    this process runs, and load it (cached, see the module docstring)."""
    options = options or CompileOptions.from_env()
    backend = backends.resolve(backend)
    impl = backends.get(backend)
    memo_key = (program, backend, impl.target(), options)
    with _memo_lock:
        if memo_key in _memo:
            _memo.move_to_end(memo_key)
            return _memo[memo_key]
    key, make = _build_plan(program, backend, impl, None, options)
    run = default_cache().get(key, build=make, load=impl.load)
    compiled = CompiledProgram(program, backend, key, run)
    with _memo_lock:
        _memo[memo_key] = compiled
        while len(_memo) > config.get().cache_size:
            _memo.popitem(last=False)
    return compiled


def clear_memo() -> None:
    with _memo_lock:
        _memo.clear()
