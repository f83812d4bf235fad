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

Launching again: :class:`LaunchCache` is the one cache from a call's signature to a ready
launch (compiled program and whatever the caller precomputed to launch it: output
layouts, the handle order). The SDK's ops, ``hg.jit`` and the torch device's kernels all
keep their launches in the process's instance, :func:`launch_cache`; it is bounded and
evicts the least recently used entries (two generations, see the class).
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hologram import backends, config
from hologram._native import ArrayCall, Launcher
from hologram.backends.base import check_arrays, check_supported
from hologram.backends.hostmem import address, default_pool
from hologram.compiler import generic, pipeline
from hologram.compiler.cache import CacheKey, compiler_version, default_cache
from hologram.compiler.options import CompileOptions
from hologram.isa.ir import BufferDecl, Program
from hologram.isa.verify import verify

POOL_THRESHOLD = 1 << 20  # bytes
_KINDS = {"in": 0, "out": 1, "inout": 2}  # (ArrayCall's parameter kinds)


class CompiledProgram:
    """A program compiled for one backend; call it with NumPy arrays. On backends whose
    memory is host memory (cpu, interp) calls run on the arrays in place; on others
    (webgpu) each call copies the inputs to device memory, runs there and copies the
    outputs back (convenient, not fast: keep data on the device with an executor's
    buffers, which :meth:`launch` takes the handles of)."""

    def __init__(self, program: Program, backend: str, key: CacheKey, run):
        self.program = program  # as given (parameters define the calling convention)
        self.backend = backend
        self.key = key  # of the artifact it runs (an elementwise program: its template)
        self.executable = run
        #: Run on device memory: one handle (a host address, on host backends) per
        #: parameter; the caller vouches for sizes and dtypes. The launch path of the SDK
        #: ops, hg.jit and the torch device.
        # A native Launcher: without Python when the executable's native_plan() says the
        # launch is direct kernel calls, else through run.launch.
        self.launch = Launcher(run)
        params = program.params
        self._count = len(params)
        self._given_index = tuple(i for i, p in enumerate(params) if p.kind != "out")
        self._outputs = tuple(i for i, p in enumerate(params) if p.kind != "in")
        # Fresh outputs: large ones from the pool (reused blocks skip the page faults a
        # fresh allocation pays, ~2.5x on big elementwise ops), small ones from NumPy.
        self._fresh = tuple(
            (i, functools.partial(default_pool().empty if p.nbytes >= POOL_THRESHOLD
                                  else np.empty, p.shape, p.dtype.storage))
            for i, p in enumerate(params) if p.kind == "out")
        # On host memory, calls that pass the checks (exact ndarrays of the parameters'
        # dtypes and sizes, C order, outputs writable) launch natively on the arrays.
        self._native_call = None
        if backends.get(backend).allocator().host_visible:
            makers = dict(self._fresh)
            self._native_call = ArrayCall(self.launch, np.ndarray, tuple(
                (memoryview(np.empty(0, p.dtype.storage)).format.encode(), p.nbytes,
                 _KINDS[p.kind], makers.get(i)) for i, p in enumerate(params)))
        self._device_memory = None  # the allocator of calls on device memory (made once)

    @property
    def params(self) -> tuple[BufferDecl, ...]:
        return self.program.params

    def __call__(self, *arrays: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...] | None:
        # Every argument is checked (type, dtype, size, C order, writable outputs) on every
        # call, natively (ArrayCall): cheaper than any key that could remember them. Fresh
        # outputs are made to specification and need none.
        if self._native_call is not None:
            result = self._native_call(*arrays)
            if result is not NotImplemented:
                return result
        fresh = len(arrays) == len(self._given_index) != self._count
        if fresh:
            arrays = self._with_fresh_outputs(arrays)
        if self._native_call is None:
            return self._call_on_device(arrays)
        # The general path says exactly what is wrong (or accepts ndarray subclasses).
        check_arrays(self.program, arrays, f"{self.program.name} on {self.backend}")
        self.launch(tuple(address(a) for a in arrays))
        return self._results(arrays)

    def _with_fresh_outputs(self, given: tuple) -> tuple:
        """Every parameter's array: the given ones, and new ones for the outputs."""
        full: list = [None] * self._count
        for i, a in zip(self._given_index, given):
            full[i] = a
        for i, make in self._fresh:
            full[i] = make()
        return tuple(full)

    def _results(self, arrays):
        if len(self._outputs) == 1:
            return arrays[self._outputs[0]]
        return tuple(arrays[i] for i in self._outputs)

    def _call_on_device(self, arrays: tuple):
        """A call on NumPy arrays (every parameter's) for a backend whose memory the host
        cannot see: every input copied into a device allocation, the launch, the outputs
        (out and inout) copied back into the arrays. The allocations are released when the
        call returns."""
        views = check_arrays(self.program, arrays, f"{self.program.name} on {self.backend}")
        memory = self._device_memory
        if memory is None:
            memory = self._device_memory = backends.get(self.backend).allocator()
        allocations = []
        for param, view in zip(self.program.params, views):
            allocation = memory.alloc(param.shape, param.dtype.storage)
            if param.kind != "out" and view.size:
                memory.copy_in(allocation, view)
            allocations.append(allocation)
        self.launch(tuple(memory.handle(a) for a in allocations))
        for i in self._outputs:
            if views[i].size:
                memory.copy_out(allocations[i], views[i])
        return self._results(arrays)


