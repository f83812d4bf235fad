"""Recorded execution: device ops are recorded into a region and run together at a cut.

With lazy execution on (``HOLOGRAM_LAZY=1``, or :func:`set_lazy`), a device kernel that
runs as a Hologram program (:func:`hologram_torch.aten.runner.run`) does everything it
does eagerly — checks its operands, raises PyTorch's errors, compiles its own program the
first time, allocates its results — except the launch: the launch is recorded as a node
of the pending *region*. The region runs when the host needs device memory:

* a host access to device memory the region reads or writes (``memory.cpu_alias``:
  ``.item()``, ``.cpu()``, printing, ``torch.save``, the CPU fallback, the distributed
  backend's collectives; memory the region does not touch is accessed at once),
  ``torch.hologram.synchronize()``, a ``torch.compile``d graph on device tensors;
* a memory hazard the fused program could not order (below);
* :data:`MAX_NODES` recorded ops.

A region runs op by op (each node's own program, exactly as eagerly) the first time its
structure is seen; from the second time a fused program of the whole region is compiled
on a background thread (the nodes' builders, which are the lowering table's entries, on
one graph: results flow between them as values, fused and scheduled by the compiler), and
once it is ready every later region of that structure is one launch. The structure is the
nodes' launch keys (op, static arguments, operands' dtypes, shapes and strides) and how
their operands connect; Python numbers and CPU scalars are runtime operands, so a
learning rate or a step count that changes every step never recompiles. Results written
by the region whose storage is already gone (temporaries) are not written by the fused
program at all.

The region itself lives in the device's native library (``csrc/region.cpp``): the front
kernels of the hot ops record their filed calls there without reaching Python, the other
kernels through :func:`record` (one native call), foreach calls through
:func:`record_rows`. This module decides the rest: when a region runs, the memo of fused
programs, staging.

Hazards. A node reads a tensor whose storage a pending node writes: exactly that tensor,
or any view of a dense write (contiguous, channels_last, transposed) of the same dtype,
becomes a value in the fused program; another view cuts the region first, and so does a
node writing another view of a storage a pending node writes (unless it is the same
memory whole, through a reshape). Results written over memory the
region also reads (in-place updates: an optimizer's) are written in place when the
compiled kernels read that memory only before the kernel that writes it, or in it at the
written element itself (:func:`_staging`); otherwise they are *staged*: written to
scratch blocks, copied in place once the program has run.

Errors a launch raises surface at the cut, with the recorded ops named (PyTorch's CUDA
device reports asynchronous errors the same way). ``HOLOGRAM_LAZY=0`` (the default for
now) runs op by op, for debugging.

One region serves the process: autograd's device thread records the backward ops into
the region the forward ops are in, and threads that use the device at once record into
it together. A region runs under a lock, held until its launch returns (which lets go of
the GIL while kernels run); a host access to device memory, a synchronize and the next
region wait for it, so another thread never reads memory a running region writes.
"""

from __future__ import annotations

import ctypes
import os
import queue
import threading
import time
import warnings
from collections import OrderedDict

import numpy as np
import torch

import hologram
from hologram import config
from hologram.compiler import pipeline
from hologram.compiler.options import CompileOptions
from hologram.errors import DeviceError
from hologram.frontend.graph import Graph
from hologram.runtime import compile_process

#: The most ops a region records before it runs (a bound on the fused program's size,
#: hence its compile time, and on the memory its pending results hold).
MAX_NODES = 512
#: Region structures remembered (their counts and fused programs), least recent dropped.
MEMO_ENTRIES = 256
#: Once a region's fused program is ready, one run in this many takes the other way (op
#: by op or fused) than the one that has been faster, to keep both timings current.
RESAMPLE = 32

_lock = threading.RLock()
_state = {"on": config.get().lazy}
_stats = {"recorded": 0, "regions": 0, "fused_runs": 0, "op_by_op_runs": 0, "staged": 0,
          "compiles": 0, "compiled_elsewhere": 0, "compile_failures": 0, "cuts": {}}


