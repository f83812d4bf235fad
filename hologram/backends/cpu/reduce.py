"""Reductions in LLVM IR: the part of the cpu renderer (:mod:`.render`) that folds terms
into accumulators.

- float sums and contractions: :data:`~hologram.codegen.loops.LANES` accumulators per
  block of :data:`~hologram.codegen.loops.BLOCK` terms in vector lanes, the block sums
  added in float64 or compensated (:class:`_BlockSums`; the order and the error bound are
  docs/isa.md's);
- float max and min: three reductions LLVM vectorizes where the target has unsigned
  vector max/min (:meth:`Reductions._float_extremum`), else ``llvm.maximum``/``minimum``;
- argmax/argmin: strictly better values only, so the first occurrence wins; NaN is the
  extreme and ``-0.0 < +0.0`` (:meth:`Reductions._better`);
- products accumulate in float64 with ``reassoc`` (their loops vectorize); integer sums
  and products wrap; bool sum is ``or``, bool product ``and``.

In a split reduction's final function (``split == "final"``) the accumulator folds the
partials from the scratch memory instead of the terms.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from hologram.backends.cpu import intrinsics
from hologram.backends.cpu import textir as ir
from hologram.backends.cpu.ops import minmax
from hologram.backends.cpu.values import (
    F32,
    F64,
    FLOAT,
    I1,
    I64,
    float_bits,
    float_const,
    register_type,
)
from hologram.codegen.loops import BLOCK, LANES, SHORT_ROW, VECTOR, Accumulator
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import Instr

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


class Reductions:
    """The reductions of :class:`.render.KernelRenderer` (a mixin): they use its state
    (``b``, ``kernel``, ``plan``, ``split``, ``scratch``, ``parts``, ``outer``, ``index``,
    ``local``) and its builders (``_loop``, ``_nest``, ``_value``, ``_alloca``,
    ``_widen``, ``_narrow``, ``_const``, ``arith``, ``intrinsic``)."""

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
                    value = self.arith("mul", values[0], values[1], t, acc_type)
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
        bits = ir.IntType(float_bits(ty))
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
            b.store(self.intrinsic("umax", bits, [b.load(magnitude), without_sign]),
                    magnitude)
            last = raw if largest else b.xor(raw, ir.Constant(bits, sign))
            b.store(self.intrinsic("umin", bits, [b.load(zero), last]), zero)

        self._reduction_nest(list(instr.axes), step, FAST_EXTREMUM_INTERLEAVE)
        result = b.load(extreme)
        seen = b.icmp_unsigned("==", b.load(zero), ir.Constant(bits, 0))
        winner, other = (0.0, -0.0) if largest else (-0.0, 0.0)
        signed = b.select(seen, float_const(ty, winner), float_const(ty, other))
        result = b.select(b.fcmp_ordered("==", result, float_const(ty, 0.0)), signed, result)
        nan = b.icmp_unsigned(">", b.load(magnitude), infinity)
        return b.select(nan, float_const(ty, math.nan), result)

    def _float_sum(self, instr: Instr, plan: Accumulator) -> tuple[ir.Value, None, ir.Type]:
        """A float sum or contraction as :data:`LANES` accumulators per block of
        :data:`BLOCK` (see :mod:`hologram.codegen.loops`): ``(sum, None, its type)``."""
        b, kernel = self.b, self.kernel
        t = kernel.body[instr.args[0]].dtype
        lane_type, wide = FLOAT[plan.dtype], FLOAT[plan.outer]
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
                return self.arith("mul", values[0], values[1], t, lane_type)
            return values[0]

        def row() -> None:
            if inner == 0 and self.outer is not None:  # a partial of a split reduction
                self._blocks(inner, *self.outer, term, lane_type, outer)
            elif kernel.domain[inner] <= SHORT_ROW:
                acc = self._alloca(lane_type)
                b.store(float_const(lane_type, -0.0), acc)
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
        cleared = ir.Constant(arrays[0].type.pointee, [float_const(lane_type, -0.0)] * VECTOR)

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
                b.store(float_const(lane_type, -0.0), tail)
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

    def _identity(self, kind: str, t: DType, ty: ir.Type) -> ir.Constant:
        if kind == "sum":
            return float_const(ty, -0.0) if t.is_float else ir.Constant(ty, 0)
        if kind == "prod":
            return float_const(ty, 1.0) if t.is_float else ir.Constant(ty, 1)
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
        return minmax(self, [acc, value], t, t, kind)

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
        zeros = b.and_(b.fcmp_ordered("==", value, float_const(value.type, 0.0)),
                       b.fcmp_ordered("==", best, float_const(value.type, 0.0)))
        sign_value, sign_best = self._signbit(value), self._signbit(best)
        by_sign = b.and_(sign_best, b.not_(sign_value)) if largest else \
            b.and_(sign_value, b.not_(sign_best))
        return b.or_(b.and_(nan_value, b.not_(nan_best)),
                     b.and_(b.not_(nan_best), b.or_(strictly, b.and_(zeros, by_sign))))

    def _signbit(self, x: ir.Value) -> ir.Value:
        bits = ir.IntType(float_bits(x.type))
        return self.b.icmp_signed("<", self.b.bitcast(x, bits), ir.Constant(bits, 0))


class _BlockSums:
    """Block sums added in order in ``ty``: plainly when it is wider than the blocks
    (float64 keeps 29 more bits than a float32 block sum has, so up to 2**29 additions
    cost less than one float32 rounding), else compensated (Neumaier's variant)."""

    def __init__(self, r: Reductions, ty: ir.Type, compensated: bool):
        self.r, self.b, self.ty = r, r.b, ty
        self.sum = r._alloca(ty)
        self.b.store(float_const(ty, -0.0), self.sum)
        self.error = r._alloca(ty) if compensated else None
        if self.error is not None:
            self.b.store(float_const(ty, 0.0), self.error)

    def add(self, value: ir.Value) -> None:
        b, ty = self.b, self.ty
        value = b.fpext(value, ty) if value.type != ty else value
        s = b.load(self.sum)
        total = b.fadd(s, value)
        if self.error is not None:
            fabs = [self.r.intrinsic("fabs", ty, [x]) for x in (s, value)]
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
        keep = b.or_(b.fcmp_ordered("==", c, float_const(self.ty, 0.0)),
                     b.fcmp_unordered("uno", b.fsub(s, s), b.fsub(s, s)))
        return b.select(keep, s, b.fadd(s, c))
