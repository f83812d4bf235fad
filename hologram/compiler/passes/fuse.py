"""Fusion: merge kernels so that a value is materialized only where it must be.

A front end emits one kernel per tensor operation, passing values through temporaries.
This pass removes temporaries with two rewrites, applied until neither applies:

**Inline** — the computation of an elementwise temporary (its store's operand tree holds no
reduction or contraction) is cloned into every kernel that reads it, re-indexed into the
reader's index space by composing the reader's load map with the producer's store map
(reshapes too: a reader's dimension whose step crosses from one of the block's dimensions
into the next is split in two first, see ``_refined``). It is recomputed rather than
stored and reloaded: chains of elementwise ops become one kernel, and elementwise
producers fuse into reductions and into contractions' epilogues (not into their
operands, where they would be recomputed for every product term).

**Merge** — once nothing can be inlined: a kernel that reads a temporary in its producer's
index space (the producer's store map; the domains equal up to dimensions of extent 1 and
trailing unit dimensions) is merged with the producer, at the reader's position or, if
moving the producer down would reorder conflicting memory accesses, at the producer's.
This fuses epilogues into reductions and contractions (bias + activation after a matmul),
chains of reductions over the same rows (softmax, layer norm) into one kernel, and gives a
reduction with several readers its elementwise epilogues as extra outputs. An
elementwise reader over another shape of the same points is reshaped to the producer's
first: its dimensions merged where every access walks them as one, or split into the
block's where it reads the whole block in order and writes it in the same layout (a flat
copy into an output).

**Outputs for temporaries** — last: where a temporary's one writer also stores the same
values through the same map into an output nothing else accesses, the temporary's readers
read the output instead, and the temporary goes.

A temporary read more than once is inlined only at a few reads (:data:`SHARED_READS`)
and while the work it duplicates is small (:data:`SHARED_WORK`): every read recomputes
it.

Inlining goes first so that elementwise values are recomputed from their sources before
merges make their producers reductions. A temporary stays materialized when it is read
in another index space after a reduction, when no position keeps memory accesses in order,
or when merging would nest reductions (per-row results reduced again over the rows: the
rows would stop being a parallel grid) or put two contractions in one kernel (each alone
may be a library call), or when it is read by a ``gather`` (which of its elements are
read is data, so it cannot be recomputed in the reader's index space). A producer's own
gathers inline like its loads: their maps are composed the same way. The producer's
store is kept; the next canonicalize drops it if nothing reads it.

A ``scatter`` is a write whose address is data; along the dimensions where two of its
points may write one element its kernel runs on one thread. Elementwise producers of its
value and offset inline into its kernel when they only move values (loads, gathers,
casts) or the scatter runs in parallel; a producer that computes stays materialized for a
serial scatter, computed on every thread (an embedding's gradient: the layer norm
gradient before it). Kernels holding a scatter are never merged (a merge could put a
reduction into a kernel whose scatter keeps it off the parallel grid, and the verifier
forbids the scattered buffer any other access in the kernel anyway). The kernel counts
as reading the buffer it scatters into (what is left there depends on what was there:
``Kernel.reads``), so the temporary it updates has two writers, the one that filled it
and the scatter, and stays materialized, and no kernel that reads or writes that buffer
moves across it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from itertools import pairwise

from hologram.compiler.options import CompileOptions
from hologram.compiler.passes.canonicalize import drop_stores
from hologram.compiler.passes.coalesce import coalesce_kernel
from hologram.compiler.passes.schedule import grid_rank
from hologram.errors import IRError
from hologram.isa import dtypes as dt
from hologram.isa.body import Body
from hologram.isa.ir import MEMORY_OPS, READ_OPS, WRITE_OPS, IndexMap, Instr, Kernel, Program
from hologram.isa.verify import verify_kernel


def fuse(program: Program, options: CompileOptions | None = None) -> Program:
    """Fuse ``program``'s kernels (a pure function)."""
    return _Fusion(program).run()