#: How many launches :func:`launch_cache` keeps (see :class:`LaunchCache`).
LAUNCH_CACHE_ENTRIES = 16384


class LaunchCache:
    """The one cache from a call's signature to a ready launch.

    A *key* is any hashable tuple a caller forms from what decides its launch: whose call
    it is (an SDK op, an ``hg.jit`` function, a torch kernel's name), the backend, the
    executor's token when the launch was validated for one executor's buffers, the
    operands' signature (shapes, dtypes, strides where they matter) and static arguments.
    The entry is whatever the caller needs to launch at once: the compiled program's
    ``launch`` and the precomputed output layouts and handle order. Keys of different
    callers never compare equal (each starts with its own kind of owner), so they share
    one instance, one bound and one eviction policy.

    Bounded, evicting the least recently used entries, approximated by two generations
    so that a hit costs one dictionary read (hot launches cost well under a microsecond
    in all): new and used entries go to the *young* generation; when it holds half of
    ``max_entries``, it becomes the *old* generation and the previous old one is evicted,
    except the entries used in between (a :meth:`get` of an old entry moves it back to
    the young one). So an entry used within the last ``max_entries / 2`` insertions is
    never evicted, one unused for ``max_entries`` insertions always is, and the cache
    never holds more than ``max_entries``: a long-running process that sees many shapes
    keeps the launches it still uses. Eviction only costs a lookup in the program cache
    later (compiled programs stay there).

    :attr:`recent` is the young generation's ``dict.get``: the hot paths' lookup. It may
    miss an entry of the old generation, so a miss there must fall back to :meth:`get`
    (the SDK's validated launches fall back to the general path, which files them again).

    Thread-safe: lookups are lock-free dictionary reads; insertion, promotion and
    eviction take a lock. An entry evicted by another thread after a lookup stays valid.
    """

    def __init__(self, max_entries: int = LAUNCH_CACHE_ENTRIES):
        if max_entries < 2:
            raise ValueError(f"LaunchCache: max_entries must be >= 2, got {max_entries}")
        self._young: dict[Hashable, Any] = {}  # never replaced: ``recent`` is bound to it
        self._old: dict[Hashable, Any] = {}
        self._lock = threading.Lock()
        self.max_entries = max_entries
        self.misses = 0  # entries filed by put()
        self.evictions = 0
        #: The entry under a key used recently, or None (see the class docstring).
        self.recent: Callable[[Hashable], Any] = self._young.get

    def get(self, key: Hashable) -> Any:
        """The entry under ``key`` (now recently used), or None."""
        entry = self._young.get(key)
        if entry is None and self._old:
            with self._lock:
                entry = self._old.pop(key, None)
                if entry is not None:
                    self._file_locked(key, entry)
        return entry

    def put(self, key: Hashable, entry: Any) -> Any:
        """File ``entry`` (not None) under ``key`` as recently used, evicting what the
        bound requires; returns ``entry``."""
        with self._lock:
            self._old.pop(key, None)
            self._file_locked(key, entry)
            self.misses += 1
        return entry

    def get_or_make(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The entry under ``key``, made by ``make()`` and filed on a miss."""
        entry = self.get(key)
        return entry if entry is not None else self.put(key, make())

    def _file_locked(self, key: Hashable, entry: Any) -> None:
        young = self._young
        young[key] = entry
        if len(young) >= self.max_entries // 2:  # a new generation
            self.evictions += len(self._old)
            self._old = dict(young)
            young.clear()
        while len(self._old) + len(young) > self.max_entries:  # after a smaller bound
            del self._old[next(iter(self._old))]
            self.evictions += 1

    def set_max_entries(self, max_entries: int) -> None:
        """Change the bound (evicting, oldest first, what no longer fits)."""
        if max_entries < 2:
            raise ValueError(f"LaunchCache: max_entries must be >= 2, got {max_entries}")
        with self._lock:
            self.max_entries = max_entries
            old = self._old
            while old and len(old) + len(self._young) > max_entries:
                del old[next(iter(old))]
                self.evictions += 1
            if len(self._young) >= max_entries // 2:
                self.evictions += len(old)
                self._old = dict(self._young)
                self._young.clear()
                while len(self._old) > max_entries:
                    del self._old[next(iter(self._old))]
                    self.evictions += 1

    def discard(self, where: Callable[[Hashable], bool]) -> int:
        """Remove every entry whose key satisfies ``where``; returns how many."""
        with self._lock:
            doomed = 0
            for generation in (self._old, self._young):
                for k in [k for k in generation if where(k)]:
                    del generation[k]
                    doomed += 1
        return doomed

    def clear(self) -> None:
        with self._lock:
            self._old = {}
            self._young.clear()

    def items(self) -> list[tuple[Hashable, Any]]:
        """A snapshot of ``(key, entry)`` pairs, the old generation first."""
        with self._lock:
            return [*self._old.items(), *self._young.items()]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._young or key in self._old

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def info(self) -> dict[str, int]:
        """``entries``, ``max_entries``, ``misses`` (entries filed), ``evictions``."""
        return {"entries": len(self), "max_entries": self.max_entries,
                "misses": self.misses, "evictions": self.evictions}

    def __repr__(self) -> str:
        return f"<hologram LaunchCache {len(self)}/{self.max_entries} entries>"


_LAUNCHES = LaunchCache()


def launch_cache() -> LaunchCache:
    """The process's launch cache (the SDK's ops, ``hg.jit`` and the torch device)."""
    return _LAUNCHES


_memo: OrderedDict[tuple, CompiledProgram] = OrderedDict()
#: Elementwise programs' templates -> their cache key and lowering (``_resized``).
_templates: OrderedDict[tuple, tuple] = OrderedDict()
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
    key, lowered = _build_plan(program, backend, impl, target, options)
    data = default_cache().artifact(key, lambda: impl.compile(lowered(), target))
    return Artifact(program.name, backend, key.target, key, data)


def prebuild(program: Program, backend: str, options: CompileOptions | None = None) -> bool:
    """Write the full build that :func:`compile` would load for ``program`` into the disk
    cache, without loading it: the work of the helper process
    (:mod:`hologram.runtime.compile_process`), after which :func:`compile` finds it there
    (and, as a full build, never promotes it). An elementwise program is built as its
    template, as :func:`compile` does. True when the build is on disk."""
    options = options or CompileOptions.from_env()
    impl = backends.builder(backend)
    verify(program)
    shape = generic.elementwise_shape(program) if impl.generic_lengths else None
    if shape is not None:
        program = generic.resize(program, shape, generic.TEMPLATE_LENGTH)
    key, lowered = _build_plan(program, backend, impl, None, options)
    return default_cache().prepare(key, lambda: impl.compile(lowered()))


def _build_plan(program: Program, backend: str, impl: backends.Backend, target: str | None,
                options: CompileOptions):
    """The cache key of ``program`` built for ``target``, and the function that lowers it
    for the backend's compiler (once)."""
    check_supported(impl, program, _others(backend))
    canonical = pipeline.canonical_form(program, options)
    key = CacheKey(canonical.fingerprint(), backend, impl.target(target), options.key(),
                   compiler_version(backend))
    return key, functools.cache(lambda: pipeline.lower(canonical, options))


