"""The ``cpu`` backend: Atlas -> LLVM IR -> native code for this host, run on threads.

**Compile** (:meth:`CpuBackend.compile`): each kernel the renderer supports becomes one
function of a single LLVM module, optimized at O3 for the host CPU and emitted as an
object file. The artifact is a small JSON header (what the runtime needs to bind buffers
and launch kernels) followed by the object code; kernels the renderer cannot handle yet are
listed with the reason, and the header then also carries the program's text so they can
run on the reference interpreter.

**Tiers** (:meth:`CpuBackend.compile_quick`): the first compile of a program on the launch
path may use LLVM's quick tier (``llvm.TIERS``), which computes the same bits as the full
one for the modules it is used on. Its executable counts its calls and, after
``HOLOGRAM_PROMOTE_AFTER``, has the full build made on a background thread (one for the
process); the executable then runs the new code. The switch is one attribute store (the
list of steps): a call already running finishes on the old code, which stays loaded.

**Load** (:meth:`CpuBackend.load`): the object file is added to the process's JIT (no
re-parsing or re-verifying of the program unless an interpreted kernel needs it), and a
callable is returned. An elementwise program's code, which never states the length
of its one flat dimension, also runs at other lengths (:meth:`_Executable.resized`,
:mod:`hologram.compiler.generic`). A call binds one pointer per buffer (parameters,
and temporaries in one arena allocated per call) and runs the kernels in order; each
kernel's first grid dimension is split across the worker pool when there is enough work
per thread.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import hashlib
import json
import math
import os
import queue
import struct
import threading
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Callable

import numpy as np

from hologram import config
from hologram.backends.base import Allocator, Backend, Executable, host_arrays
from hologram.backends.cpu import gemm, llvm, threads
from hologram.backends.cpu import target as targets
from hologram.backends.cpu.render import render, split_parts, unsupported
from hologram.backends.hostmem import Pool
from hologram.codegen import loops
from hologram.codegen.mathlib import FUNCTIONS as MATH_FUNCTIONS
from hologram.compiler import pipeline
from hologram.compiler.capabilities import Capabilities
from hologram.compiler.passes import library_calls
from hologram.isa.ir import Program

#: One element's work in a math function (exp, log, tanh...: range reduction and a
#: polynomial), in adds: how the worker pool's grain weighs rows with loops.
MATH_WORK = 8
#: Arithmetic instructions (reductions included) that make one more unit of a looping
#: row's work per point: a layer norm's rows (13-23 of them) ran at 0.7-0.95 ns a point,
#: an add at 0.11-0.19.
ARITH_WORK = 4
_NOT_ARITHMETIC = frozenset(("load", "store", "const"))
_RAW_KERNEL = ctypes.CFUNCTYPE(None)  # the same function, called with ctypes objects only
_ZERO = ctypes.c_int64(0)
_HEADER = struct.Struct("<I")
_POINTER_ARRAYS = 256  # address sets remembered per loaded program
_ARENAS = Pool()  # programs' scratch memory, one block per call
_RESIZED = threading.Lock()  # an executable's resized ones against its promotion
_BYTE = np.dtype(np.uint8)
# Kernel symbols' prefix while rendering, replaced by one named after the IR (not hex: no
# real prefix or other name in the IR contains it).
_UNNAMED = "hg_unnamed_"


class CpuBackend(Backend):
    name = "cpu"
    generic_lengths = True

    @classmethod
    def is_available(cls) -> bool:
        try:
            targets.host()
        except Exception:
            return False
        return True

    def target(self, name: str | None = None) -> str:
        return _target(name).identity

    def capabilities(self, target: str | None = None) -> Capabilities:
        return _target(target).capabilities

    def allocator(self, memory_limit: int | None = None) -> Allocator:
        return Pool(memory_limit)

    def compile(self, program: Program, target: str | None = None, tier: str = "full") -> bytes:
        """The artifact of ``program`` for ``target`` (see the module docstring), its LLVM
        module compiled at ``tier`` (``llvm.TIERS``) where that gives the same bits as the
        full tier, else at the full tier; :func:`artifact_tier` says which."""
        _promoter.note_busy()
        with _gc_paused():
            return self._compile(program, target, tier)

    def _compile(self, program: Program, target: str | None, tier: str) -> bytes:
        target = _target(target)
        program = pipeline.for_target(program, target.capabilities)
        program, gemms = gemm.split(program)
        pipeline.dump(program.name, "library_calls", lambda: library_calls.dump(program, gemms))
        symbols, steps, fallback = {}, [], False
        for index, kernel in enumerate(program.kernels):
            steps += [{"gemm": g.to_json()} for g in gemms.get(index, ())]
            reason = unsupported(kernel)
            if reason is None:
                symbols[kernel.name] = _UNNAMED + kernel.name
            fallback |= reason is not None
            steps.append({
                "kernel": index,
                "symbol": symbols.get(kernel.name),
                "reason": reason,
                "rows": kernel.domain[0] if kernel.grid_rank else 1,
                "row_work": _row_work(kernel),
                "parallel": kernel.grid_rank > 0,
                "parts": split_parts(kernel) if reason is None else 0,
            })
        steps += [{"gemm": g.to_json()} for g in gemms.get(len(program.kernels), ())]
        header = {
            "length": _generic_length(program, gemms, fallback),
            "buffers": len(program.buffers),
            "params": [i for i, b in enumerate(program.buffers) if b.kind != "temp"],
            "temps": [[i, b.offset] for i, b in enumerate(program.buffers) if b.kind == "temp"],
            "arena": program.arena_bytes,
            "steps": steps,
            "program": str(program) if fallback else None,
            "tier": "full",
        }
        obj = b""
        if symbols:
            def dump(stage: str, text) -> None:
                pipeline.dump(program.name, stage, text)

            dump("loops", lambda: loops.dump(program, target.capabilities))
            # Symbols named after the IR, which does not name the program: programs that
            # render alike (an elementwise op on tensors of other shapes with as many
            # elements) make the same module, which llvm.compile_ir compiles once per
            # process.
            ir = render(program, symbols, target, name="kernels")
            prefix = f"hg_{hashlib.sha256(ir.encode()).hexdigest()[:16]}_"
            ir = ir.replace(_UNNAMED, prefix)
            for step in steps:
                if step.get("symbol"):
                    step["symbol"] = prefix + step["symbol"][len(_UNNAMED):]
            dump("cpu.ll", ir)
            if tier != "full" and llvm.same_bits_at_every_tier(ir):
                header["tier"] = tier
            # Without a dump directory no dump: the optimized IR would be printed for it.
            dumping = config.get().dump_dir is not None
            obj = llvm.compile_ir(ir, target, dump=dump if dumping else None,
                                  tier=header["tier"], cached=False)  # the artifact is cached
        data = json.dumps(header).encode()
        return _HEADER.pack(len(data)) + data + obj

    def compile_quick(self, program: Program, target: str | None = None) -> tuple[bytes, bool]:
        """(artifact, whether it is the full build): :meth:`compile` at the quick tier,
        whose executable is promoted when hot (:meth:`_Executable.promote_when_hot`)."""
        artifact = self.compile(program, target, tier="quick")
        return artifact, artifact_tier(artifact) == "full"

    def load(self, artifact: bytes) -> Executable:
        _promoter.note_busy()
        header, obj = _split(artifact)
        names = []
        for step in header["steps"]:
            if step.get("symbol"):
                names.append(step["symbol"])
                if step.get("parts"):
                    names.append(step["symbol"] + "_final")
        addresses = llvm.load_object(obj, names) if names else {}
        return _Executable(header, addresses)

    def describe(self, artifact: bytes) -> dict:
        header, obj = _split(artifact)
        symbols = [s["symbol"] for s in header["steps"] if s.get("symbol")]
        return {"format": "object code", "object_bytes": len(obj), "symbols": symbols,
                "steps": header["steps"], "arena": header["arena"],
                "tier": header.get("tier", "full"),
                "interpreted": [s["kernel"] for s in header["steps"]
                                if "kernel" in s and s["symbol"] is None]}


@contextlib.contextmanager
def _gc_paused():
    """No cyclic garbage collection meanwhile (unless it was off already). Rendering makes
    tens of thousands of small llvmlite objects, and the collections they set off walked
    the whole heap, PyTorch's included: half of the render time of a first training step.
    The garbage of one compile is bounded and collected after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _split(artifact: bytes) -> tuple[dict, bytes]:
    """(header, object code) of an artifact. The header of the artifact parsed last is
    kept (by identity): a fresh compile's is read three times (its tier, the load, the
    loaded program), and nothing changes it."""
    global _last_split
    last = _last_split
    if last is not None and last[0] is artifact:
        return last[1]
    (size,) = _HEADER.unpack_from(artifact)
    parts = (json.loads(artifact[_HEADER.size : _HEADER.size + size]),
             artifact[_HEADER.size + size :])
    _last_split = (artifact, parts)  # one store: safe between threads
    return parts