class _Fusion:
    """The working state of one fusion: kernels by position (``None`` once merged away),
    and for each buffer the positions of the kernels that read and write it, kept up to
    date as kernels change, so each rewrite costs time in the kernels it touches."""

    def __init__(self, program: Program):
        self.program = program
        self.kernels: list[Kernel | None] = [None] * len(program.kernels)
        self.readers: dict[int, set[int]] = defaultdict(set)
        self.writers: dict[int, set[int]] = defaultdict(set)
        for k, kernel in enumerate(program.kernels):
            self._set(k, kernel)

    def run(self) -> Program:
        temps = [t for t, b in enumerate(self.program.buffers) if b.kind == "temp"]
        # Consumers first: inlining the last temporary of a chain clones one operation,
        # then the one before it, and so on (linear, not quadratic, in the chain length).
        while self._sweep(self._inline, temps[::-1]) or self._sweep(self._merge, temps[::-1]):
            pass
        for t in temps:
            self._into_output(t)
        kernels = tuple(k for k in self.kernels if k is not None)
        if kernels == self.program.kernels:
            return self.program  # the same object: still canonical (canonicalize knows it)
        return self.program.evolve(kernels=kernels)

    def _set(self, k: int, kernel: Kernel | None) -> None:
        old = self.kernels[k]
        if old is not None:
            for b in old.reads():
                self.readers[b].discard(k)
            for b in old.writes():
                self.writers[b].discard(k)
        self.kernels[k] = kernel
        if kernel is not None:
            for b in kernel.reads():
                self.readers[b].add(k)
            for b in kernel.writes():
                self.writers[b].add(k)

    def _valid(self, kernel: Kernel) -> bool:
        # Kernels made here come out of Body, which typed all but their memory accesses.
        try:
            verify_kernel(self.program, kernel, typed=True)
        except IRError:  # e.g. a merged kernel reading and writing one buffer differently
            return False
        return True

    def _sweep(self, rewrite, temps: list[int]) -> bool:
        changed = False
        for t in temps:
            writers, readers = self.writers[t], self.readers[t]
            if len(writers) != 1 or not readers:
                continue
            (p,) = writers
            if min(readers) > p:
                changed |= rewrite(t, p, sorted(readers))
        return changed

    def _conflicts(self, between: range, reads: frozenset, writes: frozenset) -> bool:
        """Would moving accesses (``reads``, ``writes``) across the kernels at positions
        ``between`` reorder a write with another access to the same buffer?"""
        for x in between:
            kernel = self.kernels[x]
            if kernel is not None and (kernel.writes() & (reads | writes)
                                       or kernel.reads() & writes):
                return True
        return False

    def _inline(self, t: int, p: int, readers: list[int]) -> bool:
        producer = self.kernels[p]
        store = producer.body[_store_of(producer, t)]
        part = _slice(producer, store.args[0])
        if any(producer.body[i].op in ("reduce", "contract") for i in part):
            return False
        loaded = frozenset(producer.body[i].buffer for i in part
                           if producer.body[i].op in READ_OPS)
        work = sum(producer.body[i].op not in _MOVES for i in part)
        computes = work > 0
        reads = sum(i.op in READ_OPS and i.buffer == t for c in readers
                    for i in self.kernels[c].body)
        if work and (reads > SHARED_READS or work * (reads - 1) > SHARED_WORK):
            return False  # recomputed at every read: see SHARED_READS
        fused = {}
        for c in readers:
            if self._conflicts(range(p + 1, c + 1), loaded, frozenset()):
                return False
            if _contracts(self.kernels[c], t) and not _widens(producer, part):
                return False
            if computes and _serial_scatter(self.kernels[c]):
                return False  # computed on every thread, not on the scatter's one
            kernel = _inline_into(producer, part, store, self.kernels[c], t)
            if kernel is None or not self._valid(kernel):
                return False
            if computes and _recomputed(kernel) > max(_recomputed(self.kernels[c]),
                                                      RECOMPUTED * math.prod(kernel.domain)):
                return False
            fused[c] = kernel
        for c, kernel in fused.items():
            self._set(c, kernel)
        # Nobody reads t any more: drop its store now, so that a producer left with no
        # stores disappears instead of being inlined into again.
        self._set(p, drop_stores(producer, frozenset({t})))
        return True

    def _into_output(self, t: int) -> None:
        """Where the one kernel that writes temporary ``t`` also stores the same values in
        the same layout into an output nothing else touches (a saved activation that later
        kernels read too: merged copies leave such pairs), the readers read the output and
        ``t`` goes: one write of the block instead of two, and less scratch memory."""
        buffers = self.program.buffers
        if len(self.writers[t]) != 1:
            return
        (p,) = self.writers[t]
        kernel = self.kernels[p]
        if t in kernel.reads():
            return
        mine = [i for i in kernel.body if i.op in WRITE_OPS and i.buffer == t]
        if len(mine) != 1 or mine[0].op != "store":
            return
        store = mine[0]
        size = math.prod(buffers[t].shape)
        for other in kernel.body:
            o = other.buffer if other.op == "store" else None
            if (o is None or buffers[o].kind != "out" or other.args != store.args
                    or other.map != store.map or other.shape != store.shape
                    or self.writers[o] != {p} or self.readers[o]
                    or math.prod(buffers[o].shape) != size):
                continue
            for c in sorted(self.readers[t]):
                body = tuple(replace(i, attrs=(o, *i.attrs[1:]))
                             if i.op in READ_OPS and i.buffer == t else i
                             for i in self.kernels[c].body)
                self._set(c, self.kernels[c].evolve(body=body))
            self._set(p, drop_stores(self.kernels[p], frozenset({t})))
            return

    def _merge(self, t: int, p: int, readers: list[int]) -> bool:
        for c in readers:
            producer, consumer = self.kernels[p], self.kernels[c]
            merged = _merge_pair(producer, consumer, t)
            flat = _flattened(consumer) if merged is None else None
            if flat is not None:
                merged = _merge_pair(producer, flat, t)
            if merged is None:
                store = producer.body[_store_of(producer, t)]
                refit = _refit(flat or consumer, t, store)
                merged = None if refit is None else _merge_pair(producer, refit, t)
            if (merged is None or _nests_reductions(merged) or _contractions(merged) > 1
                    or not self._valid(merged)):
                continue
            between = range(p + 1, c)
            if not self._conflicts(between, producer.reads(), producer.writes()):
                at = c  # move the producer down to the reader
            elif not self._conflicts(between, consumer.reads(), consumer.writes()):
                at = p  # move the reader up to the producer
            else:
                continue
            self._set(c if at == p else p, None)
            self._set(at, merged)
            return True
        return False


