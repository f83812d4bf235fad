"""Recorded execution: device ops are recorded into a region and run together at a cut.

With lazy execution on (``HOLOGRAM_LAZY=1``, or :func:`set_lazy`), a device kernel that
runs as a Hologram program (:func:`hologram_torch.aten.program.run`) does everything it
does eagerly — checks its operands, raises PyTorch's errors, compiles its own program the
first time, allocates its results — except the launch: the launch is recorded as a node
of the pending *region*. The region runs when the host needs device memory:

* any host access to device memory (``memory.cpu_alias``: ``.item()``, ``.cpu()``,
  printing, ``torch.save``, the CPU fallback, the distributed backend's collectives),
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
program; another view (of a strided write) cuts the region first. A node writes a storage
that an earlier node of the region read from memory, or writes another view of a storage
a pending node writes: the region is cut first, since a fused program orders its kernels
by data, not by the order the ops were recorded.

Errors a launch raises surface at the cut, with the recorded ops named (PyTorch's CUDA
device reports asynchronous errors the same way). ``HOLOGRAM_LAZY=0`` (the default for
now) runs op by op, for debugging.

One region serves the process, under a lock: autograd's device thread records the
backward ops into the region the forward ops are in.
"""

from __future__ import annotations

import contextlib
import ctypes
import queue
import threading
import weakref
from collections import OrderedDict

import hologram
from hologram import config
from hologram.frontend.graph import Graph

#: The most ops a region records before it runs (a bound on the fused program's size,
#: hence its compile time, and on the memory its pending results hold).
MAX_NODES = 512
#: Region structures remembered (their counts and fused programs), least recent dropped.
MEMO_ENTRIES = 256

_lock = threading.RLock()
_state = {"on": config.get().lazy}
_stats = {"recorded": 0, "regions": 0, "fused_runs": 0, "op_by_op_runs": 0,
          "compiles": 0, "compile_failures": 0, "cuts": {}}


def active() -> bool:
    """Is lazy execution on?"""
    return _state["on"]


class set_lazy(contextlib.ContextDecorator):
    """``set_lazy(True)`` records device ops from now on, ``set_lazy(False)`` runs the
    pending region and launches op by op again; as a context manager, the previous mode
    is restored on exit (``with hologram_torch.set_lazy(False): ...``)."""

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
    """Counters: ops recorded, regions run (fused or op by op), fused programs compiled
    (and failed), and the regions' cuts by reason."""
    with _lock:
        return dict(_stats, cuts=dict(_stats["cuts"]))


def reset_stats() -> None:
    with _lock:
        for k in _stats:
            _stats[k] = {} if k == "cuts" else 0


def sync(reason: str = "sync") -> None:
    """Run the pending region (a no-op when nothing is pending)."""
    if _region.nodes:
        with _lock:
            _flush(reason)


# --- recording -----------------------------------------------------------------------

class _Write:
    """A pending node's write into a storage: the view it writes, and what it covers."""

    __slots__ = ("contiguous", "in_place", "node", "numel", "offset", "out", "ref", "sig")

    def __init__(self, sig, node, out, offset, numel, contiguous, ref, in_place):
        self.sig, self.node, self.out = sig, node, out
        self.offset, self.numel, self.contiguous, self.ref = offset, numel, contiguous, ref
        # the node read the memory it writes: its value must not be read by later nodes
        # (a fused program may compute it again, from memory it has overwritten)
        self.in_place = in_place

    def view_of(self, x, sig) -> tuple | None:
        """How ``x`` reads this write's value: ``("v", node, out)`` (the same view),
        ``("w", node, out, offset, shape, strides)`` (a view of a contiguous write), or
        None (the region must be cut first)."""
        if sig == self.sig:
            return ("v", self.node, self.out)
        if not self.contiguous or sig[3] is not self.sig[3]:
            return None
        offset = x.storage_offset() - self.offset
        shape, strides = tuple(x.shape), tuple(x.stride())
        last = offset + sum((n - 1) * s for n, s in zip(shape, strides)) if 0 not in shape \
            else offset
        if offset < 0 or last >= self.numel:
            return None
        return ("w", self.node, self.out, offset, shape, strides)


