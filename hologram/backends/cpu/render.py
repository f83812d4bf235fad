"""The CPU renderer: a scheduled Atlas kernel -> one LLVM IR function.

Every kernel becomes ``void @sym(ptr %bufs, i64 %start, i64 %stop)``: ``bufs`` holds one
pointer per program buffer, and the function runs the grid points whose first grid index is
in ``[start, stop)`` (the whole grid point when the kernel has no grid), so the runtime can
split the first grid dimension across threads.

Inside one grid point the kernel's loop dimensions are structured loops:

- a value that varies along no loop dimension (a load at the grid point, a reduction's
  result, arithmetic on those) is computed once per grid point;
- a value that varies along loop dimensions is never stored: it is recomputed inside the
  loop nest of whatever needs it — a reduction (one nest over the reduced axes, with an
  accumulator) or a group of stores (one nest over the dimensions they vary along).

Dependencies are emitted before the nest that uses them, so everything dominates its uses.
A ``scatter`` is made where a store would be, in its nest's loops, one element at a time in
index order (load, combine, store for the modes other than replace): the schedule keeps
every dimension along which two of its writes could meet off the grid, so the loops,
which LLVM may only transform preserving the order of dependent memory accesses, keep
the ISA's order.
A large reduction of a whole domain becomes two functions instead, partials and their
fold, so that the partials run on all threads (:func:`split_parts`). A column sum
(:func:`hologram.codegen.loops.column_tile`: summed values contiguous along the last grid
dimension, strided along the reduced one) sums a tile of grid points at once, row by row,
so that its loads are vectors (:meth:`_KernelRenderer._columns`).
Float sums and contractions accumulate in the operand precision (float32 for f16/bf16) in
vector lanes, blocked, with block sums added in float64 (:data:`LANES`; the error bound is
docs/isa.md's); products accumulate in float64 with ``reassoc`` so their loops vectorize.
Transcendentals come from :mod:`.mathlib` (vectorizable IR, no libm calls); operations
that some CPUs lack (fma, rounding to integers, fmod, half conversions) from
:mod:`.intrinsics`, so that the code calls no runtime library on any target.

Registers: bool is ``i1`` (``i8`` in memory); f16 and bf16 are ``float`` (``i16`` in
memory), rounded to their format by every cast to it: the decompose pass
(:mod:`hologram.compiler.passes.decompose`, run by the backend) has already turned their
inexact arithmetic into f32 (fma: f64) operations and a cast back, and the operations
left on them (neg, abs, sign, min, max, select, compares) are exact. For f16 that is what
LLVM itself does with ``half`` arithmetic on CPUs without AVX512-FP16, but with the
conversions under our control: ``half`` registers would make LLVM call ``__truncdfhf2``
and friends wherever the CPU lacks a conversion, and give results that depend on the host.

:func:`unsupported` says why a kernel cannot be rendered yet (the runtime then runs it on
the reference interpreter): today, a reduction whose result still varies along a loop
dimension (it would need per-grid-point scratch memory).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from hologram.backends.cpu import intrinsics, mathlib
from hologram.backends.cpu import target as targets
from hologram.backends.cpu import textir as ir
from hologram.backends.cpu.target import Target
from hologram.codegen import numerics
from hologram.codegen.loops import (
    BLOCK,
    LANES,
    PART_WORK,
    SHORT_ROW,
    VECTOR,
    Accumulator,
    KernelPlan,
    part_bounds,
    plan,
    split_parts,
    unsupported,
)
from hologram.codegen.mathlib import COMPARISONS
from hologram.codegen.mathlib import F32 as F32_FORMAT
from hologram.codegen.mathlib import F64 as F64_FORMAT
from hologram.errors import CompileError
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import FLOAT_UNARY_OPS, MEMORY_OPS, Instr, Kernel, Program

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F32, F64 = ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType(I8)
KERNEL_TYPE = ir.FunctionType(ir.VoidType(), [PTR.as_pointer(), I64, I64])

_REGISTER = {"bool": I1, "i8": I8, "u8": I8, "i16": I16, "i32": I32, "i64": I64,
             "f16": F32, "bf16": F32, "f32": F32, "f64": F64}
_MEMORY = {**_REGISTER, "bool": I8, "f16": I16, "bf16": I16}
_NARROW = (dt.float16, dt.bfloat16)  # float formats computed in float32
# Vectors per iteration of an innermost loop that calls the math library. LLVM's cost model
# picks one for such long bodies; a single polynomial's dependency chain then stalls the
# loop on every cache miss. Four in flight measured f32 exp, sigmoid and gelu 7-15% faster
# on data in L2 (tanh 2-5%), 1e6 elements on two threads ~10%; 100 elements ~35 ns slower.
MATH_INTERLEAVE = 4
# Vectors in flight in a float max/min reduction's innermost loop. Its step (NaN and
# signed-zero handling around vmaxps: a mask from the sign, two blends, an unordered
# compare) is a chain of dependent instructions, and LLVM's own four accumulators left the
# loop at half a float sum's speed (1e5 f32 on znver4: 8.1 µs against 4.1); eight took it
# to 6.9 µs (sixteen: no faster). max and min are exact in any order: no result changes.
EXTREMUM_INTERLEAVE = 8
# The same where the step is one vmaxps and three integer ops (``_float_extremum``): three
# accumulators per vector, so eight vectors would need 24 registers besides the loads, and
# spilled; four do not (1e5 f32 on Sapphire Rapids: 5.0 µs, 8.5 with the step above).
FAST_EXTREMUM_INTERLEAVE = 4
# Constant trip counts from SHORT_LOOP to 16 * SHORT_LOOP: innermost parallel loops that
# LLVM would unroll whole before vectorizing them are vectorized first (see ``_loop``);
# shorter ones are left to its full unrolling, longer ones it does not unroll whole.
SHORT_LOOP = 16


__all__ = ["EXTREMUM_INTERLEAVE", "FAST_EXTREMUM_INTERLEAVE", "MATH_INTERLEAVE", "PART_WORK",
           "render", "split_parts", "unsupported"]
_FLOAT = {"f32": F32, "f64": F64}


def register_type(t: DType) -> ir.Type:
    return _REGISTER[t.name]


def render(program: Program, symbols: dict[str, str], target: Target | None = None,
           name: str | None = None) -> str:
    """LLVM IR for the kernels named in ``symbols`` (kernel name -> function symbol); a
    kernel that :func:`split_parts` splits gets ``symbol`` and ``symbol + "_final"``.
    ``target`` (default: the current one) decides which operations need our own IR.
    ``name``: the module's (default: the program's)."""
    target = target or targets.current()
    module = ir.Module(name=program.name if name is None else name)
    module.triple = ""  # the target machine decides
    for kernel in program.kernels:
        if kernel.name in symbols:
            symbol = symbols[kernel.name]
            layout = plan(kernel, target.capabilities)
            if layout.parts:
                _KernelRenderer(module, target, program, kernel, layout, symbol,
                                "part").render()
                _KernelRenderer(module, target, program, kernel, layout, symbol + "_final",
                                "final").render()
            else:
                _KernelRenderer(module, target, program, kernel, layout, symbol).render()
    return str(module)


class _AccessGroup(ir.MDValue):
    """An access group: a distinct metadata node without operands (llvmlite writes only
    debug-info nodes as distinct). Its cache key (``textir.MDValue._key``) is itself,
    not its (empty) operands: keyed by operands, every group was one, and each kernel's
    ``llvm.loop.parallel_accesses`` named the module's first kernel's group, so the loops
    of all the other kernels were vectorized with overlap checks, or not at all."""

    def descr(self, buf) -> None:
        buf += ("distinct !{}\n",)

    def _key(self) -> tuple:
        return ("group", id(self))


def independent_iterations(kernel: Kernel) -> bool:
    """May the kernel's loops run their iterations in any order, as far as memory goes?

    Within a call, buffers either do not overlap or coincide element for element (an
    in-place update: an output passed at an input's address with its layout; the SDK and
    the torch device stage every other overlap, docs/architecture.md). So iterations
    depend on each other through memory only where the kernel itself makes them: a buffer
    reached through two different addressings (read at one element, written at another),
    a store that writes one element from several iterations, or a data-dependent access.
    Where none of these occurs, any two iterations touch either different elements or the
    same element of the same buffer in the same iteration."""
    seen: dict[int, tuple] = {}
    for instr in kernel.body:
        if instr.op not in MEMORY_OPS:
            continue
        if instr.op not in ("load", "store"):
            return False
        shape, m = instr.shape, instr.map
        # How the address moves with each domain index (an extent-1 axis does not move).
        addressing = (m.offset, tuple(s if n > 1 else 0 for n, s in zip(shape, m.strides)))
        if seen.setdefault(instr.buffer, addressing) != addressing:
            return False
        if instr.op == "store" and not m.is_injective(shape):
            return False
    return True


def _float_const(t: ir.Type, value: float) -> ir.Constant:
    if math.isnan(value):  # one canonical quiet NaN
        return ir.Constant(t, float("nan"))
    return ir.Constant(t, value)


class _KernelRenderer:
    def __init__(self, module: ir.Module, target: Target, program: Program, kernel: Kernel,
                 layout: KernelPlan, symbol: str, split: str = ""):
        self.module, self.target, self.program, self.kernel = module, target, program, kernel
        # Where each value is computed, which stores share a nest, how each reduction
        # accumulates: decided by the device-neutral lowering (codegen.loops.plan).
        self.plan = layout
        # A split reduction (see split_parts): "part" or "final", with its partial count.
        self.parts, self.split = layout.parts, split
        self.scratch: ir.Value | None = None  # the partials' memory (i8*)
        self.outer: tuple[ir.Value, ir.Value] | None = None  # dimension 0's [start, stop)
        self.fn = ir.Function(module, KERNEL_TYPE, name=symbol)
        self.fn.args[0].add_attribute("noalias")
        entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(entry)
        self.alloca_block = entry
        self.bases: dict[int, ir.Value] = {}
        self.index: dict[int, ir.Value] = {}  # domain dimension -> current index (i64)
        self.hoisted: dict[int, ir.Value] = {}  # values computed before a grid loop
        self.point: dict[int, ir.Value] = {}  # values computed once per grid point
        self.local: dict[int, ir.Value] = {}  # values computed inside the current nest
        self.math_calls = 0  # mathlib calls emitted so far
        self.extremum = 0  # in a float max/min reduction's loops: vectors per iteration
        self.loops_done = 0  # loops emitted so far
        # The access group of the kernel's loads and stores when its loops carry no
        # dependence through memory (see independent_iterations), else None.
        self.group = (_AccessGroup(module, [], name=str(len(module.metadata)))
                      if independent_iterations(kernel) else None)

    # --- structure --------------------------------------------------------------------
    def render(self) -> None:
        b, kernel = self.b, self.kernel
        body_start = self.fn.append_basic_block("start")
        b.branch(body_start)  # the entry block keeps only allocas
        b.position_at_end(body_start)
        for i, buf in enumerate(self.program.buffers):
            if i in kernel.reads() | kernel.writes():
                slot = b.gep(self.fn.args[0], [ir.Constant(I64, i)])
                raw = b.load(slot)
                self.bases[i] = b.bitcast(raw, _MEMORY[buf.dtype.name].as_pointer())
        if self.split:
            slot = b.gep(self.fn.args[0], [ir.Constant(I64, len(self.program.buffers))])
            self.scratch = b.load(slot)
        if self.split == "part":
            start, stop = self.fn.args[1], self.fn.args[2]
            self._loop(stop, self._partial, start=start, dim=-1)
        elif kernel.grid_rank == 0:
            self._grid_point()
        else:
            start, stop = self.fn.args[1], self.fn.args[2]
            self._hoist(0)
            if self.plan.columns and kernel.grid_rank == 1:
                self._columns(start, stop)
            else:
                self._loop(stop, lambda i: self._grid(1), start=start, dim=0)
        b.ret_void()

    def _grid(self, d: int) -> None:
        """The grid loops from dimension ``d`` on (dimension 0 is the caller's range)."""
        if d < self.kernel.grid_rank:
            saved = dict(self.hoisted)
            self._hoist(d)
            extent = ir.Constant(I64, self.kernel.domain[d])
            if self.plan.columns and d == self.kernel.grid_rank - 1:
                self._columns(ir.Constant(I64, 0), extent)
            else:
                self._loop(extent, lambda i: self._grid(d + 1), dim=d)
            self.hoisted = saved
        else:
            self._grid_point()

    def _columns(self, lo: ir.Value, hi: ir.Value) -> None:
        """The grid points ``[lo, hi)`` of the last grid dimension of a column sum
        (:func:`hologram.codegen.loops.column_tile`), a tile of up to ``plan.columns`` at a
        time. The innermost reduced axis goes in blocks of :data:`SHORT_ROW` rows (the
        last block shorter); for each block, a loop over the tile's grid points (which
        LLVM vectorizes: its loads are vectors along the grid) adds the block's rows in
        order into one float32 sum per grid point and reduction, the rows written out one
        after the other (a loop over them would be innermost, and it does not vectorize),
        and adds that sum to the grid point's block sum. Then each grid point's stores,
        from its sums narrowed to their dtypes. Every term is computed in the tile's loop,
        also the values that vary along the grid only."""
        b, kernel = self.b, self.kernel
        g, tile = kernel.grid_rank - 1, self.plan.columns
        sums = [(i, self.plan.accumulator(i)) for i, x in enumerate(kernel.body)
                if x.op == "reduce"]
        axes = list(kernel.body[sums[0][0]].axes)
        inner, rows = axes[-1], kernel.domain[axes[-1]]
        zero = ir.Constant(I64, 0)
        totals = [self._alloca(ir.ArrayType(_FLOAT[a.outer], tile)) for _, a in sums]

        def tile_at(first: ir.Value) -> None:
            end = b.add(first, ir.Constant(I64, tile))
            count = b.sub(b.select(b.icmp_signed("<", end, hi), end, hi), first)

            def each(body: Callable[[ir.Value], None]) -> None:
                def at(j: ir.Value) -> None:  # over the tile's points
                    self.index[g] = b.add(first, j)
                    self.point, self.local = dict(self.hoisted), {}
                    body(j)
                # (no vectorization hint: LLVM vectorizes the sums' loop by itself where
                # it can, and asked to where it cannot, it warns on the user's stderr)
                self._loop(count, at, dim=-2)

            def clear(j: ir.Value) -> None:
                for total, (_, a) in zip(totals, sums):
                    b.store(_float_const(_FLOAT[a.outer], -0.0), b.gep(total, [zero, j]))

            def block(start: ir.Value, size: int) -> None:
                def column(j: ir.Value) -> None:
                    partial = [_float_const(_FLOAT[a.dtype], -0.0) for _, a in sums]
                    for k in range(size):
                        self.index[inner] = b.add(start, ir.Constant(I64, k))
                        self.local = {}
                        for n, (i, a) in enumerate(sums):
                            arg = kernel.body[i].args[0]
                            term = self._widen(self._value(arg), kernel.body[arg].dtype,
                                               _FLOAT[a.dtype])
                            partial[n] = b.fadd(partial[n], term)
                    for total, value in zip(totals, partial):
                        slot = b.gep(total, [zero, j])
                        b.store(b.fadd(b.load(slot), b.fpext(value, slot.type.pointee)), slot)
                each(column)
                self.index.pop(inner, None)

            def row() -> None:
                whole = rows // SHORT_ROW * SHORT_ROW
                if whole:
                    self._loop(ir.Constant(I64, whole), lambda r: block(r, SHORT_ROW),
                               dim=-4, step=SHORT_ROW)
                if rows > whole:
                    block(ir.Constant(I64, whole), rows - whole)

            each(clear)
            self._nest(axes[:-1], row)

            def finish(j: ir.Value) -> None:
                for total, (i, _) in zip(totals, sums):
                    value = b.load(b.gep(total, [zero, j]))
                    self.point[i] = self._narrow(value, value.type, kernel.body[i].dtype)
                self._stores()

            each(finish)
            self.index.pop(g, None)

        self._loop(hi, tile_at, dim=-5, start=lo, step=tile)

    def _hoist(self, level: int) -> None:
        """Emit here, before the grid loop over dimension ``level``, the values the plan
        hoists there (they vary along no dimension from ``level`` on and come from no
        reduction): each is computed once per iteration of the loops it varies along, not
        once per grid point. Left in the loop, a long chain of such uniform values (pow of
        pow of a broadcast operand) sent LLVM's loop vectorizer into its uniformity
        analysis, which walks shared operands again for every path to them: the compile
        never ended."""
        self.point = self.local = self.hoisted
        for i in self.plan.hoisted_at(level):
            self.hoisted[i] = self._emit(self.kernel.body[i])

    def _loop(self, stop: ir.Value, body: Callable[[ir.Value], None], dim: int,
              start: ir.Value | None = None, step: int = 1, lanes: bool = False) -> None:
        """``for i in [start, stop) by step: body(i)``, with ``i`` bound to domain dimension
        ``dim`` (negative: to none). ``lanes``: an elementwise loop over accumulator lanes,
        vectorized but never unrolled first (unrolled, the lanes become scalars that LLVM
        does not put back into vectors)."""
        b = self.b
        start = start if start is not None else ir.Constant(I64, 0)
        before = b.block
        head = self.fn.append_basic_block(f"d{dim}.head")
        inner = self.fn.append_basic_block(f"d{dim}.body")
        done = self.fn.append_basic_block(f"d{dim}.done")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, name=f"i{dim}")
        i.add_incoming(start, before)
        b.cbranch(b.icmp_signed("<", i, stop), inner, done)
        b.position_at_end(inner)
        self.index[dim] = i
        calls, loops = self.math_calls, self.loops_done
        body(i)
        following = b.add(i, ir.Constant(I64, step))
        i.add_incoming(following, b.block)
        back = b.branch(head)
        # Parallel loops are vectorized without runtime overlap checks, which an in-place
        # update (an output at its input's address) fails: 2-4x slower scalar code.
        parallel = ([("llvm.loop.parallel_accesses", self.group)]
                    if self.group is not None and dim >= 0 else [])
        if lanes:
            back.set_metadata("llvm.loop", self._loop_id(
                [("llvm.loop.vectorize.enable", ir.Constant(I1, 1)), *self._vectorize_first()]))
        else:
            innermost = self.loops_done == loops
            interleave = (MATH_INTERLEAVE if innermost and self.math_calls > calls else
                          self.extremum if innermost and self.extremum else None)
            hints = [("llvm.loop.interleave.count", ir.Constant(I32, interleave))] \
                if interleave else []
            if (innermost and parallel and not hints and isinstance(stop, ir.Constant)
                    and SHORT_LOOP <= stop.constant <= 16 * SHORT_LOOP
                    and self._contiguous_along(dim)):
                # A short loop of constant length (a row of a softmax's gradient or of a
                # layer norm) is unrolled whole before the vectorizer sees it, into scalar
                # code that the straight-line vectorizer leaves scalar (it cannot tell the
                # buffers apart). So: vectorized first, the vector loop unrolled after.
                hints += self._vectorize_first()
            if hints or parallel:
                back.set_metadata("llvm.loop", self._loop_id([*hints, *parallel]))
        self.loops_done += 1
        b.position_at_end(done)
        del self.index[dim]

    def _vectorize_first(self) -> list[tuple[str, ir.Value | None]]:
        """Loop hints: not unrolled before LLVM's loop vectorizer runs, the vectorized loop
        unrolled whole after it."""
        m = self.module
        unrolled = m.add_metadata([ir.MetaDataString(m, "llvm.loop.unroll.full")])
        return [("llvm.loop.unroll.disable", None),
                ("llvm.loop.vectorize.followup_vectorized", unrolled)]

    def _contiguous_along(self, dim: int) -> bool:
        """Does every memory access of the kernel step by one element or none along
        ``dim`` (so that a loop over it vectorizes into plain vector loads and stores)?"""
        return all(i.map.strides[dim] in (0, 1) for i in self.kernel.body
                   if i.op in MEMORY_OPS)

    def _loop_id(self, hints: list[tuple[str, ir.Value | None]]) -> ir.MDValue:
        """Loop metadata with ``hints`` (name, value or None) for the vectorizer and the
        unroller: a fresh, self-referential loop ID, as LLVM requires. Math loops ask for
        :data:`MATH_INTERLEAVE` vectors per iteration."""
        m = self.module
        nodes = [m.add_metadata([ir.MetaDataString(m, name)] + ([] if value is None else [value]))
                 for name, value in hints]
        # Not add_metadata, which would give every loop the same (cached) node.
        loop_id = ir.MDValue(m, nodes, name=str(len(m.metadata)))
        loop_id.operands = (loop_id, *nodes)
        return loop_id

    def _nest(self, dims: list[int], body: Callable[[], None]) -> None:
        if not dims:
            body()
            return
        d = dims[0]

        def inner(i: ir.Value) -> None:
            self._nest(dims[1:], body)

        if d == 0 and self.outer is not None:  # a partial of a split reduction
            self._loop(self.outer[1], inner, dim=d, start=self.outer[0])
        else:
            self._loop(ir.Constant(I64, self.kernel.domain[d]), inner, dim=d)

    def _partial(self, p: ir.Value) -> None:
        """Partial ``p`` of a split reduction into the scratch memory: the accumulator at
        ``[p]``, and for argmax/argmin the best flat index at ``[parts + p]`` (i64)."""
        b, body = self.b, self.kernel.body
        n = ir.Constant(I64, self.kernel.domain[0])
        base, extra = part_bounds(self.kernel.domain, self.parts)

        def bound(q: ir.Value) -> ir.Value:
            smaller = b.select(b.icmp_signed("<", q, ir.Constant(I64, extra)), q,
                               ir.Constant(I64, extra))
            start = b.add(b.mul(q, ir.Constant(I64, base)), smaller)
            return b.select(b.icmp_signed("<", start, n), start, n)

        self.outer = (bound(p), bound(b.add(p, ir.Constant(I64, 1))))
        self.point, self.local = {}, {}
        instr = next(x for x in body if x.op in ("reduce", "contract"))
        for a in instr.args:
            self._prepare(a)
        acc, best, acc_type = self._accumulate(instr)
        b.store(acc, b.gep(b.bitcast(self.scratch, acc_type.as_pointer()), [p]))
        if best is not None:
            indices = b.bitcast(self.scratch, I64.as_pointer())
            b.store(best, b.gep(indices, [b.add(p, ir.Constant(I64, self.parts))]))
        self.outer = None

    def _grid_point(self) -> None:
        self.point = dict(self.hoisted)
        self._stores()

    def _stores(self) -> None:
        """The grid point's stores (and scatters), each group in its nest, after the values
        they need that :attr:`point` lacks."""
        body = self.kernel.body
        for dims, stores in self.plan.store_nests:
            for pos in stores:
                for a in body[pos].args:  # a store's value; a scatter's, and its offset
                    self._prepare(a)

            def emit(stores=stores) -> None:
                self.local = {}
                for pos in stores:
                    if body[pos].op == "scatter":
                        self._scatter(body[pos])
                    else:
                        self._store(body[pos])

            self._nest(list(dims), emit)

    def _prepare(self, root: int) -> None:
        """Emit, at grid-point level, every value ``root`` needs that varies along no loop
        dimension (reductions included, and what their operands need), so that loop nests
        only recompute the rest."""
        for i in self.plan.point_values(self.kernel, root, self.point):
            if i not in self.point:
                instr = self.kernel.body[i]
                self.local = self.point
                self.point[i] = self._reduce(instr) if instr.op in ("reduce", "contract") \
                    else self._emit(instr)

    # --- values -----------------------------------------------------------------------
    def _value(self, i: int) -> ir.Value:
        if i in self.point:
            return self.point[i]
        if i not in self.local:
            self.local[i] = self._emit(self.kernel.body[i])
        return self.local[i]

    def _address(self, instr: Instr) -> ir.Value:
        b = self.b
        offset: ir.Value = ir.Constant(I64, instr.map.offset)
        for d, (n, stride) in enumerate(zip(instr.shape, instr.map.strides)):
            if n > 1 and stride:
                offset = b.add(offset, b.mul(self.index[d], ir.Constant(I64, stride)))
        return b.gep(self.bases[instr.buffer], [offset])

    def _gather_address(self, instr: Instr) -> ir.Value:
        """The map's element plus the operand clamped to the gather's (or scatter's)
        bounds (docs/isa.md; the verifier made sure this stays inside the buffer). The
        clamp is on the operand alone, so where it is invariant along the innermost loop
        LLVM hoists it and the accesses there are contiguous (vectorized)."""
        b = self.b
        offset: ir.Value = ir.Constant(I64, instr.map.offset)
        for d, (n, stride) in enumerate(zip(instr.shape, instr.map.strides)):
            if n > 1 and stride:
                offset = b.add(offset, b.mul(self.index[d], ir.Constant(I64, stride)))
        operand = instr.args[-1]  # a gather's only operand; a scatter's second
        at_type = self.kernel.body[operand].dtype
        at = self._int_cast(self._value(operand), register_type(at_type), I64,
                            signed=at_type.kind == "i")
        low, high = (ir.Constant(I64, v) for v in instr.bounds)
        at = b.select(b.icmp_signed("<", at, low), low, at)
        at = b.select(b.icmp_signed(">", at, high), high, at)
        return b.gep(self.bases[instr.buffer], [b.add(offset, at)])

    def _store(self, instr: Instr) -> None:
        value = self._value(instr.args[0])
        self._grouped(self.b.store(self._to_memory(value, instr.dtype), self._address(instr)))

    def _grouped(self, access: ir.Instruction) -> ir.Instruction:
        """``access`` (a buffer's load or store) in the kernel's access group, if any."""
        if self.group is not None:
            access.set_metadata("llvm.access.group", self.group)
        return access

    def _scatter(self, instr: Instr) -> None:
        """One write of a scatter at the current point: the value stored at its element,
        or combined with the element's (add/mul in the register type, f16/bf16 rounded
        once after f32 arithmetic; max/min as the ISA's ops)."""
        t = instr.dtype
        value = self._value(instr.args[0])
        address = self._gather_address(instr)
        if instr.mode != "replace":
            old = self._from_memory(self.b.load(address), t)
            if instr.mode in ("max", "min"):
                value = _minmax(self, [old, value], t, t, instr.mode)
            else:
                value = self._arith(instr.mode, old, value, t, register_type(t))
                if t in _NARROW:
                    value = self._round(value, t)
        self.b.store(self._to_memory(value, t), address)

    def _to_memory(self, value: ir.Value, t: DType) -> ir.Value:
        b = self.b
        if t.is_bool:
            return b.zext(value, I8)
        if t is dt.bfloat16:
            return b.trunc(b.lshr(b.bitcast(value, I32), ir.Constant(I32, 16)), I16)
        if t is dt.float16:
            return intrinsics.f32_to_f16(b, value, self.target)
        return value

    def _from_memory(self, raw: ir.Value, t: DType) -> ir.Value:
        b = self.b
        if t.is_bool:
            return b.icmp_unsigned("!=", raw, ir.Constant(I8, 0))
        if t is dt.bfloat16:
            return b.bitcast(b.shl(b.zext(raw, I32), ir.Constant(I32, 16)), F32)
        if t is dt.float16:
            return intrinsics.f16_to_f32(b, raw, self.target)
        return raw

    def _emit(self, instr: Instr) -> ir.Value:
        op, t = instr.op, instr.dtype
        if op == "load":
            return self._from_memory(self._grouped(self.b.load(self._address(instr))), t)
        if op == "gather":
            return self._from_memory(self.b.load(self._gather_address(instr)), t)
        if op == "const":
            return self._const(instr.value, t)
        if op == "index":
            # A dimension of extent 1 has no loop: its only index is 0.
            index = self.index.get(instr.axis, ir.Constant(I64, 0))
            return self._int_cast(index, I64, register_type(t), signed=True)
        if op in ("reduce", "contract"):
            return self._reduce(instr)
        arg_type = self.kernel.body[instr.args[0]].dtype
        if op in ("div", "mod") and arg_type.is_int and not self._guarded(instr.args[1]):
            raise CompileError(
                f"kernel {self.kernel.name}: integer {op} with an unguarded divisor reached "
                "the cpu renderer; compile through the backend, which runs "
                "compiler.pipeline.for_target (the decompose pass guards 0 and -1)")
        args = [self._value(a) for a in instr.args]
        result = _OPS[op](self, args, arg_type, t)
        if t in _NARROW and op not in _EXACT_NARROW:
            if op != "cast":  # the decompose pass computes them in wider types
                raise CompileError(
                    f"kernel {self.kernel.name}: {op} on {t.name} reached the cpu renderer; "
                    "compile through the backend, which runs compiler.pipeline.for_target "
                    "(the decompose pass computes f16/bf16 arithmetic in f32 or f64)")
            result = self._round(result, t)  # f16/bf16 <- f32: rounded here
        return result

    def _guarded(self, divisor: int) -> bool:
        """Whether an integer divisor is the decompose pass's ``select(bad, 1, y)``, or a
        constant other than 0 and -1: a division by it cannot trap."""
        x = self.kernel.body[divisor]
        if x.op == "const":
            return x.value not in (0, -1)
        one = self.kernel.body[x.args[1]] if x.op == "select" else None
        return one is not None and one.op == "const" and one.value == 1

    def _const(self, value: bool | int | float, t: DType) -> ir.Constant:
        ty = register_type(t)
        if t.is_bool:
            return ir.Constant(I1, int(value))
        if t.is_int:
            return ir.Constant(ty, value)
        return _float_const(ty, value)

    # --- reductions -------------------------------------------------------------------
    def _reduce(self, instr: Instr) -> ir.Value:
        t = self.kernel.body[instr.args[0]].dtype
        kind = "sum" if instr.op == "contract" else instr.kind
        extents = [self.kernel.domain[a] for a in instr.axes]
        if kind == "sum" and math.prod(extents) == 0:
            return self._const(0, t)  # an empty sum is +0.0 (not the -0.0 identity)
        acc, best, acc_type = self._accumulate(instr)
        if best is not None:
            return best
        return self._narrow(acc, acc_type, instr.dtype)

    def _accumulate(self, instr: Instr) -> tuple[ir.Value, ir.Value | None, ir.Type]:
        """(accumulator, best flat index for argmax/argmin else None, accumulator type)
        of a reduction: over its axes (dimension 0 limited to ``self.outer`` when set), or
        in a split reduction's final function, over the partials in order."""
        b, kernel = self.b, self.kernel
        axes = list(instr.axes)
        extents = [kernel.domain[a] for a in axes]
        t = kernel.body[instr.args[0]].dtype
        kind = "sum" if instr.op == "contract" else instr.kind
        plan = self.plan.accumulator(kernel.body.index(instr))
        if plan.blocked:
            return self._float_sum(instr, plan)
        acc_type = register_type(dt.dtype(plan.dtype))
        if kind in ("max", "min") and t.is_float and self.split != "final" and \
                self._unsigned_vector_extrema(acc_type):
            return self._float_extremum(instr, kind, t, acc_type), None, acc_type
        acc = self._alloca(acc_type)
        b.store(self._identity(kind, t, acc_type), acc)
        best = None
        if kind in ("argmax", "argmin"):
            best = self._alloca(I64)
            b.store(ir.Constant(I64, 0), best)

        def fold(value: ir.Value, index: Callable[[], ir.Value]) -> None:
            current = b.load(acc)
            if best is None:
                b.store(self._combine(kind, current, value, t, acc_type), acc)
            else:  # in order, strictly better only: the first occurrence wins
                better = self._better(kind == "argmax", value, current, t)
                b.store(b.select(better, value, current), acc)
                b.store(b.select(better, index(), b.load(best)), best)

        if self.split == "final":
            values = b.bitcast(self.scratch, acc_type.as_pointer())
            indices = b.bitcast(self.scratch, I64.as_pointer())

            def partial(p: ir.Value) -> None:
                at = b.add(p, ir.Constant(I64, self.parts))
                fold(b.load(b.gep(values, [p])), lambda: b.load(b.gep(indices, [at])))

            self._loop(ir.Constant(I64, self.parts), partial, dim=-1)
        else:
            def flat_index() -> ir.Value:
                flat = ir.Constant(I64, 0)
                for a, n in zip(axes, extents):
                    flat = b.add(b.mul(flat, ir.Constant(I64, n)), self.index[a])
                return flat

            def step() -> None:
                values = [self._value(a) for a in instr.args]
                if instr.op == "contract":
                    values = [self._widen(v, t, acc_type) for v in values]
                    value = self._arith("mul", values[0], values[1], t, acc_type)
                else:
                    value = self._widen(values[0], t, acc_type)
                fold(value, flat_index)

            extremum = kind in ("max", "min") and t.is_float
            self._reduction_nest(axes, step, EXTREMUM_INTERLEAVE if extremum else 0)
        return b.load(acc), (b.load(best) if best is not None else None), acc_type

    def _reduction_nest(self, axes: list[int], step: Callable[[], None],
                        interleave: int) -> None:
        """The loops over a reduction's ``axes`` around ``step``, whose values are its own
        (not the grid point's); ``interleave``: the float max/min vectors in flight (0:
        LLVM's choice)."""
        saved_local, self.local = self.local, {}
        self.extremum = interleave
        self._nest(axes, step)
        self.extremum = 0
        self.local = saved_local

    def _unsigned_vector_extrema(self, ty: ir.Type) -> bool:
        """Has the target unsigned max/min of vectors of ``ty``'s width, which
        :meth:`_float_extremum` needs (SSE4.1's ``pmaxud``, AVX-512's ``vpmaxuq``, NEON's
        ``umax`` for 32 bits)? Where LLVM emulates them, its step is slower than
        ``llvm.maximum``'s (1e5 elements, measured: x86-64 f32 1.2x, f64 1.9x; x86-64-v3
        f64 1.3x slower; x86-64-v3 f32 1.4x faster)."""
        if self.target.arch == "aarch64":
            return ty == F32
        return self.target.has("avx512f" if ty == F64 else "sse4.1")

    def _float_extremum(self, instr: Instr, kind: str, t: DType, ty: ir.Type) -> ir.Value:
        """A float max or min over the reduction's axes as three reductions that LLVM
        vectorizes to one ``vmaxps`` (``vminps``) and three integer ops per vector (four for
        min), all in vector registers: ``maxnum`` (``minnum``) told there are no NaNs and
        that the sign of a zero does not matter (``nnan nsz``); the largest magnitude's
        bits (``umax`` of the bits without the sign: above infinity's only if a NaN was
        seen); and the smallest bits of the zero that orders last (``umin`` of the bits,
        or of the bits with the sign flipped for min: 0 only if +0.0, or -0.0 for min, was
        seen). After the loop: NaN if one was seen (its payload is not kept), and a zero result gets
        that zero's sign if it was seen, else the other's. With a NaN, the ``nnan`` result
        is poison; the select after the loop never picks it then. ``llvm.maximum`` is
        exact by itself, but lowered to a max plus blends for NaN and signed zeros: its
        loop took 1.4x as long (docs/performance.md); i1 flags instead of the integer
        reductions live in AVX-512's eight mask registers, which spill."""
        b, largest = self.b, kind == "max"
        bits = ir.IntType(_float_bits(ty))
        sign = 1 << (bits.width - 1)
        infinity = ir.Constant(bits, {32: 0x7F800000, 64: 0x7FF0000000000000}[bits.width])
        extreme, magnitude, zero = self._alloca(ty), self._alloca(bits), self._alloca(bits)
        b.store(self._identity(kind, t, ty), extreme)
        b.store(ir.Constant(bits, 0), magnitude)
        b.store(ir.Constant(bits, (1 << bits.width) - 1), zero)
        suffix = "f32" if ty == F32 else "f64"
        extremum = intrinsics.declare(self.module, f"{'maxnum' if largest else 'minnum'}."
                                      f"{suffix}", ty, [ty, ty])

        def step() -> None:
            value = self._widen(self._value(instr.args[0]), t, ty)
            b.store(b.call(extremum, [b.load(extreme), value], fastmath=("nnan", "nsz")),
                    extreme)
            raw = b.bitcast(value, bits)
            without_sign = b.and_(raw, ir.Constant(bits, sign - 1))
            b.store(self._intrinsic("umax", bits, [b.load(magnitude), without_sign]),
                    magnitude)
            last = raw if largest else b.xor(raw, ir.Constant(bits, sign))
            b.store(self._intrinsic("umin", bits, [b.load(zero), last]), zero)

        self._reduction_nest(list(instr.axes), step, FAST_EXTREMUM_INTERLEAVE)
        result = b.load(extreme)
        seen = b.icmp_unsigned("==", b.load(zero), ir.Constant(bits, 0))
        winner, other = (0.0, -0.0) if largest else (-0.0, 0.0)
        signed = b.select(seen, _float_const(ty, winner), _float_const(ty, other))
        result = b.select(b.fcmp_ordered("==", result, _float_const(ty, 0.0)), signed, result)
        nan = b.icmp_unsigned(">", b.load(magnitude), infinity)
        return b.select(nan, _float_const(ty, math.nan), result)

    def _float_sum(self, instr: Instr, plan: Accumulator) -> tuple[ir.Value, None, ir.Type]:
        """A float sum or contraction as :data:`LANES` accumulators per block of
        :data:`BLOCK` (see :mod:`hologram.codegen.loops`): ``(sum, None, its type)``."""
        b, kernel = self.b, self.kernel
        t = kernel.body[instr.args[0]].dtype
        lane_type, wide = _FLOAT[plan.dtype], _FLOAT[plan.outer]
        outer = _BlockSums(self, wide, compensated=plan.compensated)
        if self.split == "final":
            values = b.bitcast(self.scratch, wide.as_pointer())
            self._loop(ir.Constant(I64, self.parts),
                       lambda p: outer.add(b.load(b.gep(values, [p]))), dim=-1)
            return outer.result(), None, wide
        axes = list(instr.axes)
        inner = axes[-1]
        saved_local = self.local

        def term() -> ir.Value:  # emitted afresh in each loop body that adds terms
            self.local = {}
            values = [self._value(a) for a in instr.args]
            if instr.op == "contract":  # exact for f16/bf16 (22 or 16 significant bits)
                return self._arith("mul", values[0], values[1], t, lane_type)
            return values[0]

        def row() -> None:
            if inner == 0 and self.outer is not None:  # a partial of a split reduction
                self._blocks(inner, *self.outer, term, lane_type, outer)
            elif kernel.domain[inner] <= SHORT_ROW:
                acc = self._alloca(lane_type)
                b.store(_float_const(lane_type, -0.0), acc)
                self._loop(ir.Constant(I64, kernel.domain[inner]),
                           lambda i: b.store(b.fadd(b.load(acc), term()), acc), dim=inner)
                outer.add(b.load(acc))
            else:
                self._blocks(inner, ir.Constant(I64, 0), ir.Constant(I64, kernel.domain[inner]),
                             term, lane_type, outer)

        self._nest(axes[:-1], row)
        self.local = saved_local
        return outer.result(), None, wide

    def _blocks(self, dim: int, lo: ir.Value, hi: ir.Value, term: Callable[[], ir.Value],
                lane_type: ir.Type, outer: _BlockSums) -> None:
        """Add the terms at indices ``[lo, hi)`` of dimension ``dim`` into ``outer``, one
        block of :data:`BLOCK` at a time (the order docs/isa.md states): term ``i`` of a
        block goes to lane ``i % LANES`` (in order, no reassociation), and the lanes are
        added as a balanced tree. The lane loops are elementwise, so LLVM vectorizes them
        without fast-math.

        The lanes are ``LANES / VECTOR`` arrays of one vector register each: LLVM keeps a
        small array in a register (a larger one stays in memory), and the arrays are
        independent chains of additions, so the loop is not bound by the latency of one
        vector addition. A short block's whole vectors after its last group of ``LANES``
        go to one more array of ``VECTOR`` lanes (adding them to the first arrays instead
        measured 20% slower on 1e6 terms), its last ``< VECTOR`` terms to one sequential
        sum."""
        b = self.b
        groups = LANES // VECTOR
        arrays = [self._alloca(ir.ArrayType(lane_type, VECTOR)) for _ in range(groups + 1)]
        zero = ir.Constant(I64, 0)

        def lane(j: int, k: ir.Value) -> ir.Value:
            return b.gep(arrays[j], [zero, k])

        # Arrays are cleared and read whole (one aggregate store or load each, which SROA
        # splits into the lanes): a sixth of the IR lane by lane took to render and compile.
        cleared = ir.Constant(arrays[0].type.pointee, [_float_const(lane_type, -0.0)] * VECTOR)

        def clear(js: range) -> None:
            for j in js:
                b.store(cleared, arrays[j])

        def add_vector(j: int, first: ir.Value) -> None:  # array j += terms [first, +VECTOR)
            def add(k: ir.Value) -> None:
                self.index[dim] = b.add(first, k)
                b.store(b.fadd(b.load(lane(j, k)), term()), lane(j, k))
            self._loop(ir.Constant(I64, VECTOR), add, dim=-2, lanes=True)

        def tree(js: range) -> ir.Value:
            loaded = [b.load(arrays[j]) for j in js]
            sums = [b.extract_value(array, k) for array in loaded for k in range(VECTOR)]
            while len(sums) > 1:
                half = len(sums) // 2
                sums = [b.fadd(sums[k], sums[k + half]) for k in range(half)]
            return sums[0]

        tail = self._alloca(lane_type)

        def tail_add(i: ir.Value) -> None:
            self.index[dim] = i
            b.store(b.fadd(b.load(tail), term()), tail)

        def group(g: ir.Value) -> None:
            for j in range(groups):
                add_vector(j, b.add(g, ir.Constant(I64, j * VECTOR)))

        def whole_block(start: ir.Value) -> None:
            # BLOCK is a multiple of LANES: no further vectors, no tail (adding their -0.0
            # sums would change no bit), and a constant trip count for the group loop.
            clear(range(groups))
            self._loop(b.add(start, ir.Constant(I64, BLOCK)), group, dim=-3, start=start,
                       step=LANES)
            outer.add(tree(range(groups)))

        def short_block(start: ir.Value, size: int | None) -> None:
            # ``size``: the block's length where the row's is a constant. Its parts that
            # get no term are left out: their sums would be -0.0, which adds no bit to
            # the outer sum (nor to its compensation's test), and a row shorter than
            # BLOCK renders and compiles in about a third of the IR.
            parts = (True, True, True) if size is None else \
                (size >= LANES, size % LANES >= VECTOR, size % VECTOR > 0)
            clear(range(0 if parts[0] else groups, groups + parts[1]))
            full = b.add(start, b.and_(b.sub(hi, start), ir.Constant(I64, -LANES)))
            vectors = b.add(start, b.and_(b.sub(hi, start), ir.Constant(I64, -VECTOR)))
            if parts[0]:
                self._loop(full, group, dim=-3, start=start, step=LANES)
                outer.add(tree(range(groups)))
            if parts[1]:
                self._loop(vectors, lambda v: add_vector(groups, v), dim=-3, start=full,
                           step=VECTOR)
                outer.add(tree(range(groups, groups + 1)))
            if parts[2]:
                # The last (< VECTOR) terms in order, apart: a variable lane index would
                # keep the lanes in memory instead of vector registers.
                b.store(_float_const(lane_type, -0.0), tail)
                self._loop(b.sub(hi, vectors), lambda j: tail_add(b.add(vectors, j)),
                           dim=-2)
                outer.add(b.load(tail))

        # The whole blocks, then the short one (if any) at the end of the range; where the
        # range is constant, only those that it has.
        length = (hi.constant - lo.constant
                  if isinstance(lo, ir.Constant) and isinstance(hi, ir.Constant) else None)
        whole = b.add(lo, b.and_(b.sub(hi, lo), ir.Constant(I64, -BLOCK)))
        if length is None or length >= BLOCK:
            self._loop(whole, whole_block, dim=-4, start=lo, step=BLOCK)
        if length is None:
            with b.if_then(b.icmp_signed("<", whole, hi)):
                short_block(whole, None)
        elif length % BLOCK:
            short_block(whole, length % BLOCK)
        self.index.pop(dim, None)

    def _alloca(self, ty: ir.Type) -> ir.Value:
        with self.b.goto_block(self.alloca_block):
            self.b.position_at_start(self.alloca_block)
            return self.b.alloca(ty)

    def _identity(self, kind: str, t: DType, ty: ir.Type) -> ir.Constant:
        if kind == "sum":
            return _float_const(ty, -0.0) if t.is_float else ir.Constant(ty, 0)
        if kind == "prod":
            return _float_const(ty, 1.0) if t.is_float else ir.Constant(ty, 1)
        largest = kind in ("min", "argmin")
        if t.is_bool:
            return ir.Constant(I1, int(largest))
        return self._const(t.max if largest else t.min, t)

    def _combine(self, kind: str, acc: ir.Value, value: ir.Value, t: DType,
                 ty: ir.Type) -> ir.Value:
        b = self.b
        if kind in ("sum", "prod"):
            if t.is_float:
                op = b.fadd if kind == "sum" else b.fmul
                return op(acc, value, flags=("reassoc",))
            return (b.add if kind == "sum" else b.mul)(acc, value)
        return _minmax(self, [acc, value], t, t, kind)

    def _better(self, largest: bool, value: ir.Value, best: ir.Value, t: DType) -> ir.Value:
        """Does ``value`` replace ``best`` (first occurrence wins; NaN is the extreme;
        -0.0 < +0.0, as the max/min reductions order them)?"""
        b = self.b
        if not t.is_float:
            if t.is_bool:
                return b.icmp_unsigned(">" if largest else "<", value, best)
            pred = ">" if largest else "<"
            cmp = b.icmp_unsigned if t.kind == "u" else b.icmp_signed
            return cmp(pred, value, best)
        nan_value = b.fcmp_unordered("uno", value, value)
        nan_best = b.fcmp_unordered("uno", best, best)
        strictly = b.fcmp_ordered(">" if largest else "<", value, best)
        zeros = b.and_(b.fcmp_ordered("==", value, _float_const(value.type, 0.0)),
                       b.fcmp_ordered("==", best, _float_const(value.type, 0.0)))
        sign_value, sign_best = self._signbit(value), self._signbit(best)
        by_sign = b.and_(sign_best, b.not_(sign_value)) if largest else \
            b.and_(sign_value, b.not_(sign_best))
        return b.or_(b.and_(nan_value, b.not_(nan_best)),
                     b.and_(b.not_(nan_best), b.or_(strictly, b.and_(zeros, by_sign))))

    def _signbit(self, x: ir.Value) -> ir.Value:
        bits = ir.IntType(_float_bits(x.type))
        return self.b.icmp_signed("<", self.b.bitcast(x, bits), ir.Constant(bits, 0))

    def _widen(self, value: ir.Value, t: DType, ty: ir.Type) -> ir.Value:
        return self.b.fpext(value, ty) if value.type != ty else value

    def _narrow(self, value: ir.Value, ty: ir.Type, t: DType) -> ir.Value:
        target = register_type(t)
        if ty == target:
            return value
        if t in _NARROW:
            return self._round(value, t) if ty == F32 else self._f64_to_narrow(value, t)
        return self.b.fptrunc(value, target)

    def _f64_to_narrow(self, x: ir.Value, t: DType) -> ir.Value:
        """Round a double once to f16 or bf16 (in a float register): first to float32
        rounded to odd (:func:`hologram.codegen.numerics.round_to_odd`)."""
        odd = numerics.round_to_odd(mathlib.LLVMEmitter(self.b, F64_FORMAT, self.target), x)
        return self._round(odd, t)

    def _round(self, x: ir.Value, t: DType) -> ir.Value:
        """A float32 rounded to the nearest f16 or bf16 (ties to even), kept in float32."""
        if t is dt.float16:
            return intrinsics.f16_to_f32(self.b, intrinsics.f32_to_f16(self.b, x, self.target),
                                         self.target)
        return self._round_bf16(x)

    # --- helpers for the op table -----------------------------------------------------
    def _arith(self, op: str, x: ir.Value, y: ir.Value, t: DType, ty: ir.Type) -> ir.Value:
        b = self.b
        if t.is_float:
            return {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}[op](x, y)
        return {"add": b.add, "sub": b.sub, "mul": b.mul}[op](x, y)

    def _math(self, name: str, args: list[ir.Value]) -> ir.Value:
        self.math_calls += 1
        return self.b.call(mathlib.get(self.module, name, args[0].type, self.target), args)

    def _intrinsic(self, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
        if ret in (F32, F64):
            return intrinsics.call(self.b, name, args, self.target)
        fn = intrinsics.declare(self.module, f"{name}.i{ret.width}", ret, [a.type for a in args])
        return self.b.call(fn, args)

    def _round_bf16(self, x: ir.Value) -> ir.Value:
        """Round a float32 to the nearest bf16 (:func:`hologram.codegen.numerics.round_bf16`)."""
        return numerics.round_bf16(mathlib.LLVMEmitter(self.b, F32_FORMAT, self.target), x)

    def _int_cast(self, x: ir.Value, src: ir.Type, dst: ir.Type, signed: bool) -> ir.Value:
        if src.width == dst.width:
            return x
        if src.width > dst.width:
            return self.b.trunc(x, dst)
        return self.b.sext(x, dst) if signed else self.b.zext(x, dst)


class _BlockSums:
    """Block sums added in order in ``ty``: plainly when it is wider than the blocks
    (float64 keeps 29 more bits than a float32 block sum has, so up to 2**29 additions
    cost less than one float32 rounding), else compensated (Neumaier's variant)."""

    def __init__(self, r: _KernelRenderer, ty: ir.Type, compensated: bool):
        self.r, self.b, self.ty = r, r.b, ty
        self.sum = r._alloca(ty)
        self.b.store(_float_const(ty, -0.0), self.sum)
        self.error = r._alloca(ty) if compensated else None
        if self.error is not None:
            self.b.store(_float_const(ty, 0.0), self.error)

    def add(self, value: ir.Value) -> None:
        b, ty = self.b, self.ty
        value = b.fpext(value, ty) if value.type != ty else value
        s = b.load(self.sum)
        total = b.fadd(s, value)
        if self.error is not None:
            fabs = [self.r._intrinsic("fabs", ty, [x]) for x in (s, value)]
            bigger = b.fcmp_ordered(">=", *fabs)
            lost = b.select(bigger, b.fadd(b.fsub(s, total), value),
                            b.fadd(b.fsub(value, total), s))
            b.store(b.fadd(b.load(self.error), lost), self.error)
        b.store(total, self.sum)

    def result(self) -> ir.Value:
        b = self.b
        s = b.load(self.sum)
        if self.error is None:
            return s
        c = b.load(self.error)
        # The plain sum where nothing was lost (keeps -0.0) or it is not finite (inf - inf).
        keep = b.or_(b.fcmp_ordered("==", c, _float_const(self.ty, 0.0)),
                     b.fcmp_unordered("uno", b.fsub(s, s), b.fsub(s, s)))
        return b.select(keep, s, b.fadd(s, c))


def _float_bits(ty: ir.Type) -> int:
    return {F32: 32, F64: 64}[ty]


# --- the op table ----------------------------------------------------------------------
# Each entry: (renderer, operand values, operand dtype, result dtype) -> value.
def _add_sub_mul(op: str):
    def emit(r: _KernelRenderer, args, a: DType, t: DType) -> ir.Value:
        return r._arith(op, args[0], args[1], a, register_type(a))
    return emit


# Integer div/mod: the decompose pass has replaced a divisor of 0 (signed: or -1) by 1 and
# selects the ISA's results there, so the instruction never traps (_emit checks the form).
def _div(r: _KernelRenderer, args, a: DType, t: DType) -> ir.Value:
    if a.is_float:
        return r.b.fdiv(*args)
    return (r.b.udiv if a.kind == "u" else r.b.sdiv)(*args)


def _mod(r: _KernelRenderer, args, a: DType, t: DType) -> ir.Value:
    if a.is_float:
        return intrinsics.fmod(r.b, *args)
    return (r.b.urem if a.kind == "u" else r.b.srem)(*args)


def _minmax(r: _KernelRenderer, args, a: DType, t: DType, kind: str | None = None,
            op: str | None = None) -> ir.Value:
    b = r.b
    largest = (kind or op) in ("max", "argmax")
    x, y = args
    if a.is_float:
        return r._intrinsic("maximum" if largest else "minimum", x.type, [x, y])
    if a.is_bool:
        return b.or_(x, y) if largest else b.and_(x, y)
    prefix = "u" if a.kind == "u" else "s"
    return r._intrinsic(f"{prefix}{'max' if largest else 'min'}", x.type, [x, y])


def _logic(op: str):
    def emit(r: _KernelRenderer, args, a: DType, t: DType) -> ir.Value:
        return {"and": r.b.and_, "or": r.b.or_, "xor": r.b.xor}[op](*args)
    return emit


def _compare(op: str):
    def emit(r: _KernelRenderer, args, a: DType, t: DType) -> ir.Value:
        b = r.b
        if a.is_float:  # ordered compares are false on NaN; != is true on NaN
            return (b.fcmp_unordered if op == "ne" else b.fcmp_ordered)(COMPARISONS[op], *args)
        cmp = b.icmp_signed if a.kind == "i" else b.icmp_unsigned
        return cmp(COMPARISONS[op], *args)
    return emit


def _unary_int_or_float(op: str):
    def emit(r: _KernelRenderer, args, a: DType, t: DType) -> ir.Value:
        b = r.b
        (x,) = args
        ty = x.type
        if op == "neg":
            return b.fneg(x) if a.is_float else b.neg(x)
        if op == "not":
            return b.not_(x)
        if op == "abs":
            if a.is_float:
                return r._intrinsic("fabs", ty, [x])
            if a.kind == "u":
                return x
            return b.select(b.icmp_signed("<", x, ir.Constant(ty, 0)), b.neg(x), x)
        # sign: 1, -1, or x itself (±0, NaN)
        if a.is_float:
            one, minus = _float_const(ty, 1.0), _float_const(ty, -1.0)
            return b.select(b.fcmp_ordered(">", x, _float_const(ty, 0.0)), one,
                            b.select(b.fcmp_ordered("<", x, _float_const(ty, 0.0)), minus, x))
        zero = ir.Constant(ty, 0)
        positive = b.zext(b.icmp_unsigned("!=", x, zero) if a.kind == "u"
                          else b.icmp_signed(">", x, zero), ty)
        if a.kind == "u":
            return positive
        return b.sub(positive, b.zext(b.icmp_signed("<", x, zero), ty))
    return emit


def _float_unary(op: str):
    intrinsic = {"sqrt": "sqrt", "floor": "floor", "ceil": "ceil", "trunc": "trunc",
                 "round": "roundeven"}.get(op)

    def emit(r: _KernelRenderer, args, a: DType, t: DType) -> ir.Value:
        b = r.b
        (x,) = args
        if intrinsic is not None:
            return r._intrinsic(intrinsic, x.type, [x])
        if op == "rsqrt":
            root = r._intrinsic("sqrt", x.type, [x])
            return b.fdiv(_float_const(x.type, 1.0), root)
        return r._math(op, [x])  # f16 and bf16 through the f32 library
    return emit


def _pow(r: _KernelRenderer, args, a: DType, t: DType) -> ir.Value:
    return r._math("pow", args)


def _fma(r: _KernelRenderer, args, a: DType, t: DType) -> ir.Value:
    return r._intrinsic("fma", args[0].type, args)


def _select(r: _KernelRenderer, args, a: DType, t: DType) -> ir.Value:
    return r.b.select(*args)


def _cast(r: _KernelRenderer, args, a: DType, t: DType) -> ir.Value:
    b = r.b
    (x,) = args
    src, dst = x.type, register_type(t)
    if a is t:
        return x
    if t.is_bool:
        if a.is_float:
            return b.fcmp_unordered("!=", x, _float_const(src, 0.0))  # NaN -> true
        return b.icmp_unsigned("!=", x, ir.Constant(src, 0))
    if a.is_bool:
        return b.uitofp(x, dst) if t.is_float else b.zext(x, dst)
    if t in _NARROW and (a is dt.float64 or (a.is_int and a.bits >= 32)):
        # Through f32 would round twice; through f64 and round-to-odd rounds once.
        if a.is_float:
            wide = x
        elif a.bits > 53:
            wide = _int_to_f64_sticky(r, x, signed=a.kind == "i")
        else:
            wide = (b.uitofp if a.kind == "u" else b.sitofp)(x, F64)
        return r._f64_to_narrow(wide, t)
    if a.is_float and t.is_float:
        if _float_bits(src) < _float_bits(dst):
            return b.fpext(x, dst)
        return b.fptrunc(x, dst) if src != dst else x  # f16/bf16 <- f32: rounded by _emit
    if a.is_float:  # saturating, NaN -> 0
        name = "fptoui.sat" if t.kind == "u" else "fptosi.sat"
        suffix = "f32" if src == F32 else "f64"
        return b.call(intrinsics.declare(r.module, f"{name}.i{dst.width}.{suffix}", dst, [src]),
                      [x])
    if t.is_float:
        return (b.uitofp if a.kind == "u" else b.sitofp)(x, dst)
    return r._int_cast(x, src, dst, signed=a.kind == "i")


def _int_to_f64_sticky(r: _KernelRenderer, x: ir.Value, signed: bool) -> ir.Value:
    """A 64-bit integer as a double that rounds to f16 or bf16 as the integer itself does.
    A plain conversion rounds magnitudes of 2**53 and more a first time (2**56 + 2**48 + 1
    becomes the bf16 midpoint 2**56 + 2**48, then 2**56); here their low 11 bits are ORed
    into bit 11 (a sticky bit far below the narrow formats' last), which leaves at most 53
    significant bits: the conversion is exact."""
    b = r.b
    i64 = ir.IntType(64)
    negative = b.icmp_signed("<", x, ir.Constant(i64, 0)) if signed else None
    # |x| as unsigned (the most negative value's magnitude 2**63 too)
    magnitude = b.select(negative, b.sub(ir.Constant(i64, 0), x), x) if signed else x
    low = b.and_(magnitude, ir.Constant(i64, 0x7FF))
    sticky = b.shl(b.zext(b.icmp_unsigned("!=", low, ir.Constant(i64, 0)), i64),
                   ir.Constant(i64, 11))
    cut = b.or_(b.and_(magnitude, ir.Constant(i64, ~0x7FF)), sticky)
    big = b.icmp_unsigned(">=", magnitude, ir.Constant(i64, 2**53))
    value = b.uitofp(b.select(big, cut, magnitude), F64)
    return b.select(negative, b.fneg(value), value) if signed else value


# f16/bf16 results these ops produce are already exact in the format (no rounding needed);
# the inexact ones reach the renderer as f32 (or f64) operations and a cast back
# (compiler/passes/decompose.py), which is rounded.
_EXACT_NARROW = frozenset({"neg", "abs", "select", "min", "max", "sign"})

_OPS: dict[str, Callable] = {
    "add": _add_sub_mul("add"), "sub": _add_sub_mul("sub"), "mul": _add_sub_mul("mul"),
    "div": _div, "mod": _mod,
    "min": lambda r, args, a, t: _minmax(r, args, a, t, op="min"),
    "max": lambda r, args, a, t: _minmax(r, args, a, t, op="max"),
    "pow": _pow, "and": _logic("and"), "or": _logic("or"), "xor": _logic("xor"),
    **{op: _compare(op) for op in COMPARISONS},
    **{op: _unary_int_or_float(op) for op in ("abs", "neg", "not", "sign")},
    **{op: _float_unary(op) for op in FLOAT_UNARY_OPS},
    "fma": _fma, "select": _select, "cast": _cast,
}
