"""Recorded execution: device ops are recorded into a region and run together at a cut.

With lazy execution on (``HOLOGRAM_LAZY=1``, or :func:`set_lazy`), a device kernel that
runs as a Hologram program (:func:`hologram_torch.aten.program.run`) does everything it
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

Hazards. A node reads a tensor whose storage a pending node writes: exactly that tensor,
or any view of a contiguous write of the same dtype, becomes a value in the fused
program; another view (of a strided write) cuts the region first, and so does a node
writing another view of a storage a pending node writes. Results written over memory the
region also reads (in-place updates: an optimizer's) are written in place when the
compiled kernels read that memory only before the kernel that writes it, or in it at the
written element itself (:func:`_staging`); otherwise they are *staged*: written to
scratch blocks, copied in place once the program has run.

Errors a launch raises surface at the cut, with the recorded ops named (PyTorch's CUDA
device reports asynchronous errors the same way). ``HOLOGRAM_LAZY=0`` (the default for
now) runs op by op, for debugging.

One region serves the process, under a lock: autograd's device thread records the
backward ops into the region the forward ops are in.
"""

from __future__ import annotations

import ctypes
import math
import os
import queue
import threading
import weakref
from collections import OrderedDict

import torch

import hologram
from hologram import config
from hologram.compiler import pipeline
from hologram.compiler.options import CompileOptions
from hologram.frontend.graph import Graph

#: The most ops a region records before it runs (a bound on the fused program's size,
#: hence its compile time, and on the memory its pending results hold).
MAX_NODES = 512
#: Region structures remembered (their counts and fused programs), least recent dropped.
MEMO_ENTRIES = 256

_lock = threading.RLock()
_state = {"on": config.get().lazy}
_stats = {"recorded": 0, "regions": 0, "fused_runs": 0, "op_by_op_runs": 0, "staged": 0,
          "compiles": 0, "compile_failures": 0, "cuts": {}}


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
    from hologram_torch import native

    with _lock:
        if not on:
            _flush("mode")
        elif not _state["on"]:
            native.clear_fast()  # the front kernels' filed calls launch eagerly
        _state["on"] = on


def stats() -> dict:
    """Counters: ops recorded, regions run (fused or op by op), results staged (written
    in place after a fused program), fused programs compiled (and failed), and the
    regions' cuts by reason."""
    with _lock:
        return dict(_stats, cuts=dict(_stats["cuts"]))


def reset_stats() -> None:
    with _lock:
        for k in _stats:
            _stats[k] = {} if k == "cuts" else 0


def untouched(x: torch.Tensor | torch.UntypedStorage) -> bool:
    """Does the pending region neither read nor write the storage of ``x`` (a tensor or a
    storage)? The host may then read or write it at once, before whatever is recorded
    next, without running the region (a memset, a CPU kernel's operand)."""
    if not _region.nodes:
        return True
    with _lock:
        st = x if isinstance(x, torch.UntypedStorage) else x.untyped_storage()
        sk = st.data_ptr()
        return sk not in _region.read and sk not in _region.written


def sync(reason: str = "sync") -> None:
    """Run the pending region (a no-op when nothing is pending)."""
    if _region.nodes:
        with _lock:
            _flush(reason)


# --- recording -----------------------------------------------------------------------
#
# A region is kept in flat lists of numbers and tuples of numbers: objects that survive
# the collector's young generations make it run a full collection (350 ms with torch
# loaded) every ~100k of them, and a recorded op must not leave several behind. Only the
# weak references to written storages (one per result) are such objects.

_DTYPES = [getattr(torch, name) for name in dir(torch)
           if isinstance(getattr(torch, name), torch.dtype)]
_DTYPES = list(dict.fromkeys(_DTYPES))
_CODE = {d: i for i, d in enumerate(_DTYPES)}
_NUMBER_BOX = {bool: ctypes.c_bool, int: ctypes.c_int64, float: ctypes.c_double}
_NUMBER_CODE = {bool: -1, int: -2, float: -3}
_NUMBER_KIND = {code: kind for kind, code in _NUMBER_CODE.items()}