def active() -> bool:
    """Is lazy execution on?"""
    return _state["on"]


class set_lazy:
    """``set_lazy(True)`` records device ops from now on, ``set_lazy(False)`` runs the
    pending region and launches op by op again; as a context manager, the previous mode
    is restored on exit (``with hologram_torch.set_lazy(False): ...``), as
    ``torch.set_grad_enabled`` does."""

    def __init__(self, on: bool) -> None:
        self.previous = _state["on"]
        _switch(bool(on))

    def __enter__(self) -> set_lazy:
        return self

    def __exit__(self, *exc) -> None:
        _switch(self.previous)


def _switch(on: bool) -> None:
    with _lock:
        if not on:
            _flush("mode")
        elif not _state["on"]:
            _functions()  # refuses where the native library is missing
        _state["on"] = on
        if _native is not None:
            _native["set_recording"](on)


def stats() -> dict:
    """Counters: ops recorded, regions run (fused or op by op), results staged (written
    in place after a fused program), fused programs compiled (of them, built by the
    helper process: :mod:`hologram.runtime.compile_process`; and failed), and the
    regions' cuts by reason."""
    with _lock:
        recorded = _native["recorded"]() - _recorded[0] if _native is not None else 0
        return dict(_stats, recorded=recorded, cuts=dict(_stats["cuts"]))


def reset_stats() -> None:
    with _lock:
        for k in _stats:
            _stats[k] = {} if k == "cuts" else 0
        if _native is not None:
            _recorded[0] = _native["recorded"]()


def pending() -> list:
    """The launch-cache entries of the pending region's ops, in order (their ``name``
    says which op each is)."""
    return [] if _native is None else _native["peek"]()


def untouched(x: torch.Tensor | torch.UntypedStorage) -> bool:
    """Does the pending region neither read nor write the storage of ``x`` (a tensor or a
    storage)? The host may then read or write it at once, before whatever is recorded
    next, without running the region (a memset, a CPU kernel's operand)."""
    if _idle():
        return True
    with _lock:  # (a region another thread is running has finished)
        if not _native["pending"]():
            return True
        st = x if isinstance(x, torch.UntypedStorage) else x.untyped_storage()
        return not _native["touched"](st.data_ptr(), False)


def unwritten(x: torch.Tensor) -> bool:
    """Does the pending region not write ``x``'s storage? The host may then read it at
    once."""
    if _idle():
        return True
    with _lock:
        return not _native["pending"]() or \
            not _native["touched"](x.untyped_storage().data_ptr(), True)


def sync(reason: str = "sync") -> None:
    """Run the pending region, and wait for one another thread is running."""
    if not _idle():
        with _lock:
            _flush(reason)


def _idle() -> bool:
    """Nothing pending, and no region can be running: recording is off (switching it off
    ran the last region, under the lock). Otherwise a region another thread took may
    still be running (its launch lets go of the GIL) until the lock is free: the host
    must not touch memory before it has finished, nor run the next region."""
    return _native is None or not (_state["on"] or _native["pending"]())


def set_max_nodes(n: int) -> None:
    """Bound the ops a region records before it runs (:data:`MAX_NODES` by default)."""
    _functions()["set_max_nodes"](n)


# --- recording -----------------------------------------------------------------------
#
# The pending region lives in the device's native library (csrc/region.cpp), which the
# front kernels of the hot ops record into without reaching Python; the other kernels
# record through record() below. Its codes for dtypes are c10's scalar types.

_native: dict | None = None  # the region's functions, once connected
_recorded = [0]  # the native count of recorded ops at the last reset_stats()
_DTYPES: dict[int, torch.dtype] = {}  # c10 scalar type -> dtype
_NUMBER_KIND = {-1: bool, -2: int, -3: float}