class _Node:
    __slots__ = ("addresses", "build", "entry", "key", "name", "outs", "static", "wiring")

    def __init__(self, name, key, entry, build, static, wiring, addresses, outs):
        self.name, self.key, self.entry, self.build = name, key, entry, build
        self.static, self.wiring, self.addresses, self.outs = static, wiring, addresses, outs


class _Region:
    def __init__(self) -> None:
        self.nodes: list[_Node] = []
        self.inputs: list[tuple] = []  # the fused program's inputs: ("m", dtype, shape,
        # strides) device memory, ("c", dtype) a CPU scalar, ("n", type) a number
        self.addresses: list[int] = []  # their addresses
        self.keep: list = []  # what must live until the region runs
        self.input_of: dict[tuple, int] = {}  # memory inputs by view
        self.read: set[int] = set()  # storages read from memory
        self.written: dict[int, _Write] = {}  # storages written, by address
        self.superseded: set[tuple[int, int]] = set()  # writes overwritten later


_region = _Region()
_NUMBER_BOX = {bool: ctypes.c_bool, int: ctypes.c_int64, float: ctypes.c_double}


def _sig(x) -> tuple:
    return (x.data_ptr(), x.shape, x.stride(), x.dtype)


def _base(x) -> int:
    return x.data_ptr() - x.storage_offset() * x.element_size()


def _hazard(region: _Region, args, outs, given: bool) -> str | None:
    """Why ``region`` must run before a node reading ``args`` and writing ``outs``."""
    if len(region.nodes) >= MAX_NODES:
        return "size"
    for x in args:
        if hasattr(x, "is_cpu") and not x.is_cpu:
            w = region.written.get(_base(x))
            if w is not None and w.ref() is not None:
                if w.in_place:
                    return "read after in-place write"
                if w.view_of(x, _sig(x)) is None:
                    return "view"
    if given:
        for o in outs:
            sk = _base(o)
            if sk in region.read:
                return "write after read"
            w = region.written.get(sk)
            if w is not None and w.ref() is not None and w.sig != _sig(o):
                return "overlapping write"
    return None


def record(name: str, key: tuple, entry, build, static: tuple, args, outs, given: bool
           ) -> None:
    """Record a launch of ``entry`` (its program computes ``build`` on ``args``) writing
    ``outs``: fresh results, or ``given`` tensors (in-place, ``out=``)."""
    global _region
    with _lock:
        region = _region
        reason = _hazard(region, args, outs, given)
        if reason is not None:
            _flush(reason)
            region = _region
        index = len(region.nodes)
        wiring, addresses = [], []
        for x in args:
            if hasattr(x, "is_cpu"):
                if x.is_cpu:  # a 0-d scalar: its value now, not at the cut
                    x = x.clone()
                    region.keep.append(x)
                    wiring.append(_new_input(region, ("c", x.dtype), x.data_ptr()))
                    addresses.append(x.data_ptr())
                    continue
                sk, sig = _base(x), _sig(x)
                w = region.written.get(sk)
                if w is not None:
                    if w.ref() is not None:
                        wiring.append(w.view_of(x, sig))
                        addresses.append(sig[0])
                        continue
                    del region.written[sk]  # a dead storage's block, used again
                i = region.input_of.get(sig)
                if i is None:
                    i = region.input_of[sig] = len(region.inputs)
                    region.inputs.append(("m", x.dtype, tuple(x.shape), tuple(x.stride())))
                    region.addresses.append(sig[0])
                    region.keep.append(x.untyped_storage())
                region.read.add(sk)
                wiring.append(("i", i))
                addresses.append(sig[0])
            else:
                box = _NUMBER_BOX[type(x)](x)
                region.keep.append(box)
                wiring.append(_new_input(region, ("n", type(x)), ctypes.addressof(box)))
                addresses.append(ctypes.addressof(box))
        node_outs = []
        for j, o in enumerate(outs):
            st = o.untyped_storage()
            sk, sig = st.data_ptr(), _sig(o)
            previous = region.written.get(sk)
            if previous is not None and previous.ref() is not None:
                region.superseded.add((previous.node, previous.out))
            region.written[sk] = _Write(sig, index, j, o.storage_offset(), o.numel(),
                                        o.is_contiguous(), weakref.ref(st), sk in region.read)
            addresses.append(sig[0])
            node_outs.append((sig[0], region.written[sk].ref))
        region.nodes.append(_Node(name, key, entry, build, static, tuple(wiring),
                                  tuple(addresses), tuple(node_outs)))
        _stats["recorded"] += 1