class _Region:
    def __init__(self) -> None:
        # per node: its launch-cache entry, how its operands connect (("i", input) |
        # ("v", result) | ("w", result, offset, shape, strides)), its eager launch's
        # addresses, and its results (indices into the result lists)
        self.nodes: list = []
        self.wiring: list[tuple] = []
        self.launches: list[tuple] = []
        self.results: list[tuple] = []
        # per result: its address, a weak reference to its storage, the storage's
        # address, (node, index)
        self.out_address: list[int] = []
        self.out_ref: list = []
        self.out_storage: list[int] = []
        self.out_of: list[tuple] = []
        self.superseded: set[int] = set()  # results overwritten by a later node
        # the fused program's inputs: ("m", dtype, shape, strides) device memory, ("c",
        # dtype) a CPU scalar, ("n", number type); codes for dtypes and types
        self.inputs: list[tuple] = []
        self.addresses: list[int] = []
        self.keep: list = []  # what must live until the region runs
        self.input_of: dict[tuple, int] = {}  # memory inputs by view
        self.inputs_over: dict[int, list] = {}  # memory inputs by storage address
        self.read: set[int] = set()  # storages read from memory, by address
        # storages written, by address: (view, result, offset, numel, contiguous, order:
        # the dimensions from outermost in memory when the write is dense, else None)
        self.written: dict[int, tuple] = {}


_region = _Region()


def _reading(w: tuple, x, view: tuple) -> tuple | None:
    """How ``x`` (whose view is ``view``) reads the pending write ``w``: ``("v",
    result)`` (the same view), ``("w", result, offset, shape, strides, order)`` (a view
    of a dense write, whose memory holds the result's dimensions in ``order``), or None
    (the region must run first)."""
    if view == w[0]:
        return ("v", w[1])
    if w[5] is None or view[3] != w[0][3]:
        return None
    offset = x.storage_offset() - w[2]
    shape, strides = view[1], view[2]
    last = offset + sum((n - 1) * s for n, s in zip(shape, strides)) if 0 not in shape \
        else offset
    if offset < 0 or last >= w[3]:
        return None
    return ("w", w[1], offset, tuple(shape), strides, w[5])


def _fresh_views(entry) -> tuple:
    """Per fresh result of ``entry``: (shape, strides, dtype code, elements, contiguous,
    order), from its layouts (the same for every call; kept on the entry)."""
    views = entry.lazy
    if views is None:
        views = []
        for shape, strides, _, dtype in entry.layouts:
            contiguous = torch.empty(shape, device="meta").stride()  # torch's own
            strides = contiguous if strides is None else tuple(strides)
            views.append((tuple(shape), strides, _CODE[dtype], math.prod(shape),
                          strides == contiguous, _order(shape, strides)))
        views = entry.lazy = tuple(views)
    return views


def _order(shape, strides) -> tuple | None:
    """The dimensions of a tensor of ``shape`` and ``strides`` from outermost in memory
    when its elements fill their span densely (contiguous, channels_last, transposed),
    else None."""
    order = tuple(sorted(range(len(shape)), key=lambda d: -strides[d]))
    step = 1
    for d in reversed(order):
        if shape[d] > 1:
            if strides[d] != step:
                return None
            step *= shape[d]
    return order