def _functions() -> dict:
    """The native region's functions (connected on first use); a :class:`DeviceError`
    naming the remedy where the native library is missing."""
    global _native
    if _native is None:
        from hologram_torch import native

        functions = native.region_functions()
        if functions is None:
            raise DeviceError(
                "recorded execution (HOLOGRAM_LAZY=1, hologram_torch.set_lazy) needs the "
                f"device's native library, which is not loaded: {native.reason()}")
        _DTYPES.update(functions["dtypes"]())
        functions["set_max_nodes"](MAX_NODES)
        functions["set_recording"](_state["on"])
        _recorded[0] = functions["recorded"]()
        _native = functions
    return _native


def connect() -> None:
    """At import: with ``HOLOGRAM_LAZY=1``, connect the native region now; where the
    native library is missing, warn and run op by op (``set_lazy(True)`` raises there)."""
    if _state["on"]:
        try:
            _functions()
        except DeviceError as e:
            _state["on"] = False
            warnings.warn(f"{e}; the device runs op by op", stacklevel=2)


def record(entry, args, outs, given: bool) -> None:
    """Record a launch of ``entry`` (a launch-cache entry of :mod:`.aten.program`, which
    carries its key, builder and static arguments) on ``args`` (device tensors, CPU 0-d
    tensors, Python numbers) writing ``outs``: fresh results, or ``given`` tensors
    (in-place, ``out=``). A hazard runs the pending region first."""
    with _lock:
        functions = _native or _functions()
        reason = functions["record"](entry, tuple(args), tuple(outs), given)
        if reason is not None:
            _flush(reason)
            reason = functions["record"](entry, tuple(args), tuple(outs), given)
            if reason is not None:  # an empty region has no hazard
                raise DeviceError(f"hologram lazy: {entry.name} could not be recorded "
                                  f"({reason})")


#: The fields of a taken region, in the order of csrc/region.cpp's ``take``.
_TAKEN = ("nodes", "structure", "live", "staged", "aliases", "live_address", "addresses",
          "staging", "keep")
#: The rest, which a region's op-by-op run and its compile read (``details``).
_DETAILS = ("wiring", "launches", "results", "out_of", "inputs")


def record_rows(entries: tuple, rows: tuple, outs: tuple, given: bool) -> bool:
    """Record a foreach op's rows: ``entries[i]`` on the operands ``rows[i]`` writing
    ``outs[i]`` (fresh, or ``given``: in place), as :func:`record` would one by one; False,
    with nothing recorded, when a written tensor overlaps itself or an operand other than
    element for element (the caller then takes its checked path)."""
    with _lock:
        functions = _native or _functions()
        start = 0
        while True:
            got = functions["record_rows"](entries[start:], rows[start:], outs[start:], given)
            if got is None:
                return True
            reason, i = got
            if reason == "unsafe":  # (checked before any row is recorded)
                return False
            _flush(reason)
            start += i


def launch_rows(entries: tuple, rows: tuple, outs: tuple, given: bool) -> bool:
    """Run a foreach op's rows now (op by op), ``entries[i]`` on ``rows[i]`` writing
    ``outs[i]``, each row's launch from native code; False, with nothing run, where
    :func:`record_rows` would refuse them."""
    return _functions()["launch_rows"](entries, rows, outs, given) is None


def rows_entries(op: int, rows: tuple) -> tuple | None:
    """The entries :func:`file_rows` filed for foreach op ``op`` on rows of this
    signature (operands' dtypes, shapes and strides, numbers' types), or None."""
    return None if _native is None else _native["rows_entries"](op, rows)


def file_rows(op: int, rows: tuple, entries: tuple) -> None:
    """File the entries of a foreach op's rows (see :func:`rows_entries`)."""
    (_native or _functions())["file_rows"](op, rows, entries)