#: Instructions that only move values: a producer of nothing else inlines into a scatter.
_MOVES = frozenset({"load", "gather", "const", "cast"})
#: The most computing instructions inlining a temporary may duplicate (its computation
#: times its reads beyond the first); past it, the temporary is stored once. (Recomputing
#: along broadcast dimensions has its own bound: :data:`RECOMPUTED`.) Unbounded, a
#: recurrence (a hidden state's gradient through a recurrent network's time steps) is
#: recomputed from its last step at every step: each step's few instructions inline
#: into the readers of the step before, whose number grows by one a step, so the work is
#: quadratic in the steps (32 steps: kernels of 200 instructions, 1.2 ms of the GRU
#: benchmark's fused training step).
SHARED_WORK = 32
#: The most reads a computed temporary is inlined at (the same reason).
SHARED_READS = 4
#: The most recomputation (:func:`_recomputed`) inlining may leave in a kernel, in
#: instructions per point of its domain. A depthwise convolution's weight gradient
#: recomputed the batch norm and activation gradients before it for each of its 3x3 taps
#: (~13 instructions a point; its kernel took 4.9% of the CNN's recorded step, whose
#: fused program ran in 2.1-2.2 ms, 1.6-1.8 ms with them stored once). A (C,) scale broadcast
#: over (N, C, H, W) recomputes N*C values, not N*C*H*W, and still inlines.
RECOMPUTED = 2


def _recomputed(kernel: Kernel) -> int:
    """How many more computing instructions ``kernel`` runs than kernels of their own
    would: each value broadcast along a dimension (extent 1, more in the domain) outside
    a dimension it varies along is computed again at every step of it (inside only, it
    is the same for all their steps and computed once for them)."""
    extra = 0
    for i in kernel.body:
        if i.op in _MOVES or i.op in MEMORY_OPS or i.op == "index":  # (coordinates: free)
            continue
        times, varies_inside = 1, False
        for n, d in zip(reversed(i.shape), reversed(kernel.domain)):
            if n > 1:
                varies_inside = True
            elif d > 1 and varies_inside:
                times *= d
        extra += (times - 1) * math.prod(i.shape)
    return extra