def record(entry, args, outs, given: bool) -> None:
    """Record a launch of ``entry`` (a launch-cache entry of :mod:`.aten.program`, which
    carries its key, builder and static arguments) on ``args`` writing ``outs``: fresh
    results, or ``given`` tensors (in-place, ``out=``). This is every recorded op's cost:
    each tensor attribute read here is ~0.1 µs."""
    with _lock:
        if len(_region.nodes) >= MAX_NODES:
            _flush("size")
        region = _region
        reads = _reads(region, args)
        if reads is None or (given and _overlapping(region, outs)):
            region = _region  # the region ran: nothing pending to depend on
            reads = _reads(region, args)
        wiring, addresses = [], []
        for r in reads:
            if type(r) is not tuple:
                if type(r) in _NUMBER_BOX:
                    box = _NUMBER_BOX[type(r)](r)
                    region.keep.append(box)
                    address = ctypes.addressof(box)
                    wiring.append(_new_input(region, ("n", _NUMBER_CODE[type(r)]), address))
                else:  # a CPU 0-d tensor: its value now, not at the cut
                    r = r.clone()
                    region.keep.append(r)
                    address = r.data_ptr()
                    wiring.append(_new_input(region, ("c", _CODE[r.dtype]), address))
                addresses.append(address)
                continue
            x, sk, view, pending = r
            if pending is not None:
                wiring.append(pending)
            else:
                i = region.input_of.get(view)
                if i is None:
                    i = region.input_of[view] = len(region.inputs)
                    region.inputs.append(("m", view[3], tuple(view[1]), view[2]))
                    region.addresses.append(view[0])
                    region.keep.append(x.untyped_storage())
                    region.inputs_over.setdefault(sk, []).append(i)
                region.read.add(sk)
                wiring.append(("i", i))
            addresses.append(view[0])
        node, results = len(region.nodes), []
        written, superseded = region.written, region.superseded
        fresh = None if given else _fresh_views(entry)
        for j, o in enumerate(outs):
            st = o.untyped_storage()
            sk = st.data_ptr()
            if fresh is None:
                address = o.data_ptr()
                view = (address, o.shape, o.stride(), _CODE[o.dtype])
                contiguous = o.is_contiguous()
                about = (o.storage_offset(), o.numel(), contiguous,
                         tuple(range(o.dim())) if contiguous else _order(o.shape, view[2]))
                previous = written.get(sk)
                if previous is not None and region.out_ref[previous[1]]() is not None:
                    superseded.add(previous[1])
            else:  # a new storage: whatever was filed under its address has died
                shape, strides, code, numel, contiguous, order = fresh[j]
                address = sk
                view = (sk, shape, strides, code)
                about = (0, numel, contiguous, order)
            k = len(region.out_address)
            region.out_address.append(address)
            region.out_ref.append(weakref.ref(st))
            region.out_of.append((node, j))
            region.out_storage.append(sk)
            written[sk] = (view, k, *about)
            addresses.append(address)
            results.append(k)
        region.nodes.append(entry)
        region.wiring.append(tuple(wiring))
        region.launches.append(tuple(addresses))
        region.results.append(tuple(results))
        _stats["recorded"] += 1


def _reads(region: _Region, args) -> list | None:
    """Each operand of a node about to be recorded: ``(tensor, storage address, view,
    how it reads a pending result or None)`` for device tensors, the operand itself
    otherwise; None when ``region`` has been run first (a hazard)."""
    reads = []
    written = region.written
    for x in args:
        if type(x) in _NUMBER_BOX or x.is_cpu:
            reads.append(x)
            continue
        sk = x.untyped_storage().data_ptr()
        view = (x.data_ptr(), x.shape, x.stride(), _CODE[x.dtype])
        w = written.get(sk)
        wiring = None
        if w is not None:
            if region.out_ref[w[1]]() is None:
                del written[sk]  # a dead storage's block, used again
            else:
                wiring = _reading(w, x, view)
                if wiring is None:
                    _flush("view")
                    return None
        reads.append((x, sk, view, wiring))
    return reads


def _overlapping(region: _Region, outs) -> bool:
    """Does a given result write another view of a storage a pending node writes? Then
    ``region`` has been run first (a hazard)."""
    for o in outs:
        w = region.written.get(o.untyped_storage().data_ptr())
        if w is None or region.out_ref[w[1]]() is None or \
                w[0] == (o.data_ptr(), o.shape, o.stride(), _CODE[o.dtype]):
            continue
        # another view of exactly the same memory (a reshape of a contiguous result,
        # written in place whole) replaces the pending write; any other overlap cuts
        if not (w[4] and o.is_contiguous() and o.storage_offset() == w[2]
                and o.numel() == w[3] and _CODE[o.dtype] == w[0][3]):
            _flush("overlapping write")
            return True
    return False


def _new_input(region: _Region, spec: tuple, address: int) -> tuple:
    region.inputs.append(spec)
    region.addresses.append(address)
    return ("i", len(region.inputs) - 1)


# --- running -------------------------------------------------------------------------

class _Memo:
    __slots__ = ("launch", "seen", "staged", "state")

    def __init__(self) -> None:
        self.seen = 0
        self.launch = None
        self.staged = ()  # per live result: is it staged (see _run_fused)?
        self.state = "new"  # "compiling", "ready", "failed"


_memo: OrderedDict[tuple, _Memo] = OrderedDict()