class _Region:
    """A region taken from the native library to run (see csrc/region.cpp's ``take``;
    ``keep`` holds what must live until it has run). The fields of :data:`_DETAILS` are
    read from the native region on first use: a region that runs fused needs none."""

    __slots__ = (*_TAKEN, *_DETAILS)

    def __init__(self, taken: tuple) -> None:
        for name, value in zip(_TAKEN, taken):
            setattr(self, name, value)

    def __getattr__(self, name: str):
        if name not in _DETAILS:
            raise AttributeError(name)
        for field, value in zip(_DETAILS, _native["details"](self.keep)):
            setattr(self, field, value)
        return getattr(self, name)


# --- running -------------------------------------------------------------------------

class _Memo:
    __slots__ = ("final", "fused", "launch", "seconds", "seen", "staged", "state", "warm")

    def __init__(self) -> None:
        self.seen = 0
        self.launch = None
        self.staged = ()  # per live result: is it staged (see _run_fused)?
        self.state = "new"  # "compiling", "ready", "failed"
        self.seconds = [None, None]  # fastest runs: op by op, fused (see timed)
        self.fused = 0  # fused runs so far
        self.warm = False  # has op by op run once on its final builds (not timed)?
        self.final = False  # do the ops' programs run their final builds (for good, once so)?

    def fused_now(self, nodes: tuple) -> bool:
        """Run the fused program this time? Always for its first runs (until its quick
        build has been promoted to a full one: ``HOLOGRAM_PROMOTE_AFTER``); then once op
        by op, when the ops' own programs are full builds too (asked for now: a region
        that runs fused never calls them, so they would stay quick builds, and a quick
        build's time says nothing); then whichever way has been faster, except one run
        in :data:`RESAMPLE`. A fused program is not always faster: one whose fusion
        recomputes a long chain per element of a reduction can lose to the ops' own
        programs, and one whose products fuse with their neighbours may lose BLAS."""
        op_by_op, fused = self.seconds
        if self.fused <= config.get().promote_after:
            return True
        if op_by_op is None:
            for entry in nodes:
                promote = getattr(_executable(entry), "promote_now", None)
                if promote is not None:
                    promote()
            return not self.built(nodes)
        return (fused <= op_by_op) != (self.seen % RESAMPLE == 0)

    def timed(self, fused: bool, seconds: float, nodes: tuple) -> None:
        """Count a run of ``seconds``: each way's fastest run so far is its time (a run
        that waited for the CPU, on a background compile or another process, only adds
        time: a transformer step's op-by-op runs took 4.6 ms, or 66-73 ms beside the
        background compiler, and a running mean of those kept the region fused for a
        hundred steps). An op-by-op run counts only once there is a fused program to
        compare it with, and on its programs' final builds (see :meth:`fused_now`),
        from the second such run on: the first pays for the builds' first launches
        (plans made, memory touched the first time)."""
        self.fused += fused
        if not (fused or (self.launch is not None and self.built(nodes))):
            return
        if not (fused or self.warm):
            self.warm = True
            return
        best = self.seconds[fused]
        self.seconds[fused] = seconds if best is None else min(best, seconds)


    def built(self, nodes: tuple) -> bool:
        """:func:`_final`, asked of the nodes until it holds (a promotion is one way, and
        a region's nodes are the same entries for its memo's life): a walk over every
        node's program was ~1.5 µs a node of each op-by-op run."""
        if not self.final:
            self.final = _final(nodes)
        return self.final


def _executable(entry):
    """The executable an entry's launch runs (None where it has no such thing)."""
    return getattr(entry.launch, "executable", None)


def _final(nodes: tuple) -> bool:
    """Do the nodes' programs run their final builds (no promotion pending)?"""
    return all(getattr(_executable(entry), "final", True) for entry in nodes)


_memo: OrderedDict[tuple, _Memo] = OrderedDict()