_last_split: tuple[bytes, tuple[dict, bytes]] | None = None


def artifact_tier(artifact: bytes) -> str:
    """The LLVM tier (``llvm.TIERS``) an artifact's object code was compiled at."""
    return _split(artifact)[0].get("tier", "full")


def _generic_length(program: Program, gemms: dict, fallback: bool) -> int | None:
    """The length of the program's one flat dimension where its code does not depend on
    it (:meth:`_Executable.resized`), else None: every kernel a 1-D grid over that length
    (the renderer's caller range: it never states the extent) or a single point, with no
    index, gather, scatter, reduction or contraction, no split, no temporaries (their arena
    would be sized by it), no library call and nothing interpreted."""
    if fallback or gemms or program.temps:
        return None
    lengths = set()
    for kernel in program.kernels:
        if kernel.domain:
            if kernel.grid_rank != 1 or len(kernel.domain) != 1 or split_parts(kernel):
                return None
            lengths.add(kernel.domain[0])
        if any(i.op in _LENGTH_BOUND for i in kernel.body):
            return None
    return lengths.pop() if len(lengths) == 1 else None


_LENGTH_BOUND = frozenset(("index", "gather", "scatter", "reduce", "contract"))


def _row_work(kernel) -> int:
    """The work of one row (a point of the first grid dimension) for the worker pool's
    grain: the points and iterations below it, where the kernel loops times ``1 +
    MATH_WORK`` per math function (softmax's or cross-entropy's rows: ~10k terms of
    exponentials are worth splitting over threads, ~10k adds are not) and one more per
    ``ARITH_WORK`` arithmetic instructions (a layer norm's rows)."""
    if not kernel.grid_rank:
        return 1
    work = math.prod(kernel.domain[1:])
    if len(kernel.domain) > kernel.grid_rank:
        body = kernel.body
        arithmetic = sum(instr.op not in _NOT_ARITHMETIC for instr in body)
        work *= (1 + MATH_WORK * sum(instr.op in MATH_FUNCTIONS for instr in body)
                 + arithmetic // ARITH_WORK)
    return work


def _target(name: str | None) -> targets.Target:
    """The target called ``name``; ``None``: the one ``HOLOGRAM_CPU_TARGET`` selects."""
    return targets.current() if name is None else targets.named(name)


class _Executable(Executable):
    """A loaded program (see :class:`hologram.backends.base.Executable`)."""

    def __init__(self, header: dict, addresses: dict[str, int]):
        self._header, self._addresses = header, addresses
        self.nbuffers = header["buffers"]
        self.params = header["params"]
        self.temps = header["temps"]
        self.arena = header["arena"]
        self.program_text = header["program"]
        self.reasons = {s["kernel"]: s["reason"] for s in header["steps"] if "kernel" in s}
        self.tier = header.get("tier", "full")
        self._program: Program | None = None
        self.steps: list[Callable] = [self._step(s, addresses) for s in header["steps"]]
        # Programs whose kernels are all native and need no arena run on a pointer array
        # built once per set of addresses (the hot path of small ops).
        self._pointer_arrays: dict[tuple[int, ...], ctypes.Array] = {}
        # The pointer array's type, made once: ``c_void_p * n`` costs more than an array.
        self._pointers = ctypes.c_void_p * max(self.nbuffers, 1)
        native = all(s.get("gemm") or s["symbol"] is not None for s in header["steps"])
        self.launch = self._launch_cached if native and not self.arena else self._launch
        # False while promote_when_hot may still replace this build's code.
        self._final = True
        self._count: Callable | None = None  # promote_when_hot's counting step
        self._resized: weakref.WeakSet = weakref.WeakSet()  # adopt() with this one

    @property
    def length(self) -> int | None:
        """The length of the one flat dimension the code runs over, where it runs at any
        (``_generic_length``)."""
        return self._header.get("length")

    def resized(self, length: int) -> _Executable | None:
        """This program's code run over ``length`` points of its one flat dimension, where
        the artifact says the code does not depend on it (``_generic_length``). Until this
        build is promoted, calls of the resized one count towards its promotion, and the
        promotion replaces both."""
        if self.length is None:
            return None
        steps = [dict(s, rows=length) if s.get("parallel") else s
                 for s in self._header["steps"]]
        other = _Executable(dict(self._header, steps=steps, length=length), self._addresses)
        with _RESIZED:
            if not self._final:
                other._final = False
                if self._count is not None and self.steps[0] is self._count:
                    other.steps = [self._count, *other.steps]
                    other._count = self._count  # (its promote_now promotes this one)
                self._resized.add(other)
        return other

    def promote_when_hot(self, full: Callable[[], _Executable]) -> None:
        """After ``HOLOGRAM_PROMOTE_AFTER`` more calls, have ``full()`` (the full build of
        this program, loaded) made on the background thread and run its code from then
        on. Until then each call first counts itself (one Python call per launch, removed
        with the count)."""
        steps, left = self.steps, [config.get().promote_after]
        self._final = False

        def submit() -> None:  # a race may submit twice: the second build is the same
            self.steps = steps
            _promoter.submit(self, full)

        def count(pointers, memory) -> None:
            left[0] -= 1
            if left[0] == 0:
                submit()

        count.submit = submit
        self._count = count
        self.steps = [count, *steps]

    def promote_now(self) -> None:
        """Have the full build made now, not after more calls (a caller about to time
        this program against another way of computing the same thing); nothing once it
        is submitted or built."""
        count = self._count
        if count is not None and self.steps and self.steps[0] is count:
            count.submit()

    @property
    def final(self) -> bool:
        """Is this the code calls will run from now on (no promotion pending)?"""
        return self._final

    def adopt(self, other: _Executable) -> None:
        """Run ``other``'s code from now on (the same program compiled again), and so do
        the executables :meth:`resized` made of this one."""
        self.steps = other.steps  # one store: a running call keeps iterating the old list
        self.tier = other.tier
        self._header, self._addresses = other._header, other._addresses  # for resized()
        with _RESIZED:
            self._final = True  # after the steps: native_plan must not see the old ones
            resized, self._resized = list(self._resized), weakref.WeakSet()
        for mine in resized:
            mine.adopt(other.resized(mine.length) or mine)

    def _step(self, step: dict, addresses: dict[str, int]) -> Callable:
        if "gemm" in step:
            return gemm.step(step["gemm"])
        if step["symbol"] is None:
            index = step["kernel"]
            return lambda pointers, memory: self._interpret(index, memory)
        address = addresses[step["symbol"]]
        if step.get("parts"):
            return self._split_step(address, addresses[step["symbol"] + "_final"],
                                    step["parts"])
        rows, parallel = step["rows"], step["parallel"]
        grain = max(1, -(-threads.min_chunk_work() // max(step["row_work"], 1)))
        if not parallel or rows < 2 * grain:
            # One call on this thread. Without a prototype, ctypes skips argument
            # conversion (~0.2 µs of a small op's budget); the arguments are typed objects.
            raw, stop = _RAW_KERNEL(address), ctypes.c_int64(rows)

            def direct(pointers, memory) -> None:
                raw(pointers, _ZERO, stop)

            direct.call = (address, rows)  # for native_plan
            return direct

        def parallel(pointers, memory) -> None:
            threads.run_kernel(address, pointers, rows, grain)

        parallel.call = (address, rows, grain)  # for native_plan
        return parallel

    def _split_step(self, part: int, final: int, parts: int) -> Callable:
        """A reduction split into ``parts`` partials (see ``render.split_parts``): the
        partials on the worker threads, then the final function here. The scratch memory
        for the partials (8 bytes each for the accumulators, 8 for argmax/argmin indices)
        is the pointer after the program's buffers."""
        nbuffers, final_fn, one = self.nbuffers, _RAW_KERNEL(final), ctypes.c_int64(1)
        part_fn, all_parts = _RAW_KERNEL(part), ctypes.c_int64(parts)
        scratch_type = ctypes.c_int64 * (2 * parts)
        extended_type = ctypes.c_void_p * (nbuffers + 1)
        # Per calling thread: its scratch (concurrent calls must not share one; every
        # partial stores its slot before the final function reads it, so reuse is safe)
        # and the extended pointer array, refilled only when the program's pointer array
        # is another object (cached ones hold the same addresses for life). Making both
        # per call cost ~1 us of a 1e6-term sum's 45.
        local = threading.local()

        def run(pointers, memory) -> None:
            try:
                extended, last = local.state
            except AttributeError:
                scratch = scratch_type()
                extended, last = extended_type(), None
                extended[nbuffers] = ctypes.addressof(scratch)
                local.scratch = scratch
            if last is not pointers:
                extended[:nbuffers] = pointers[:nbuffers]
                local.state = (extended, pointers)
            if threads.num_threads() == 1:  # no hand-off to the workers (~2 us)
                part_fn(extended, _ZERO, all_parts)
            else:
                threads.run_kernel(part, extended, parts, 1)
            final_fn(extended, _ZERO, one)

        run.call = (part, parts, 1, final)  # for native_plan
        return run

    def native_plan(self) -> tuple | bool | None:
        """How native code may launch this program without Python (hologram/csrc/launcher.c's
        Launcher, which every launch goes through): ``(pointer array length, slot of each
        parameter, steps)`` when every step is a kernel call, which is what :meth:`launch`
        would do: ``(kernel address, rows)``, one call ``kernel(pointers, 0, rows)`` on the
        calling thread (small kernels), or ``(kernel address, rows, grain)``, the rows
        split over the worker threads as :func:`threads.run_kernel` splits them (see
        :func:`threads.native_pieces`), or ``(partial address, parts, 1, final
        address)``, a split reduction (:meth:`_split_step`: its partials into scratch at
        pointer ``nbuffers``, then the final function), or a product (:func:`.gemm.step`):
        ``(kernel address, rows, grain, (words, ((slot, byte offset, word),) * 3, threads
        word, owner))``, its native job (:class:`.parallel_gemm.NativeJob`), or ``(fn,
        ((slot, byte offset),) * 3)``, ``fn(a, b, c)`` called back on its operands'
        addresses; then, for a program with
        temporaries, ``(arena bytes, ((slot, offset), ...), pool core)``: each call's
        scratch, a block of that pool, as :meth:`_launch` takes it. ``False`` while this
        build may still be replaced by a promotion (ask again later); ``None`` when it
        never will be (interpreted kernels)."""
        if not self._final:
            return False
        calls = tuple(getattr(step, "call", None) for step in self.steps)
        if not calls or None in calls:
            return None
        arena = (self.arena, tuple(map(tuple, self.temps)), _ARENAS.core) if self.arena \
            else None
        return max(self.nbuffers, 1), tuple(self.params), calls, arena

    def launch(self, handles: tuple[int, ...]) -> None:  # replaced per instance in __init__
        self._launch(handles)

    def _launch(self, handles: tuple[int, ...]) -> None:
        pointers = self._pointers()
        for slot, address in zip(self.params, handles):
            pointers[slot] = address
        # Scratch memory per call: concurrent calls of one program must not share it.
        # From a pool of its own: a freshly mapped arena of a few MB (torch.compile's
        # programs) would pay its page faults on every call; a pool block is reused warm.
        arena = _ARENAS.alloc((self.arena,), _BYTE) if self.arena else None
        if arena is not None:
            base = arena.ctypes.data
            for slot, offset in self.temps:
                pointers[slot] = base + offset
        memory = (handles, arena)
        for step in self.steps:
            step(pointers, memory)

    def _launch_cached(self, handles: tuple[int, ...]) -> None:
        """:meth:`_launch` for programs without scratch memory or interpreted kernels: the
        pointer array for a given set of addresses is built once (it holds nothing but
        those addresses, so reusing it is always right)."""
        pointers = self._pointer_arrays.get(handles)
        if pointers is None:
            if len(self._pointer_arrays) >= _POINTER_ARRAYS:
                self._pointer_arrays.clear()
            pointers = self._pointers()
            for slot, address in zip(self.params, handles):
                pointers[slot] = address
            self._pointer_arrays[handles] = pointers
        for step in self.steps:
            step(pointers, None)

    def _interpret(self, index: int, memory: tuple) -> None:
        """Run kernel ``index`` on the reference interpreter, on the same memory (counted
        in :func:`interpreted_stats`; warns once per reason)."""
        from hologram.backends.interp.interpreter import run_kernel
        from hologram.isa.text import parse_program

        if self._program is None:
            self._program = parse_program(self.program_text)
        program = self._program
        _count_interpreted(self.reasons[index])
        handles, arena = memory
        given = iter(host_arrays(program.params, handles))
        views = []
        for buf in program.buffers:
            if buf.kind != "temp":
                views.append(next(given))
            elif buf.nbytes == 0:  # no arena when every temporary is empty
                views.append(np.empty(0, buf.dtype.storage))
            else:
                raw = arena[buf.offset : buf.offset + buf.nbytes]
                views.append(raw.view(buf.dtype.storage))
        run_kernel(program, program.kernels[index], views)


class _Promoter:
    """The background thread that makes full builds of hot quickly compiled programs, one
    at a time (LLVM holds one lock anyway). Started at the first promotion; at exit it
    finishes the build under way and drops the rest (their quick artifacts are on disk,
    so nothing is lost): LLVM must not be in use while the process tears it down.

    A build waits until no other thread has compiled or loaded a program for
    :data:`QUIET` seconds (at most :data:`PATIENCE`): while a model's first step compiles
    its kernels or loads them from the disk cache, a promotion would hold LLVM's lock and
    the GIL between them, and the step waits for each of them."""

    QUIET = 0.05
    PATIENCE = 2.0

    def __init__(self) -> None:
        self.stats = {"promoted": 0, "failed": 0, "last_error": None}
        self._last_busy = 0.0  # time.monotonic() of the last compile or load elsewhere
        self.forget()

    def note_busy(self) -> None:
        """A compile or load starts on the calling thread (one store; the promotions' own
        are not counted)."""
        if threading.current_thread() is not self._thread:
            self._last_busy = time.monotonic()

    def _wait_for_quiet(self) -> None:
        deadline = time.monotonic() + self.PATIENCE
        while not self._stopping:
            now = time.monotonic()
            wait = min(self._last_busy + self.QUIET, deadline) - now
            if wait <= 0:
                return
            time.sleep(wait)

    def forget(self) -> None:
        """No thread and nothing queued: in a forked child, which has the parent's state
        but not its thread."""
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopping = False
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._busy = threading.Lock()  # held through each promotion (see fork_safely)

    def submit(self, executable: _Executable, full: Callable[[], _Executable]) -> None:
        with self._lock:
            if self._stopping:
                return
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hologram-promote",
                                                daemon=True)
                self._thread.start()
                atexit.register(self.stop)
        self._queue.put((executable, full))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            executable, full = item
            try:
                self._wait_for_quiet()
                with self._busy:
                    if not self._stopping:
                        executable.adopt(full())
                        self.stats["promoted"] += 1
            except Exception as exc:  # the quick code is right, only slower: keep it
                self.stats["failed"] += 1
                self.stats["last_error"] = f"{type(exc).__name__}: {exc}"
            finally:
                with self._lock:
                    self._pending -= 1
                    self._idle.notify_all()

    def fork_safely(self) -> None:
        """Register the fork hooks: a fork waits for the promotion under way, whose thread
        may hold locks of LLVM, LIEF or the cache that a child would find held forever,
        and the child starts with no thread and nothing queued."""
        os.register_at_fork(before=lambda: self._busy.acquire(),
                            after_in_parent=lambda: self._busy.release(),
                            after_in_child=self.forget)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no promotion is queued or under way; False on timeout."""
        with self._lock:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join()


_promoter = _Promoter()
if hasattr(os, "register_at_fork"):
    _promoter.fork_safely()


def wait_for_promotions(timeout: float | None = None) -> bool:
    """Wait until every promotion submitted so far is done (tests, benchmarks); False if
    ``timeout`` seconds passed first."""
    return _promoter.wait(timeout)


def promotion_stats() -> dict:
    """Programs promoted from the quick tier to the full build, promotions that failed
    (their programs keep the quick code, which computes the same bits) and the last
    failure."""
    return dict(_promoter.stats)


class InterpretedKernelWarning(UserWarning):
    """A cpu program ran a kernel on the reference interpreter (see
    :func:`interpreted_stats`)."""


_interpreted: Counter[str] = Counter()
_interpreted_lock = threading.Lock()


def interpreted_stats() -> dict[str, int]:
    """How many kernel launches of cpu programs ran on the reference interpreter, by
    reason (``render.unsupported``'s words, domain extents left out)."""
    with _interpreted_lock:
        return dict(_interpreted.most_common())


def reset_interpreted_stats() -> None:
    """Forget the counts (and warn again for the next interpreted kernel of each reason)."""
    with _interpreted_lock:
        _interpreted.clear()


def _count_interpreted(reason: str) -> None:
    # Kernels with a zero extent do no arithmetic worth a native function: counted, quiet.
    kind = "a zero extent" if "zero extent" in reason else reason.split(" (", 1)[0]
    with _interpreted_lock:
        first = kind not in _interpreted
        _interpreted[kind] += 1
    if first and "zero extent" not in kind:
        warnings.warn(f"the cpu backend runs a kernel on the reference interpreter: {reason}; "
                      "hologram.backends.cpu.backend.interpreted_stats() counts these "
                      "launches", InterpretedKernelWarning, stacklevel=2)