def _flush(reason: str) -> None:
    """Run the pending region (the caller holds the lock)."""
    global _region
    region = _region
    if not region.nodes:
        return
    _region = _Region()  # first: a launch's error must not leave the region pending
    cuts = _stats["cuts"]
    cuts[reason] = cuts.get(reason, 0) + 1
    _stats["regions"] += 1
    live = tuple(k for k, ref in enumerate(region.out_ref)
                 if ref() is not None and k not in region.superseded)
    # Results written over memory the region reads (in-place updates) are staged: the
    # fused program writes them to scratch and they are copied in place after it, since
    # its kernels run in an order of their own and may read that memory after the write.
    staged = tuple(region.out_storage[k] in region.read for k in live)
    aliases = tuple(_aliases(region, k) if stage else () for k, stage in zip(live, staged))
    key = (tuple(entry.key for entry in region.nodes), tuple(region.wiring), live, aliases)
    memo = _memo.get(key)
    if memo is None:
        memo = _memo[key] = _Memo()
        while len(_memo) > MEMO_ENTRIES:
            _memo.popitem(last=False)
    else:
        _memo.move_to_end(key)
    memo.seen += 1
    try:
        if memo.launch is not None:
            _run_fused(region, memo.launch, live, memo.staged)
            _stats["fused_runs"] += 1
        else:
            for entry, addresses in zip(region.nodes, region.launches):
                entry.launch(addresses)
            _stats["op_by_op_runs"] += 1
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


def _aliases(region: _Region, k: int) -> tuple:
    """How the region's inputs read the memory result ``k`` writes: per input over its
    storage, (input, whether it is exactly the written tensor, contiguous)."""
    from hologram_torch import memory

    view = region.written[region.out_storage[k]][0]
    contiguous = tuple(memory.contiguous_strides(view[1])) == tuple(view[2])
    return tuple((i, contiguous and region.addresses[i] == view[0]
                  and region.inputs[i][2:] == (view[1], view[2]))
                 for i in region.inputs_over[region.out_storage[k]])


def _layout(region: _Region, k: int) -> tuple:
    """(shape, strides, bytes, dtype) of result ``k`` (its entry's layout)."""
    node, j = region.out_of[k]
    return region.nodes[node].layouts[j]


def _run_fused(region: _Region, launch, live: tuple, staged: tuple) -> None:
    from hologram_torch import memory

    outs, scratch = [], []
    for k, stage in zip(live, staged):
        if stage:
            nbytes = _layout(region, k)[2]
            block = memory.storage(nbytes)
            scratch.append((k, block))
            outs.append(block.data_ptr())
        else:
            outs.append(region.out_address[k])
    launch((*region.addresses, *outs))
    _stats["staged"] += len(scratch)
    for k, block in scratch:  # in place, after every read of the memory
        view, _, offset, _, contiguous, _ = region.written[region.out_storage[k]]
        if contiguous:
            ctypes.memmove(view[0], block.data_ptr(), _layout(region, k)[2])
        else:
            dtype = _DTYPES[view[3]]
            target = memory.on_storage(region.out_ref[k](), dtype, view[1], view[2], offset)
            source = memory.on_storage(block, dtype, view[1], memory.contiguous_strides(view[1]))
            memory.cpu_alias(target).copy_(memory.cpu_alias(source))


def _plan(region: _Region, live: tuple, staged: tuple) -> tuple:
    """What compiling the region's fused program needs (no tensors, no addresses):
    its inputs, per node (builder, static arguments, operands, result layouts, whether
    the builder returns one tensor, the node's results), and the live results' (node,
    index, strides; None for contiguous, as staged results are)."""
    nodes = tuple((e.build, e.static, w, e.layouts, e.single, r)
                  for e, w, r in zip(region.nodes, region.wiring, region.results))
    outputs = tuple((*region.out_of[k], None if stage else _layout(region, k)[1])
                    for k, stage in zip(live, staged))
    return tuple(region.inputs), nodes, outputs


def fused_program(plan: tuple):
    """The Atlas program of a region (see :func:`_plan`): the nodes' builders on one
    graph, whose inputs are the region's inputs in order and whose outputs are the
    region's live results in order."""
    from hologram_torch.aten.program import ISA, NUMBER_TYPES, cast

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
    it is written, whatever order the kernels take."""
    final = pipeline.run(program, CompileOptions.from_env())
    index = {buffer.name: i for i, buffer in enumerate(final.buffers)}
    return tuple(bool(over) and not _in_place(
        final, index.get(f"o{x}"), {index.get(f"i{i}"): exact for i, exact in over})
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
        from hologram_torch.aten.program import backend

        while True:
            memo, plan, aliases = self._queue.get()
            try:
                program = fused_program(plan)
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