def _flush(reason: str) -> None:
    """Run the pending region (the caller holds the lock)."""
    taken = _native["take"]() if _native is not None else None
    if taken is None:
        return
    region = _Region(taken)  # taken first: a launch's error must not leave it pending
    moved = {} if _host_memory() else _to_device(region)
    cuts = _stats["cuts"]
    cuts[reason] = cuts.get(reason, 0) + 1
    _stats["regions"] += 1
    # Results written over memory the region reads (in-place updates) are staged, unless
    # the compiled program can write them in place (_staging).
    live, staged, aliases = region.live, region.staged, region.aliases
    # The entries themselves, not their launch keys (long tuples, hashed anew each time):
    # one entry serves each launch key while the launch cache holds it, and the memo holds
    # them, so an entry the cache dropped is never mistaken for its successor. The rest of
    # the structure (wiring, live results, aliases) is one bytes object (csrc/region.cpp's
    # take), built and hashed natively: nested tuples cost ~0.15 ms a cut.
    key = (region.nodes, region.structure)
    memo = _memo.get(key)
    if memo is None:
        memo = _memo[key] = _Memo()
        while len(_memo) > MEMO_ENTRIES:
            _memo.popitem(last=False)
    else:
        _memo.move_to_end(key)
    memo.seen += 1
    try:
        fused = memo.launch is not None and memo.fused_now(region.nodes)
        start = time.perf_counter()
        if fused:
            _run_fused(region, memo.launch, live, memo.staged)
        else:
            for entry, addresses in zip(region.nodes, _launches(region, moved)):
                entry.launch(addresses)
        memo.timed(fused, time.perf_counter() - start, region.nodes)
        _stats["fused_runs" if fused else "op_by_op_runs"] += 1
        if memo.seen >= 2 and memo.state == "new" and len(region.nodes) > 1:
            memo.state = "compiling"
            _compiler.submit(memo, _plan(region, live, staged), aliases)
    except Exception as e:
        names = sorted({entry.name for entry in region.nodes})
        more = ", ..." if len(names) > 12 else ""
        e.add_note(f"hologram lazy execution: raised while running {len(region.nodes)} "
                   f"recorded ops ({', '.join(names[:12])}{more}); HOLOGRAM_LAZY=0 runs op "
                   "by op and raises at the op itself")
        raise


def _host_memory() -> bool:
    from hologram_torch import memory

    return memory.host_memory()


def _to_device(region: _Region) -> dict:
    """On device memory: the region's host operands (numbers, CPU scalars, which the
    native region boxes in host memory) replaced by device copies of their values in the
    fused program's inputs; returns the replacements (host address -> device address),
    which the ops' launches take too when the region runs op by op (:func:`_launches`).
    (Device and host addresses never coincide: CUDA's unified addressing, the emulation's
    tagged handles.)"""
    from hologram_torch.aten.runner import NUMBER_TYPES, device_scalar

    moved = {}
    addresses = list(region.addresses)
    narrow = NUMBER_TYPES[float].itemsize == 4  # floats in f32 (webgpu), boxed as double
    for i, (kind, code, *_) in enumerate(region.inputs):
        if kind != "m":
            nbytes = _DTYPES[code].itemsize if kind == "c" else 8  # a box: 8 bytes
            host = addresses[i]
            value = ctypes.string_at(host, nbytes)
            if narrow and kind != "c" and _NUMBER_KIND[code] is float:
                with np.errstate(over="ignore"):  # (past f32's range: inf, as a cast)
                    value = np.frombuffer(value, np.float64).astype(np.float32).tobytes()
            addresses[i] = moved[host] = device_scalar(value)
    if moved:
        region.addresses = tuple(addresses)
    return moved


def _launches(region: _Region, moved: dict):
    """Each op's launch addresses, host operands replaced as :func:`_to_device` says
    (rewritten only for a region that runs op by op: a fused run needs none)."""
    if not moved:
        return region.launches
    return (tuple(moved.get(a, a) for a in launch) for launch in region.launches)


def _layout(region: _Region, node: int, j: int) -> tuple:
    """(shape, strides, bytes, dtype) of result ``j`` of node ``node`` (its entry's)."""
    return region.nodes[node].layouts[j]


