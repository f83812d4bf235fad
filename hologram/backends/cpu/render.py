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
so that its loads are vectors (:meth:`KernelRenderer._columns`).
Reductions are :mod:`.reduce`'s (float sums and contractions blocked in vector lanes,
products in float64, max/min and argmax/argmin exact), every other instruction comes from
the op table (:mod:`.ops`), and each dtype's register and memory types from :mod:`.values`.
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

from collections.abc import Callable

from hologram.backends.cpu import intrinsics, mathlib
from hologram.backends.cpu import target as targets
from hologram.backends.cpu import textir as ir
from hologram.backends.cpu.ops import EXACT_NARROW, OPS, minmax
from hologram.backends.cpu.reduce import Reductions
from hologram.backends.cpu.target import Target
from hologram.backends.cpu.values import (
    F32,
    F64,
    FLOAT,
    I1,
    I8,
    I16,
    I32,
    I64,
    MEMORY,
    NARROW,
    PTR,
    float_const,
    register_type,
)
from hologram.codegen import numerics
from hologram.codegen.loops import (
    PART_WORK,
    SHORT_ROW,
    KernelPlan,
    part_bounds,
    plan,
    split_parts,
    unsupported,
)
from hologram.codegen.mathlib import F32 as F32_FORMAT
from hologram.codegen.mathlib import F64 as F64_FORMAT
from hologram.errors import CompileError
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import MEMORY_OPS, Instr, Kernel, Program

KERNEL_TYPE = ir.FunctionType(ir.VoidType(), [PTR.as_pointer(), I64, I64])

# Vectors per iteration of an innermost loop that calls the math library. LLVM's cost model
# picks one for such long bodies; a single polynomial's dependency chain then stalls the
# loop on every cache miss. Four in flight measured f32 exp, sigmoid and gelu 7-15% faster
# on data in L2 (tanh 2-5%), 1e6 elements on two threads ~10%; 100 elements ~35 ns slower.
MATH_INTERLEAVE = 4
# Constant trip counts from SHORT_LOOP to 16 * SHORT_LOOP: innermost parallel loops that
# LLVM would unroll whole before vectorizing them are vectorized first (see ``_loop``);
# shorter ones are left to its full unrolling, longer ones it does not unroll whole.
SHORT_LOOP = 16


__all__ = ["MATH_INTERLEAVE", "PART_WORK", "render", "split_parts", "unsupported"]


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
                KernelRenderer(module, target, program, kernel, layout, symbol,
                                "part").render()
                KernelRenderer(module, target, program, kernel, layout, symbol + "_final",
                                "final").render()
            else:
                KernelRenderer(module, target, program, kernel, layout, symbol).render()
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


class KernelRenderer(Reductions):
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
                self.bases[i] = b.bitcast(raw, MEMORY[buf.dtype.name].as_pointer())
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
        totals = [self._alloca(ir.ArrayType(FLOAT[a.outer], tile)) for _, a in sums]

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
                    b.store(float_const(FLOAT[a.outer], -0.0), b.gep(total, [zero, j]))

            def block(start: ir.Value, size: int) -> None:
                def column(j: ir.Value) -> None:
                    partial = [float_const(FLOAT[a.dtype], -0.0) for _, a in sums]
                    for k in range(size):
                        self.index[inner] = b.add(start, ir.Constant(I64, k))
                        self.local = {}
                        for n, (i, a) in enumerate(sums):
                            arg = kernel.body[i].args[0]
                            term = self._widen(self._value(arg), kernel.body[arg].dtype,
                                               FLOAT[a.dtype])
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
        at = self.int_cast(self._value(operand), register_type(at_type), I64,
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
                value = minmax(self, [old, value], t, t, instr.mode)
            else:
                value = self.arith(instr.mode, old, value, t, register_type(t))
                if t in NARROW:
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
            return self.int_cast(index, I64, register_type(t), signed=True)
        if op in ("reduce", "contract"):
            return self._reduce(instr)
        arg_type = self.kernel.body[instr.args[0]].dtype
        if op in ("div", "mod") and arg_type.is_int and not self._guarded(instr.args[1]):
            raise CompileError(
                f"kernel {self.kernel.name}: integer {op} with an unguarded divisor reached "
                "the cpu renderer; compile through the backend, which runs "
                "compiler.pipeline.for_target (the decompose pass guards 0 and -1)")
        args = [self._value(a) for a in instr.args]
        result = OPS[op](self, args, arg_type, t)
        if t in NARROW and op not in EXACT_NARROW:
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
        return float_const(ty, value)

    def _alloca(self, ty: ir.Type) -> ir.Value:
        with self.b.goto_block(self.alloca_block):
            self.b.position_at_start(self.alloca_block)
            return self.b.alloca(ty)

    def _widen(self, value: ir.Value, t: DType, ty: ir.Type) -> ir.Value:
        return self.b.fpext(value, ty) if value.type != ty else value

    def _narrow(self, value: ir.Value, ty: ir.Type, t: DType) -> ir.Value:
        target = register_type(t)
        if ty == target:
            return value
        if t in NARROW:
            return self._round(value, t) if ty == F32 else self.f64_to_narrow(value, t)
        return self.b.fptrunc(value, target)

    def f64_to_narrow(self, x: ir.Value, t: DType) -> ir.Value:
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
    def arith(self, op: str, x: ir.Value, y: ir.Value, t: DType, ty: ir.Type) -> ir.Value:
        b = self.b
        if t.is_float:
            return {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}[op](x, y)
        return {"add": b.add, "sub": b.sub, "mul": b.mul}[op](x, y)

    def call_math(self, name: str, args: list[ir.Value]) -> ir.Value:
        self.math_calls += 1
        return self.b.call(mathlib.get(self.module, name, args[0].type, self.target), args)

    def intrinsic(self, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
        if ret in (F32, F64):
            return intrinsics.call(self.b, name, args, self.target)
        fn = intrinsics.declare(self.module, f"{name}.i{ret.width}", ret, [a.type for a in args])
        return self.b.call(fn, args)

    def _round_bf16(self, x: ir.Value) -> ir.Value:
        """Round a float32 to the nearest bf16 (:func:`hologram.codegen.numerics.round_bf16`)."""
        return numerics.round_bf16(mathlib.LLVMEmitter(self.b, F32_FORMAT, self.target), x)

    def int_cast(self, x: ir.Value, src: ir.Type, dst: ir.Type, signed: bool) -> ir.Value:
        if src.width == dst.width:
            return x
        if src.width > dst.width:
            return self.b.trunc(x, dst)
        return self.b.sext(x, dst) if signed else self.b.zext(x, dst)