def _serial_scatter(kernel: Kernel) -> bool:
    """Does ``kernel`` scatter along dimensions that cannot run in parallel (two of their
    points may write one element)?"""
    return (any(i.op == "scatter" for i in kernel.body)
            and grid_rank(kernel) < len(kernel.domain))


def _store_of(kernel: Kernel, t: int) -> int:
    return next(i for i, ins in enumerate(kernel.body) if ins.op == "store" and ins.buffer == t)


def _slice(kernel: Kernel, root: int) -> list[int]:
    """Positions of the instructions ``root`` depends on, in body order."""
    needed = {root}
    for i in range(root, -1, -1):
        if i in needed:
            needed.update(kernel.body[i].args)
    return sorted(needed)


def _conflicts(program: Program, between: range, reads: frozenset, writes: frozenset) -> bool:
    """Would moving accesses (``reads``, ``writes``) across kernels ``between`` reorder a
    write with another access to the same buffer?"""
    return any(
        program.kernels[x].writes() & (reads | writes) or program.kernels[x].reads() & writes
        for x in between
    )


# --- inline ----------------------------------------------------------------------------
def _contracts(consumer: Kernel, t: int) -> bool:
    """Does a contraction of ``consumer`` take a value computed from its loads of ``t``?
    Inlined there, ``t``'s producer would run once per product term (N times for an
    M x K operand of an M x N product) instead of once, and the contraction could no
    longer be a library call: such a temporary stays materialized."""
    tainted: set[int] = set()
    for i, instr in enumerate(consumer.body):
        if (instr.op in READ_OPS and instr.buffer == t) or tainted.intersection(instr.args):
            if instr.op == "contract":
                return True
            tainted.add(i)
    return False


def _widens(producer: Kernel, part: list[int]) -> bool:
    """Is the value ``part`` computes a load of f16/bf16 widened to f32? Such an operand
    of a contraction is inlined: the kernel is then a half-precision product that a
    library multiplies from the half-precision data (``library_calls``), not a copy of
    it at twice the size followed by a float32 product."""
    if len(part) != 2:
        return False
    load, cast = (producer.body[i] for i in part)
    return (load.op == "load" and load.dtype in (dt.float16, dt.bfloat16)
            and cast.op == "cast" and cast.dtype == dt.float32)


def _inline_into(producer: Kernel, part: list[int], store: Instr, consumer: Kernel,
                 t: int) -> Kernel | None:
    body = Body(consumer.domain)
    remap: list[int] = []
    for instr in consumer.body:
        if instr.op == "gather" and instr.buffer == t:
            return None  # which elements it reads is data: t stays materialized
        if instr.op == "load" and instr.buffer == t:
            index = _compose(instr, store)
            if index is None:
                refined = _refined(consumer, instr, store)
                return None if refined is None else _inline_into(producer, part, store,
                                                                 refined, t)
            remap.append(_clone(producer, part, body, index))
        else:
            remap.append(_copy(body, instr, tuple(remap[a] for a in instr.args),
                               consumer.body))
    return consumer.evolve(body=tuple(body.instrs))


def _copy(body: Body, instr: Instr, args: tuple[int, ...],
          source: tuple[Instr, ...] | None = None) -> int:
    """Add ``instr`` with new operands, re-typed where one may now be narrower (always,
    unless ``source``, its kernel's body, is over the domain of ``body``)."""
    if instr.op in MEMORY_OPS:  # declared shapes; a gather's operand may narrow
        return body.add(instr.with_args(args))
    if source is not None:
        return body.copy(instr, args, source)
    return body.make(instr.op, args, instr.attrs, instr.dtype)


def _producer_dims(store: Instr) -> list[int] | None:
    """The stored block's dimensions of extent > 1 by increasing stride, when each one's
    run ends before the next begins (distinct elements at distinct addresses, so an
    address names one index of the block), else None."""
    shape, strides = store.shape, store.map.strides
    dims = sorted((d for d, n in enumerate(shape) if n > 1), key=lambda d: strides[d])
    for a, b in pairwise(dims):
        if strides[a] <= 0 or strides[b] < strides[a] * shape[a]:
            return None
    return None if dims and strides[dims[0]] <= 0 else dims