def _run_fused(region: _Region, launch, live: tuple, staged: tuple) -> None:
    from hologram_torch import memory

    if not any(staged):
        launch((*region.addresses, *region.live_address))
        return
    outs, scratch = [], []
    for k, stage, address in zip(live, staged, region.live_address):
        if stage:
            (node, j), write, storage = region.staging[k]
            nbytes = _layout(region, node, j)[2]
            block = memory.storage(nbytes)
            scratch.append((nbytes, write, storage, block))
            outs.append(block.data_ptr())
        else:
            outs.append(address)
    launch((*region.addresses, *outs))
    _stats["staged"] += len(scratch)
    for nbytes, write, storage, block in scratch:  # in place, after every read of the memory
        view, _, offset, _, contiguous, _ = write
        if contiguous:
            memory.copy(view[0], block.data_ptr(), nbytes)
        else:
            dtype = _DTYPES[view[3]]
            target = memory.on_storage(storage, dtype, view[1], view[2], offset)
            source = memory.on_storage(block, dtype, view[1], memory.contiguous_strides(view[1]))
            alias = memory.cpu_alias(target)
            alias.copy_(memory.cpu_alias(source))
            memory.write_back(alias)


def _plan(region: _Region, live: tuple, staged: tuple) -> tuple:
    """What compiling the region's fused program needs (no tensors, no addresses):
    its inputs, per node (builder, static arguments, operands, result layouts, whether
    the builder returns one tensor, the node's results), and the live results' (node,
    index, strides; None for contiguous, as staged results are)."""
    nodes = tuple((e.build, e.static, w, e.layouts, e.single, r)
                  for e, w, r in zip(region.nodes, region.wiring, region.results))
    outputs = []
    for k, stage in zip(live, staged):
        node, j = region.out_of[k]
        outputs.append((node, j, None if stage else _layout(region, node, j)[1]))
    return tuple(region.inputs), nodes, tuple(outputs)


def fused_program(plan: tuple):
    """The Atlas program of a region (see :func:`_plan`): the nodes' builders on one
    graph, whose inputs are the region's inputs in order and whose outputs are the
    region's live results in order."""
    from hologram_torch.aten.runner import ISA, NUMBER_TYPES, cast

    inputs, nodes, outputs = plan
    g = Graph("region")
    ins, values = [], {}
    for i, (kind, code, *layout) in enumerate(inputs):
        if kind == "m":
            ins.append(g.strided_input(f"i{i}", ISA[_DTYPES[code]], *layout))
        elif kind == "c":
            ins.append(g.input(f"i{i}", ISA[_DTYPES[code]], ()))
        else:
            ins.append(g.input(f"i{i}", NUMBER_TYPES[_NUMBER_KIND[code]], ()))

    def operand(w):
        if w[0] == "i":
            return ins[w[1]]
        value = values[w[1]]
        if w[0] == "v":
            return value
        if w[5] != tuple(range(len(w[5]))):  # the dimensions in their memory order
            value = value.permute(*w[5])
        if not value._contiguous() or value.offset:  # a view of the value's own memory
            value = g.copy(value)
        return value._view(w[3], w[4], w[2])

    by_node = []
    for build, static, wiring, layouts, single, results in nodes:
        result = build(g, *map(operand, wiring), *static)
        result = (result,) if single else tuple(result)
        cast_results = [cast(r, ISA[layout[3]]) for r, layout in zip(result, layouts)]
        values.update(zip(results, cast_results))
        by_node.append(cast_results)
    for k, (i, j, strides) in enumerate(outputs):
        g.output(f"o{k}", by_node[i][j], None if strides is None else tuple(strides))
    return g.program()