def _new_input(region: _Region, spec: tuple, address: int) -> tuple:
    region.inputs.append(spec)
    region.addresses.append(address)
    return ("i", len(region.inputs) - 1)


# --- running -------------------------------------------------------------------------

class _Memo:
    __slots__ = ("launch", "seen", "state")

    def __init__(self) -> None:
        self.seen = 0
        self.launch = None
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
    live = tuple((i, j) for i, node in enumerate(region.nodes)
                 for j, (_, ref) in enumerate(node.outs)
                 if ref() is not None and (i, j) not in region.superseded)
    key = (tuple((n.key, n.wiring) for n in region.nodes), live)
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
            outs = [region.nodes[i].outs[j][0] for i, j in live]
            memo.launch((*region.addresses, *outs))
            _stats["fused_runs"] += 1
        else:
            for node in region.nodes:
                node.entry.launch(node.addresses)
            _stats["op_by_op_runs"] += 1
            if memo.seen >= 2 and memo.state == "new" and len(region.nodes) > 1:
                memo.state = "compiling"
                _compiler.submit(memo, _plan(region, live))
    except Exception as e:
        names = sorted({n.name for n in region.nodes})
        e.add_note(f"hologram lazy execution: raised while running {len(region.nodes)} "
                   f"recorded ops ({', '.join(names[:12])}{', ...' if len(names) > 12 else ''})"
                   "; HOLOGRAM_LAZY=0 runs op by op and raises at the op itself")
        raise


def _plan(region: _Region, live: tuple) -> tuple:
    """What compiling the region's fused program needs (no tensors, no addresses)."""
    nodes = tuple((n.build, n.static, n.wiring, n.entry.layouts, n.entry.single)
                  for n in region.nodes)
    outputs = tuple((i, j, region.nodes[i].entry.layouts[j][1]) for i, j in live)
    return tuple(region.inputs), nodes, outputs


def fused_program(plan: tuple):
    """The Atlas program of a region (see :func:`_plan`): the nodes' builders on one
    graph, whose inputs are the region's inputs in order and whose outputs are the
    region's live writes in order."""
    from hologram_torch.aten.program import ISA, NUMBER_TYPES, cast

    inputs, nodes, outputs = plan
    g = Graph("region")
    values = []
    ins = []
    for i, spec in enumerate(inputs):
        if spec[0] == "m":
            ins.append(g.strided_input(f"i{i}", ISA[spec[1]], spec[2], spec[3]))
        elif spec[0] == "c":
            ins.append(g.input(f"i{i}", ISA[spec[1]], ()))
        else:
            ins.append(g.input(f"i{i}", NUMBER_TYPES[spec[1]], ()))

    def operand(w):
        if w[0] == "i":
            return ins[w[1]]
        value = values[w[1]][w[2]]
        if w[0] == "v":
            return value
        if not value._contiguous() or value.offset:  # a view of the value's own memory
            value = g.copy(value)
        return value._view(w[4], w[5], w[3])

    for build, static, wiring, layouts, single in nodes:
        result = build(g, *map(operand, wiring), *static)
        results = (result,) if single else tuple(result)
        values.append([cast(r, ISA[layout[3]]) for r, layout in zip(results, layouts)])
    for k, (i, j, strides) in enumerate(outputs):
        g.output(f"o{k}", values[i][j], None if strides is None else tuple(strides))
    return g.program()


class _Compiler:
    """The background thread that compiles regions' fused programs, one at a time."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._pending = 0

    def submit(self, memo: _Memo, plan: tuple) -> None:
        with self._idle:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hologram-lazy",
                                                daemon=True)
                self._thread.start()
        self._queue.put((memo, plan))

    def _run(self) -> None:
        from hologram_torch.aten.program import backend

        while True:
            memo, plan = self._queue.get()
            try:
                compiled = hologram.compile(fused_program(plan), backend())
            except Exception:  # the region keeps running op by op, as it did
                memo.state = "failed"
                _stats["compile_failures"] += 1
            else:
                memo.launch, memo.state = compiled.launch, "ready"
                _stats["compiles"] += 1
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)


_compiler = _Compiler()


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Wait until every fused program submitted so far is compiled (tests, benchmarks);
    False if ``timeout`` seconds passed first."""
    return _compiler.wait(timeout)