def _others(backend: str):
    """The other backends that can run here, looked for only when iterated: finding them
    starts their devices (webgpu's adapter: most of a second), which a supported program
    never needs."""
    for name in backends.available():
        if name != backend:
            yield backends.builder(name)


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
    resized = _resized(program, backend, impl, options) if impl.generic_lengths else None
    if resized is None:
        key, lowered = _build_plan(program, backend, impl, None, options)
        resized = key, _load(key, impl, lowered)
    key, run = resized
    compiled = CompiledProgram(program, backend, key, run)
    with _memo_lock:
        _remember(_memo, memo_key, compiled)
    return compiled


def _remember(memo: OrderedDict, key: tuple, value: Any) -> None:
    """File ``value`` under ``key`` in one of the in-process memos (the caller holds
    ``_memo_lock``), dropping the least recently used past ``HOLOGRAM_CACHE_SIZE``."""
    memo[key] = value
    while len(memo) > config.get().cache_size:
        memo.popitem(last=False)


def _load(key: CacheKey, impl: backends.Backend, lowered: Callable[[], Program]):
    """The executable of ``key`` through the program cache, ``lowered()`` compiled on a
    miss."""
    # A backend with a quick compile (cpu: docs/compiler.md, "Tiers") serves a miss with it.
    quick = getattr(impl, "compile_quick", None) if config.get().quick_compile else None
    return default_cache().get(key, build=lambda: impl.compile(lowered()), load=impl.load,
                               quick=quick and (lambda: quick(lowered())))


def _resized(program: Program, backend: str, impl: backends.Backend,
             options: CompileOptions):
    """For an elementwise program (:mod:`hologram.compiler.generic`): the key of its
    template, compiled once for every length, and the template's executable run at the
    program's length; None for other programs, or where the backend's code for the
    template depends on the length. Templates seen before skip the passes."""
    verify(program)  # what canonicalizing would check first (once per program object)
    shape = generic.elementwise_shape(program)
    if shape is None:
        return None
    template = generic.resize(program, shape, generic.TEMPLATE_LENGTH)
    memo_key = (template, backend, impl.target(), options)
    with _memo_lock:
        plan = _templates.get(memo_key)
        if plan is not None:
            _templates.move_to_end(memo_key)
    if plan is None:
        plan = _build_plan(template, backend, impl, None, options)
        with _memo_lock:
            _remember(_templates, memo_key, plan)
    key, lowered = plan
    run = _load(key, impl, lowered).resized(math.prod(shape))
    return None if run is None else (key, run)


def clear_memo() -> None:
    with _memo_lock:
        _memo.clear()
        _templates.clear()