def _staging(program, aliases: tuple) -> tuple:
    """Which live results of a region's fused program must be staged (:func:`_flush`'s
    ``aliases``: the inputs reading the memory each one writes). A result need not be
    when the compiled kernels read that memory only before the one kernel that writes
    it, or in it element for element at the write's own index through the very tensor it
    writes (an optimizer's update ``p = p - lr * ...``): each element is then read before
    it is written, whatever order the kernels take. A result whose written tensor is not
    contiguous (``over`` None) is always staged."""
    final = pipeline.run(program, CompileOptions.from_env())
    index = {buffer.name: i for i, buffer in enumerate(final.buffers)}
    return tuple(over is None or (bool(over) and not _in_place(
        final, index.get(f"o{x}"), {index.get(f"i{i}"): exact for i, exact in over}))
        for x, over in enumerate(aliases))


def _in_place(program, out: int | None, inputs: dict) -> bool:
    """Can the kernels of ``program`` write buffer ``out`` over the memory its
    ``inputs`` read (by buffer: whether it is exactly the written tensor)? See
    :func:`_staging`. In the writing kernel the memory must be read only by loads at the
    store's own index, which the store's value depends on (so each element is loaded
    before it is stored, in any order of emission), and what those loads feed must reach
    no reduction and no store outside the store's loop nest (codegen.loops: stores of
    one shape share a nest; another nest would load the memory again)."""
    written = False
    for kernel in program.kernels:
        body = kernel.body
        reads = {k for k, ins in enumerate(body)
                 if ins.op in ("load", "gather") and ins.buffer in inputs}
        writes = [k for k, ins in enumerate(body)
                  if ins.op in ("store", "scatter") and ins.buffer == out]
        if written and (reads or writes):
            return False
        if not writes:
            continue
        if len(writes) > 1:
            return False
        store = body[writes[0]]
        fed = set(reads)  # instructions computed from the memory's loads
        for k, ins in enumerate(body):
            if k not in reads and fed.intersection(ins.args):
                fed.add(k)
        for k in reads:
            load = body[k]
            if not inputs[load.buffer] or load.op != "load" or \
                    load.attrs[1] != store.attrs[1] or load.shape != store.shape:
                return False
        if not reads <= _ancestors(body, writes[0]):
            return False
        for k in fed:
            ins = body[k]
            if ins.op in ("reduce", "contract", "scatter") or \
                    (ins.op == "store" and ins.shape != store.shape):
                return False
        written = store.op == "store"
    return written and out is not None


def _ancestors(body, k: int) -> set:
    """The instructions whose values instruction ``k`` of ``body`` is computed from."""
    seen, todo = set(), list(body[k].args)
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            todo.extend(body[i].args)
    return seen


class _Compiler:
    """The background thread that compiles regions' fused programs, one at a time."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._pending = 0

    def submit(self, memo: _Memo, plan: tuple, aliases: tuple) -> None:
        with self._idle:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hologram-lazy",
                                                daemon=True)
                self._thread.start()
        self._queue.put((memo, plan, aliases))

    def _run(self) -> None:
        from hologram_torch.aten.runner import backend

        while True:
            memo, plan, aliases = self._queue.get()
            try:
                program = fused_program(plan)
                # Built by the helper process where it can (not under this process's GIL,
                # which the recording thread needs), then loaded from the disk cache.
                if compile_process.build(program, backend()):
                    _stats["compiled_elsewhere"] += 1
                compiled = hologram.compile(program, backend())
                staged = _staging(program, aliases)
            except Exception:  # the region keeps running op by op, as it did
                memo.state = "failed"
                _stats["compile_failures"] += 1
            else:
                memo.staged = staged
                memo.launch, memo.state = compiled.launch, "ready"
                _stats["compiles"] += 1
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)


_compiler = _Compiler()


def _forked() -> None:
    """In a forked child: a lock of its own (another thread of the parent may have held
    it) and no compiler thread (a fork copies only the forking thread)."""
    global _lock, _compiler
    _lock = threading.RLock()
    _compiler = _Compiler()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Wait until every fused program submitted so far is compiled (tests, benchmarks);
    False if ``timeout`` seconds passed first."""
    return _compiler.wait(timeout)