def _placed(stride: int, dims: list[int], strides: tuple[int, ...]) -> tuple[int, int] | None:
    """(producer dimension, coefficient) of a step of ``stride`` through the block: the
    dimension of the largest stride that divides it."""
    d = next((d for d in reversed(dims) if abs(stride) % strides[d] == 0), None)
    return None if d is None else (d, stride // strides[d])


def _start(load: Instr, store: Instr, dims: list[int]) -> dict[int, int] | None:
    """The block's index at the load's first element, or None if it is none."""
    rest, start = load.map.offset - store.map.offset, {}
    for d in reversed(dims):
        start[d], rest = divmod(rest, store.map.strides[d])
    return None if rest else start


def _compose(load: Instr, store: Instr) -> tuple[dict, dict] | None:
    """Express the consumer's load of a temporary in the producer's index space.

    Returns ``(start, step)``: producer index ``i[d] = start[d] + sum(c * j[e] for e, c in
    step[d])``: each consumer dimension ``e`` that moves through the block moves along one
    producer dimension, ``c`` elements of it a step (several consumer dimensions may share
    one producer dimension: a reshape that splits it). ``None`` when the load is not such
    a view of the stored block (a step that crosses from one of its dimensions into the
    next, or a diagonal); :func:`_refined` may split the consumer's dimensions so that it
    is one.
    """
    shape, smap = store.shape, store.map
    if 0 in shape or 0 in load.shape:
        return None  # an empty block: nothing to recompute, and nothing gained
    dims = _producer_dims(store)
    if dims is None:
        return None
    step: dict[int, list[tuple[int, int]]] = {}
    for e, (n, s) in enumerate(zip(load.shape, load.map.strides)):
        if n == 1 or s == 0:
            continue
        placed = _placed(s, dims, smap.strides)
        if placed is None:
            return None
        step.setdefault(placed[0], []).append((e, placed[1]))
    start = _start(load, store, dims)
    if start is None:
        return None
    for d in dims:
        moves = [c * (load.shape[e] - 1) for e, c in step.get(d, ())]
        low = start[d] + sum(m for m in moves if m < 0)
        high = start[d] + sum(m for m in moves if m > 0)
        if low < 0 or high >= shape[d]:
            return None
    return start, step


def _refined(consumer: Kernel, load: Instr, store: Instr) -> Kernel | None:
    """The elementwise ``consumer`` with one dimension split in two, so that the inner
    part of a step of ``load`` that crossed from one of the block's dimensions into the
    next stays in the first (a ``[batch * heads, seq, head]`` view of a ``[seq, batch,
    heads * head]`` block: the heads step through the last dimension, the batch through
    the one before), or None. :func:`_compose` then tries again."""
    if any(i.op in ("reduce", "contract") for i in consumer.body) or len(consumer.domain) > 7:
        return None
    dims = _producer_dims(store)
    start = None if dims is None or 0 in load.shape else _start(load, store, dims)
    if start is None:
        return None
    for e, (n, s) in enumerate(zip(load.shape, load.map.strides)):
        placed = _placed(s, dims, store.map.strides) if n > 1 and s > 0 else None
        if placed is None:
            continue
        d, c = placed
        inner = store.shape[d] // c
        if (start[d] + c * (n - 1) >= store.shape[d] and store.shape[d] % c == 0
                and start[d] < c and 1 < inner < n and n % inner == 0):
            return _split(consumer, e, inner)
    return None


def _split(kernel: Kernel, e: int, inner: int) -> Kernel | None:
    """``kernel`` (elementwise) over its domain with dimension ``e`` as ``[n // inner,
    inner]``: the same points in the same order. None if an ``index`` reads it."""
    n = kernel.domain[e]

    def split(shape: tuple[int, ...]) -> tuple[int, ...]:
        part = (n // inner, inner) if shape[e] == n else (1, 1)
        return shape[:e] + part + shape[e + 1:]

    body = []
    for instr in kernel.body:
        attrs = instr.attrs
        if instr.op == "index":
            if instr.axis == e:
                return None
            attrs = (instr.axis + (instr.axis > e),)
        elif instr.op in MEMORY_OPS:
            s = instr.map.strides
            strides = s[:e] + (s[e] * inner, s[e]) + s[e + 1:]
            attrs = (instr.buffer, IndexMap(instr.map.offset, strides), *instr.attrs[2:])
        body.append(Instr(instr.op, instr.dtype, split(instr.shape), instr.args, attrs))
    return kernel.evolve(domain=split(kernel.domain), body=tuple(body))


def _clone(producer: Kernel, part: list[int], body: Body, index: tuple[dict, dict]) -> int:
    """Rebuild the producer's instructions ``part`` in the consumer's index space."""
    start, step = index
    rank = len(body.domain)
    remap: dict[int, int] = {}
    for i in part:
        instr = producer.body[i]
        args = tuple(remap[a] for a in instr.args)
        if instr.op in READ_OPS:  # a gather's map moves like a load's; its operand too
            strides, offset, shape = [0] * rank, instr.map.offset, [1] * rank
            for d, (n, s) in enumerate(zip(instr.shape, instr.map.strides)):
                if n == 1:
                    continue
                offset += s * start[d]
                for e, c in step.get(d, ()):
                    strides[e] += c * s
                    shape[e] = body.domain[e]
            imap = IndexMap(offset, tuple(strides))
            remap[i] = body.add(Instr(instr.op, instr.dtype, tuple(shape), args,
                                      (instr.buffer, imap, *instr.attrs[2:])))
        elif instr.op == "index":
            d = instr.axis
            value = body.const(start.get(d, 0), instr.dtype)
            for e, c in step.get(d, ()):
                moving = body.make("index", (), (e,), instr.dtype)
                if c != 1:
                    moving = body.make("mul", (moving, body.const(c, instr.dtype)))
                value = body.make("add", (moving, value))
            remap[i] = value
        else:
            remap[i] = _copy(body, instr, args)
    return remap[part[-1]]


# --- merge -----------------------------------------------------------------------------
def _merge_pair(producer: Kernel, consumer: Kernel, t: int) -> Kernel | None:
    """The producer and the reader of ``t`` as one kernel, or None if they do not share an
    index space (or one of them scatters: see the module docstring)."""
    if t in producer.reads() or any(i.op == "scatter" for k in (producer, consumer)
                                    for i in k.body):
        return None
    rank = max(len(producer.domain), len(consumer.domain))
    producer, consumer = _extend(producer, rank), _extend(consumer, rank)
    domain = []
    for a, b in zip(producer.domain, consumer.domain):
        if a != b and 1 not in (a, b):
            return None
        domain.append(max(a, b))
    domain = tuple(domain)
    if not (_fits(producer, domain) and _fits(consumer, domain)):
        return None
    body = Body(domain)
    remap: list[int] = []
    same = producer.body if producer.domain == domain else None
    for instr in producer.body:
        remap.append(_copy(body, instr, tuple(remap[a] for a in instr.args), same))
    # Loads in a kernel see memory as it was when the kernel started, so the reader must
    # take every buffer the producer writes from the producer's values, not from memory.
    stored = {i.buffer: i for i in producer.body if i.op == "store"}
    remap_store = {b: remap[i.args[0]] for b, i in stored.items()}
    remap = []
    same = consumer.body if consumer.domain == domain else None
    for instr in consumer.body:
        if instr.op == "gather" and instr.buffer in stored:
            return None  # it would read values the merged kernel has not stored yet
        if instr.op == "load" and instr.buffer in stored:
            store = stored[instr.buffer]
            if (instr.shape, instr.map) != (store.shape, store.map):
                return None
            remap.append(remap_store[instr.buffer])
        else:
            remap.append(_copy(body, instr, tuple(remap[a] for a in instr.args), same))
    return Kernel(consumer.name, domain, tuple(body.instrs))


def _flattened(kernel: Kernel) -> Kernel | None:
    """An elementwise kernel with its adjacent dimensions merged where every access walks
    them as one (coalesce's rule), or None when none merge. A bias added to a matrix
    product's rows seen as ``[batch, seq, features]`` (a linear layer on a 3-d input) is
    then an epilogue over the product's own ``[batch * seq, features]``."""
    if 0 in kernel.domain or any(i.op in ("reduce", "contract") for i in kernel.body):
        return None
    flat = coalesce_kernel(kernel.evolve(grid_rank=len(kernel.domain)))
    return None if flat.domain == kernel.domain else flat.evolve(grid_rank=kernel.grid_rank)


def _refit(kernel: Kernel, t: int, store: Instr) -> Kernel | None:
    """An elementwise ``kernel`` that reads the whole block ``store`` wrote, in its order,
    over other dimensions, and stores in the same layout (a flat copy of a ``[seq, batch,
    d]`` block into an output), with its dimensions split into the block's, or None. Only
    a block whose unit dimensions trail lines up with the reader this way."""
    loads = [i for i in kernel.body if i.op in READ_OPS and i.buffer == t]
    if (len(loads) != 1 or loads[0].op != "load" or loads[0].shape != kernel.domain
            or 1 in kernel.domain or loads[0].map.offset != store.map.offset
            or any(i.op in ("reduce", "contract", "scatter") for i in kernel.body)):
        return None
    if any(i.op == "store" and i.map.strides != loads[0].map.strides for i in kernel.body):
        # A copy into another layout (a transposed output) stays a kernel of its own: as
        # a second store of the producer's loops it was slow (attention's head-split
        # kernels 105-124 µs each with their transposed outputs).
        return None
    block = [(n, s) for n, s in zip(store.shape, store.map.strides) if n > 1]
    if store.shape[:len(block)] != tuple(n for n, _ in block):
        return None  # a unit dimension before one that is not
    strides, j = loads[0].map.strides, len(block)
    for e in reversed(range(len(kernel.domain))):
        parts, run, expect = [], 1, strides[e]
        while run < kernel.domain[e]:  # the block's dimensions this one walks, inner first
            j -= 1
            if j < 0 or block[j][1] != expect:
                return None
            parts.append(block[j][0])
            run, expect = run * block[j][0], block[j][1] * block[j][0]
        if run != kernel.domain[e]:
            return None
        for inner in parts[:-1]:
            kernel = _split(kernel, e, inner)
            if kernel is None:
                return None
    return kernel if j == 0 else None


def _contractions(kernel: Kernel) -> int:
    """How many contractions ``kernel`` holds. A merge never puts two in one kernel: each
    alone may be a library call (``library_calls``: one contraction per kernel), and the
    generated loops of several (a weight gradient summed over a recurrent network's time
    steps: 32 products of 192 x 32 x 16 in one loop nest) ran at a tenth of their BLAS
    calls' speed."""
    return sum(i.op == "contract" for i in kernel.body)


def _nests_reductions(kernel: Kernel) -> bool:
    """Would a reduction's result still vary along one of the kernel's loops? (Per-row sums
    merged into a sum over rows: the rows stop being a parallel grid, and every backend
    would need per-grid-point scratch memory for the inner results.)"""
    loops = range(grid_rank(kernel), len(kernel.domain))
    return any(i.op in ("reduce", "contract") and any(i.shape[d] > 1 for d in loops)
               for i in kernel.body)


def _extend(kernel: Kernel, rank: int) -> Kernel:
    """Append unit dimensions so the kernel has ``rank`` dimensions (same meaning)."""
    extra = rank - len(kernel.domain)
    if extra == 0:
        return kernel

    def widen(instr: Instr) -> Instr:
        shape = instr.shape + (1,) * extra
        if instr.op in MEMORY_OPS:
            imap = IndexMap(instr.map.offset, instr.map.strides + (0,) * extra)
            return replace(instr, shape=shape, attrs=(instr.buffer, imap, *instr.attrs[2:]))
        return replace(instr, shape=shape)

    return replace(kernel, domain=kernel.domain + (1,) * extra,
                   body=tuple(map(widen, kernel.body)))


def _fits(kernel: Kernel, domain: tuple[int, ...]) -> bool:
    """Do ``kernel``'s reductions and indices mean the same over the larger ``domain``?
    (They count the domain's extent along their axes, so those extents must not change.)"""
    for instr in kernel.body:
        axes = (instr.axis,) if instr.op == "index" else (
            instr.axes if instr.op in ("reduce", "contract") else ())
        if any(kernel.domain[a] != domain[a] for a in axes):
            return False
    return True
